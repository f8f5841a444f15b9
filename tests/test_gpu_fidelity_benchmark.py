"""benchmarks.gpu_fidelity: --help has no side effects, no shared data is a clean skip, and a small set of
runs written here (a stages CSV and an LLMServingSim folder) goes through end to end."""
from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import gpu_fidelity, shared_data
from tests.test_llmservingsim_reader import write_run

STAGE = {"experiment": "llama-2-7b-tp1-general", "model": "meta-llama/Llama-2-7b-hf", "profile": "general",
         "tensor_parallel_size": 1, "stage": "stage_0", "requested_rate_per_s": 2.0, "achieved_rate_per_s": 2.0,
         "sent": 1200, "ok": 1200, "failed": 0, "prompt_tokens_mean": 575.5, "output_tokens_counted_mean": 210.0,
         "ttft_mean_ms": 27.1, "ttft_p50_ms": 26.0, "ttft_p90_ms": 30.0, "ttft_p99_ms": 36.6, "e2e_mean_ms": 2057.6,
         "e2e_p90_ms": 2300.0, "e2e_p99_ms": 2401.8, "client_tpot_mean_ms_halved": 4.0, "client_itl_p90_ms": 8.0,
         "per_token_ms_counted": 9.71, "output_tok_per_s": 500.0}


def test_help_has_no_side_effects(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        gpu_fidelity.main(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_without_shared_data_it_skips(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shared_data, "SHARED_CANDIDATES", (tmp_path / "none",))
    assert gpu_fidelity.main(["--out", str(tmp_path / "out")]) == 0
    assert "skipped" in capsys.readouterr().out and not (tmp_path / "out").exists()


def test_a_named_shared_folder_without_real_runs_is_one_line(tmp_path, capsys):
    """A mistyped --shared is refused, not read as "no data" (which would skip with exit 0)."""
    with pytest.raises(SystemExit) as e:
        gpu_fidelity.main(["--shared", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--shared" in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_bad_argument_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:   # the shared parser's refusal: one line, exit 2
        gpu_fidelity.main(["--models", "magic", "--shared", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--models" in err and err.count("\n") == 1


def test_small_runs_end_to_end(tmp_path, capsys):
    shared = tmp_path / "shared"
    (shared / "real-runs").mkdir(parents=True)
    pd.DataFrame([STAGE]).to_csv(shared / gpu_fidelity.STAGES_CSV, index=False)
    write_run(shared / gpu_fidelity.LSS_DIR / "RTX4090_Llama-3.1-8B")
    out = tmp_path / "out"
    assert gpu_fidelity.main(["--shared", str(shared), "--out", str(out), "--models", "roofline",
                              "--max-stage-s", "5"]) == 0
    stages, runs = pd.read_csv(out / "stages.csv"), pd.read_csv(out / "runs.csv")
    assert len(stages) == 1 and stages["num_requests"].iloc[0] == 10
    assert stages["real_class"].iloc[0] == stages["sim_class"].iloc[0] == "sustained"
    assert stages["sim_per_token_ms"].iloc[0] > 0 and len(runs) == 1
    assert runs["peer_err_ttft_mean_ms"].iloc[0] == pytest.approx(0.10)
    assert "vLLM 0.15.1" in (out / "report.md").read_text()


def test_a_runs_decode_only_seconds_are_priced_step_by_step(tmp_path, capsys):
    """A run whose stat logger saw 4 requests decode every 10 ms for 5 s: step_curves.csv holds the cost
    model's price of those steps beside the real 10 ms, busy_ticks.csv the same seconds priced whole (all
    decode-only, so the same error), and the report says so."""
    from tests.test_run_ticks import write_decoding_run
    shared = tmp_path / "shared"
    write_decoding_run(shared / gpu_fidelity.LSS_DIR / "RTX4090_Llama-3.1-8B")
    out = tmp_path / "out"
    assert gpu_fidelity.main(["--shared", str(shared), "--out", str(out), "--models", "roofline",
                              "--sets", "llmservingsim"]) == 0
    curves = pd.read_csv(out / "step_curves.csv")
    whole = curves[curves["batch_bin"] == "all"].set_index("cost_model")
    assert set(whole.index) == {"roofline"} and whole.loc["roofline", "ticks"] == 5
    assert whole.loc["roofline", "real_step_ms"] == pytest.approx(10.0)
    assert whole.loc["roofline", "sim_step_ms"] > 0 and abs(whole.loc["roofline", "clock_offset_s"]) <= 0.5
    assert "Decode-only steps, as each run's own 1 s ticks show them" in (out / "report.md").read_text()
    busy = pd.read_csv(out / "busy_ticks.csv").set_index("ticks")
    assert list(busy.index) == ["decode-only", "all"] and busy.loc["all", "n"] == 5
    step_err = whole.loc["roofline", "sim_step_ms"] / whole.loc["roofline", "real_step_ms"] - 1
    assert busy.loc["all", "time_err"] == pytest.approx(step_err, abs=1e-3)
    assert "Every busy tick, prefill included" in (out / "report.md").read_text()


def test_a_malformed_run_folder_is_one_line_before_any_replay(tmp_path, capsys):
    """A stat-logger file that cannot be read stops the benchmark in one line naming it, exit 2, before
    minutes of replay and before --out is written."""
    from tests.test_run_ticks import write_decoding_run
    shared = tmp_path / "shared"
    d = write_decoding_run(shared / gpu_fidelity.LSS_DIR / "RTX4090_Llama-3.1-8B")
    (d / "vllm_timeseries.csv").write_text("t,running\n1,2\n")
    with pytest.raises(SystemExit) as e:
        gpu_fidelity.main(["--shared", str(shared), "--out", str(tmp_path / "out"), "--sets", "llmservingsim"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "vllm_timeseries.csv" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_stage_replays_the_clients_pool_of_100_prompts():
    # inference-perf made 10 system prompts x 10 questions once and sent them in turn: each request is one
    # of 100 prompts of the stage's mean length, all of it but the last token repeated
    point = gpu_fidelity.stage_point(pd.Series(STAGE), 600.0)
    w = point["workload"]
    assert w["shared_prefix"] == {"num_groups": 100, "prefix_tokens": 575}
    assert w["prompt_tokens"] == {"dist": "fixed", "value": 1}


def test_two_pcie_gpus_get_the_host_staged_variant_whether_tp_or_dp(tmp_path):
    # the DP ranks' EP exchanges cross the same PCIe pair a TP all-reduce does; one GPU crosses nothing
    from fidelity.llmservingsim import read_run
    pro = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    dp2 = read_run(write_run(tmp_path / "RTXPRO6000_dp2", gpu=pro, memory=102e9, dp=2))
    one = read_run(write_run(tmp_path / "RTXPRO6000_one", gpu=pro, memory=102e9))
    point = gpu_fidelity.host_staged_point(dp2, "llama-3.1-8b")
    assert point["hardware"]["interconnect_kind"] == "pcie_host" and point["data_parallel_size"] == 2
    assert gpu_fidelity.host_staged_point(one, "llama-3.1-8b") is None

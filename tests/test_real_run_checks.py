"""An answer on the roofline prior or NVIDIA's tables says how that cost model did against real vLLM runs on
the GPU it simulates (costmodels/real_run_checks.json, from the committed benchmark outputs), or that no
real run on that GPU has checked it."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks import real_run_checks
from costmodels import basis

WORKLOAD = {"num_requests": 20, "arrival": {"process": "poisson", "rate_per_s": 2},
            "prompt_tokens": {"dist": "fixed", "value": 200}, "output_tokens": {"dist": "fixed", "value": 20}}


def test_the_shipped_checks_are_the_committed_outputs_summarised():
    """Rerunning either benchmark into docs/fidelity/gpu without `python -m benchmarks.real_run_checks`
    would leave every answer quoting stale errors: this fails until the file is rewritten."""
    shipped = json.loads(basis.CHECKS_FILE.read_text())
    assert shipped == json.loads(json.dumps(real_run_checks.from_outputs())), \
        "run python -m benchmarks.real_run_checks"
    assert any(c["gpu"] == "h100-sxm" and c["what"] == "load stages" for c in shipped["checks"])


def _basis(hardware) -> str:
    from experiments.config import resolve_point
    from experiments.simulate import point_cost_model
    cfg = resolve_point({"model": "llama-3.1-8b", "hardware": hardware, "profile": "roofline",
                         "engine": {"policy": "chunked_prefill"}, "workload": WORKLOAD})
    return basis.cost_model_basis(point_cost_model(cfg))


def test_an_answer_on_the_prior_says_how_it_did_on_that_gpu_or_that_nothing_checked_it():
    h100 = _basis("h100-sxm")
    assert h100.startswith("roofline prior of batchsim")
    assert "; checked on h100-sxm against real vLLM (median |error|, range; docs/fidelity/gpu): 0.15.1, " in h100
    assert "per-token " in h100 and "on the wrong side of the knee" in h100
    assert _basis("l40s").endswith("; not checked against a real vLLM run on l40s")
    # the catalog's name on figures of the user's own: the checks were not run on that GPU
    mine = _basis({"base": "h100-sxm", "name": "h100-sxm", "hbm_bytes_per_s": 2.0e12})
    assert mine.endswith("; not checked against a real vLLM run on h100-sxm (figures of its own)")


def _stage(run, kind, real_class, sim_class, err, gpu="h100-sxm", cost_model="roofline"):
    return {"stage_file": "f.csv", "run": run, "stage": "stage_0", "cost_model": cost_model,
            "cost_model_kind": kind, "gpu": gpu, "vllm_version": "0.15.1", "real_class": real_class,
            "sim_class": sim_class, "err_per_token_ms": err, "err_ttft_mean_ms": -err, "err_e2e_mean_ms": err,
            "skipped": ""}


def test_the_summary_takes_sustained_stages_counts_the_knee_and_counts_default_once():
    stages = pd.DataFrame([_stage("a", "roofline", "sustained", "sustained", 0.02),
                           _stage("a", "roofline", "sustained", "sustained", 0.02, cost_model="default"),
                           _stage("b", "roofline", "sustained", "sustained", -0.06),
                           _stage("c", "roofline", "saturated", "sustained", 0.90),   # wrong side, not averaged
                           _stage("d", "profile", "sustained", "sustained", 0.50)])   # not a default model
    runs = pd.DataFrame([{"run": "r", "cost_model": "roofline", "cost_model_kind": "roofline", "gpu": "rtx-4090",
                          "vllm_version": "0.19.0", "err_ttft_mean_ms": 0.094, "err_tpot_mean_ms": 0.059,
                          "err_e2e_mean_ms": 0.085, "host_as_run": True},
                         # priced over P2P where the run's host had none: not a check of the P2P GPU
                         {"run": "r2", "cost_model": "roofline", "cost_model_kind": "roofline", "gpu": "rtx-4090",
                          "vllm_version": "0.19.0", "err_ttft_mean_ms": -0.3, "err_tpot_mean_ms": -0.2,
                          "err_e2e_mean_ms": -0.25, "host_as_run": False}])
    (s, r) = real_run_checks.checks(stages, runs, pd.DataFrame())
    assert (s["count"], s["sustained"], s["wrong_side_of_knee"]) == (3, 2, 1)
    assert s["errors"]["per-token"] == {"median_abs": 0.04, "min": -0.06, "max": 0.02, "n": 2}
    assert r["what"] == "run" and r["engine"] == "vLLM 0.19.0"
    assert basis._error_words(s["errors"]["per-token"]) == "4.0% (-6..+2%)"
    assert basis._error_words(r["errors"]["TPOT mean"]) == "+5.9%"


def test_outputs_older_than_the_summary_are_one_line(tmp_path, capsys):
    pd.DataFrame([{"run": "r", "cost_model": "roofline", "err_tpot_mean_ms": 0.1}]).to_csv(tmp_path / "runs.csv")
    with pytest.raises(SystemExit) as e:
        real_run_checks.main(["--gpu-dir", str(tmp_path), "--out", str(tmp_path / "c.json")])
    rc, err = e.value.code, capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "runs.csv: no column 'cost_model_kind'" in err
    assert not (tmp_path / "c.json").exists()
    pd.DataFrame([{"run": "r", "cost_model": "roofline", "cost_model_kind": "roofline", "gpu": "rtx-4090",
                   "vllm_version": "0.19.0", "err_tpot_mean_ms": 0.1}]).to_csv(tmp_path / "runs.csv")
    with pytest.raises(SystemExit) as e:
        real_run_checks.main(["--gpu-dir", str(tmp_path), "--out", str(tmp_path / "c.json")])
    rc, err = e.value.code, capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "runs.csv: no column 'host_as_run'" in err


@pytest.mark.parametrize("value, words", [(0.001, "0"), (-0.004, "0"), (0.06, "+6"), (-0.52, "-52")])
def test_signed_percent_never_reads_minus_zero(value, words):
    assert basis._signed(value) == words


def test_one_cost_model_on_two_gpus_is_one_model_with_each_gpus_checks():
    """The prior on an H100 and on an L40S is one cost model: no 'different cost models' warning."""
    h100, l40s = _basis("h100-sxm"), _basis("l40s")
    assert h100 != l40s and basis.split_basis(h100)[0] == basis.split_basis(l40s)[0]
    both = basis.rests_on({"h100": h100, "l40s": l40s, "again": h100})
    assert both.startswith("cost model: roofline prior of batchsim") and "different cost models" not in both
    assert both.count("checked on h100-sxm") == 1 and both.endswith("; not checked against a real vLLM run on l40s")


def test_an_unreadable_checks_file_claims_nothing(tmp_path, monkeypatch):
    """Without the file an answer must not say that no real run checked its GPU: it says it cannot tell."""
    monkeypatch.setattr(basis, "CHECKS_FILE", tmp_path / "missing.json")
    basis._checks.cache_clear()
    try:
        words = basis.real_run_words("roofline", "h100-sxm")
    finally:
        basis._checks.cache_clear()
    assert words == "real-run checks on h100-sxm not known here (missing.json unreadable)"
    assert basis.split_basis(f"roofline prior X; {words}") == ("roofline prior X", words)

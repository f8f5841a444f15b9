"""The strict sweep loader: unknown keys and bad values fail with one line naming the key."""
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.config import ConfigError, expand, resolve_point
from experiments.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((ROOT / "examples" / "acceptance.yaml").read_text())


def small(**changes):
    d = copy.deepcopy(BASE)
    d["workload"]["num_requests"] = 40
    for k, v in changes.items():
        d[k] = v
    return d


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["engine"].update(max_num_seq=4), "engine.max_num_seq: unknown key"),
    (lambda d: d.update(hardwre="h100-sxm"), "hardwre: unknown top-level key"),
    (lambda d: d.update(hardware="h900"), "hardware: unknown hardware 'h900'"),
    (lambda d: d.update(model="llama-9"), "model: unknown model 'llama-9'"),
    (lambda d: (d["grid"].pop("engine.policy"), d["engine"].update(policy="magic")), "engine.policy: unknown policy 'magic'"),
    (lambda d: d["engine"].update(max_num_seqs=-3), "engine.max_num_seqs: expected an integer >= 0"),
    (lambda d: d["engine"].update(gpu_memory_utilization=1.5), "engine.gpu_memory_utilization: must be in (0, 1]"),
    (lambda d: (d["grid"].pop("engine.policy"), d["engine"].update(kv_reservation="all")), "engine.kv_reservation must be one of"),
    (lambda d: (d["grid"].pop("engine.policy"), d["engine"].update(max_num_batched_tokens=2048)), "engine.max_num_batched_tokens (2048) < max_model_len"),
    (lambda d: d["workload"].update(num_requests=0), "workload.num_requests: expected an integer >= 1"),
    (lambda d: d["workload"]["arrival"].update(rate=3), "workload.arrival.rate: not a key of process poisson"),
    (lambda d: d["workload"].update(prompt_tokens={"dist": "zipf"}), "workload.prompt_tokens.dist: unknown distribution"),
    (lambda d: d["workload"].update(output_tokens={"dist": "lognormal", "median": 10}), "workload.output_tokens.sigma: required"),
    (lambda d: d["grid"].update({"engine.policy": "static"}), "grid.engine.policy: expected a non-empty list"),
    (lambda d: d.update(seeds="zero"), "seeds: expected a list of integers"),
])
def test_bad_values_name_the_key(mutate, message):
    d = small()
    mutate(d)
    with pytest.raises(ConfigError) as e:
        expand(d)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_grid_expands_as_a_cartesian_product_over_seeds():
    d = small(seeds=[0, 1])
    points = expand(d)
    assert len(points) == 3 * 2 * 2
    assert {(p.config.policy.name, p.grid_values["workload.arrival.rate_per_s"], p.seed) for p in points} == {
        (pol, r, s) for pol in ("static", "continuous", "chunked_prefill") for r in (2, 8) for s in (0, 1)}


def test_vllm_defaults_fill_unset_knobs():
    d = small()
    d["engine"] = {"policy": "chunked_prefill"}
    cfg = resolve_point({k: v for k, v in d.items() if k not in ("grid", "seeds")})
    assert (cfg.policy.max_num_seqs, cfg.policy.max_num_batched_tokens) == (1024, 8192)  # H100, vLLM 0.19
    d["hardware"] = "a100-40gb"
    cfg = resolve_point({k: v for k, v in d.items() if k not in ("grid", "seeds")})
    assert (cfg.policy.max_num_seqs, cfg.policy.max_num_batched_tokens) == (256, 2048)


def test_num_gpu_blocks_and_max_model_len_override(tmp_path):
    d = small(grid={})
    d["engine"].update(num_gpu_blocks=5000, max_model_len=4096, policy="chunked_prefill")
    res = run_sweep(d, progress=False)
    sim = next(iter(res.points.values()))
    assert sim.summary["num_gpu_blocks"] == 5000
    assert sim.resolved["model"]["max_model_len"] == 4096


def test_cli_bad_file_is_one_line_and_nonzero(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {policy: continuous, max_num_sqs: 3}\nworkload: {}\n")
    p = subprocess.run([sys.executable, "-m", "experiments.run", str(bad), "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "engine.max_num_sqs" in p.stderr
    missing = subprocess.run([sys.executable, "-m", "experiments.run", str(tmp_path / "nope.yaml")],
                             cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 2 and "nope.yaml: no such sweep file" in missing.stderr


def test_cli_writes_results_and_resumes(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(small()))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments.run", str(f), "--out", str(out), "--quiet", "--jobs", "1"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    import pandas as pd
    res = pd.read_csv(out / "results.csv")
    for col in ["engine.policy", "workload.arrival.rate_per_s", "seed", "policy", "num_requests", "num_finished",
                "num_rejected", "duration_s", "throughput_rps", "output_tok_per_s", "ttft_p50_ms", "ttft_p99_ms",
                "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
                "num_preemptions", "mean_waiting", "mean_running", "kv_usage_max"]:
        assert col in res.columns, col
    assert len(res) == 6 and (res.num_finished == 40).all()
    from experiments.tables import has_table, read_table
    reqs = read_table(out / "points" / "p000-seed0", "requests")
    assert {"request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
            "status"} <= set(reqs.columns)
    assert has_table(out / "points" / "p000-seed0", "iterations")
    assert (out / "points" / "p000-seed0" / "config.yaml").exists()
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert "6 finished earlier, skipped" in second.stdout
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), res)

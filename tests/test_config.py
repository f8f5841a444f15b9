"""The strict sweep loader: unknown keys and bad values fail with one line naming the key."""
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from costmodels.catalog import GPUS, get_gpu, get_model
from experiments.config import ConfigError, expand, resolve_point
from policies import POLICIES, ChunkedPrefill, Continuous, Sglang, Static, Tgi
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
    (lambda d: (d["grid"].pop("engine.policy"), d["engine"]["continuous"].update(max_num_batched_tokens=2048)), "engine.max_num_batched_tokens (2048) < max_model_len"),
    (lambda d: d["engine"].update(max_num_batched_tokens=2048), "engine.max_num_batched_tokens: not a knob of policy static"),
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


def point(engine: dict, hardware: str = "h100-sxm", **over):
    d = {k: v for k, v in small(**over).items() if k not in ("grid", "seeds")}
    return resolve_point({**d, "hardware": hardware, "engine": engine})


@pytest.mark.parametrize("hardware", ["l4", "h100-sxm"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_python_and_yaml_build_the_same_policy(name, hardware):
    """One source for defaults: `{policy: name}` in a sweep is `POLICIES[name].for_gpu(gpu, max_model_len)`
    in Python, with and without knobs, on a GPU under 70 GiB and on an H100."""
    gpu, max_model_len = get_gpu(hardware), get_model("llama-3-8b").max_model_len
    assert point({"policy": name}, hardware).policy == POLICIES[name].for_gpu(gpu, max_model_len)
    # ... and that is the plain constructor except where the engine's default depends on the GPU
    by_gpu = {("h100-sxm", "chunked_prefill"): ChunkedPrefill(max_num_seqs=1024, max_num_batched_tokens=8192),
              ("l4", "sglang"): Sglang(chunked_prefill_size=2048)}
    assert point({"policy": name}, hardware).policy == by_gpu.get((hardware, name), POLICIES[name]())
    knob = {"static": ("max_num_seqs", 64), "continuous": ("mix_prefill_decode", True),
            "chunked_prefill": ("long_prefill_token_threshold", 256), "tgi": ("max_waiting_tokens", 5),
            "trtllm": ("enable_chunked_context", True), "sglang": ("max_prefill_tokens", 4096)}[name]
    assert (point({"policy": name, knob[0]: knob[1]}, hardware).policy
            == point({"policy": name, name: {knob[0]: knob[1]}}, hardware).policy
            == POLICIES[name].for_gpu(gpu, max_model_len, **{knob[0]: knob[1]}))


def test_per_gpu_defaults_are_the_engines():
    """vLLM 0.32 `get_batch_defaults` (server): 1024 / 8192 on an H100 or H200, 1024 / 16384 from 160 GiB
    (B200), 256 / 2048 on an A100 (any size) or a GPU under 70 GiB, which is also what `ChunkedPrefill()`
    means; SGLang's chunked_prefill_size follows the GPU's memory."""
    seqs_tokens = {hw: (lambda p: (p.max_num_seqs, p.max_num_batched_tokens))(
        ChunkedPrefill.for_gpu(get_gpu(hw), 8192)) for hw in GPUS}
    assert seqs_tokens == {"h100-sxm": (1024, 8192), "h200-sxm": (1024, 8192), "b200-sxm": (1024, 16384),
                           "a100-80gb": (256, 2048), "a100-40gb": (256, 2048), "l4": (256, 2048),
                           "l40s": (256, 2048), "l40": (256, 2048), "a10g": (256, 2048), "rtx-4090": (256, 2048),
                           "h100-pcie": (1024, 8192), "h100-nvl": (1024, 8192), "h20": (1024, 8192),
                           "rtx-pro-6000": (1024, 8192), "rtx-pro-6000-server": (1024, 8192), "gb200": (1024, 16384), "mi300x": (1024, 16384),
                           "mi325x": (1024, 16384)}
    assert ChunkedPrefill.for_gpu(get_gpu("l4"), 8192) == ChunkedPrefill()
    assert ChunkedPrefill.for_gpu(get_gpu("h100-sxm"), 8192, max_num_batched_tokens=512).max_num_seqs == 512
    assert ChunkedPrefill.for_gpu(get_gpu("l4"), 100).max_num_batched_tokens == 2048  # 256 x 100 is larger
    assert Continuous.for_gpu(get_gpu("h100-sxm"), 32768) == Continuous(max_num_batched_tokens=32768)
    assert {hw: Sglang.for_gpu(get_gpu(hw), 8192).chunked_prefill_size for hw in ("l4", "l40s", "h200-sxm",
                                                                                  "b200-sxm")} == {
        "l4": 2048, "l40s": 4096, "h200-sxm": 8192, "b200-sxm": 16384}


@pytest.mark.parametrize("engine, message", [
    ({"policy": "static", "max_num_batched_tokens": 512},
     "engine.max_num_batched_tokens: not a knob of policy static (its knobs: batch_timeout_s, max_num_seqs); "
     "it belongs to continuous, chunked_prefill: put it under engine.continuous"),
    ({"policy": "tgi", "max_num_seqs": 8}, "engine.max_num_seqs: not a knob of policy tgi"),
    ({"policy": "static", "tgi": {"max_num_seqs": 8}}, "engine.tgi.max_num_seqs: not a knob of policy tgi; its knobs:"),
    ({"policy": "static", "tgi": {"max_waiting_tokens": "soon"}}, "engine.tgi.max_waiting_tokens: expected an integer"),
    ({"policy": "static", "sglang": [1]}, "engine.sglang: expected a mapping of policy sglang's knobs"),
    ({"policy": "static", "max_num_seqs": 4, "static": {"max_num_seqs": 8}},
     "engine.max_num_seqs: given both directly and under engine.static"),
    ({"policy": "chunked_prefill", "max_num_seqs": 512, "max_num_batched_tokens": 256},
     "engine.max_num_batched_tokens (256) must be >= engine.max_num_seqs (512)"),
    ({"policy": "chunked_prefill", "max_num_seqs": 0}, "engine.max_num_seqs: must be an integer >= 1"),
    ({"policy": "continuous", "watermark": 1.0}, "engine.watermark: must be in [0, 1)"),
])
def test_a_knob_of_another_policy_is_an_error(engine, message):
    with pytest.raises(ConfigError) as e:
        point(engine)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_per_policy_sections_apply_only_where_their_policy_runs():
    d = small(grid={"engine.policy": ["static", "tgi", "chunked_prefill"]})
    d["engine"] = {"policy": "static", "static": {"max_num_seqs": 8}, "tgi": {"max_batch_prefill_tokens": 512},
                   "chunked_prefill": {"max_num_batched_tokens": 256}}
    policies = [p.config.policy for p in expand(d)]
    assert policies[0] == Static(max_num_seqs=8)
    assert policies[1] == Tgi(max_batch_prefill_tokens=512)
    assert policies[2] == ChunkedPrefill(max_num_seqs=256, max_num_batched_tokens=256)  # vLLM: seqs <= budget
    d["grid"] = {"engine.chunked_prefill.max_num_batched_tokens": [256, 512]}  # a section's knob swept
    d["engine"]["policy"] = "chunked_prefill"
    assert [p.config.policy.max_num_batched_tokens for p in expand(d)] == [256, 512]


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

"""LLMServingSim's run folders (vllm_requests.jsonl + vllm_meta.json) read as real runs, replayed on the GPU
they name, and fed to benchmarks.gpu_fidelity; the fixture is written here, not copied from a run."""
from __future__ import annotations

import json
import math

import pytest

from fidelity.llmservingsim import gpu_of, host_interconnect, peer_errors, read_run, replay_point
from fidelity.realruns import RealRunError, read_runs, replay, replay_config

PEER = """Metric                           vLLM         Sim     Diff%
-----------------------------------------------------------
TTFT Mean                       100.0       110.0    +10.0%
TPOT Median                      20.0        19.0     -5.0%
Latency P99                    1000.0      1000.0     +0.0%
"""


def write_run(d, n=12, gpu="NVIDIA GeForce RTX 4090", memory=25250627584, dp=1, started_at=None):
    d.mkdir(parents=True, exist_ok=True)
    meta = {"model": "llama-3.1-8b", "vllm_version": "0.19.0",
            "engine_kwargs": {"model": "llama-3.1-8b", "tensor_parallel_size": 1, "data_parallel_size": dp,
                              "enable_expert_parallel": False, "max_num_seqs": 64, "max_num_batched_tokens": 1024,
                              "max_model_len": 4096, "dtype": "bfloat16", "kv_cache_dtype": "auto"},
            "kv_cache": {"num_gpu_blocks": 2588, "block_size": 16, "gpu_memory_utilization": 0.9,
                         "enable_prefix_caching": True},
            "hardware": {"device_name": gpu, "device_total_memory_bytes": memory}}
    if started_at:
        meta["started_at"] = started_at
    (d / "vllm_meta.json").write_text(json.dumps(meta))
    lines = []
    for i in range(n):   # engine clock starts at 5000 s; one request every 0.25 s
        q = 5000.0 + 0.25 * i
        lines.append(json.dumps({"request_id": f"r{i}", "input_toks": 100 + 10 * i, "output_toks": 20,
                                 "arrival_time": 1.7e9 + 0.25 * i, "queued_ts": q, "scheduled_ts": q + 0.001,
                                 "first_token_ts": q + 0.05, "last_token_ts": q + 0.05 + 19 * 0.01}))
    (d / "vllm_requests.jsonl").write_text("\n".join(lines) + "\n")
    (d / "validation_summary.txt").write_text(PEER)
    return d


def test_reads_times_on_the_engine_clock(tmp_path):
    run = read_run(write_run(tmp_path / "RTX4090_x"))
    r = run.requests
    assert run.format == "llmservingsim" and len(r) == 12
    assert r["arrival_s"].iloc[0] == 0.0 and r["arrival_s"].iloc[-1] == pytest.approx(2.75)
    assert (r["first_token_s"] - r["arrival_s"]).to_numpy() == pytest.approx([0.05] * 12)
    assert run.summary["tpot_mean_ms"] == pytest.approx(10.0)
    assert run.meta["num_gpu_blocks"] == 2588
    # the generic reader takes the folder too (fidelity.fit_engine reads runs through it)
    (again,) = read_runs(tmp_path / "RTX4090_x")
    assert again.format == "llmservingsim"


def test_replay_point_is_the_engine_it_ran(tmp_path):
    run = read_run(write_run(tmp_path / "r", dp=2))
    p = replay_point(run)
    assert p["hardware"] == {"base": "rtx-4090", "name": "rtx-4090", "memory_bytes": 25250627584.0}
    assert p["engine"]["max_num_seqs"] == 64 and p["engine"]["max_num_batched_tokens"] == 1024
    assert p["engine"]["enable_prefix_caching"] and p["dtype"] == "bf16"
    assert p["engine"]["frontend"] == "none"   # the engine core's own times: no front end in them
    assert p["data_parallel_size"] == 2 and p["cluster"]["num_replicas"] == 2
    assert gpu_of(read_run(write_run(tmp_path / "s", memory=None))) == "rtx-4090"


def test_replayed_on_the_named_gpu(tmp_path):
    run = read_run(write_run(tmp_path / "r"))
    cfg = replay_config(run, run.config)
    assert cfg.gpu.name == "rtx-4090" and cfg.gpu.memory_bytes == 25250627584
    res = replay(run, cfg, "roofline")
    assert (res.requests["status"] == "finished").all() and len(res.requests) == 12
    # sent at the run's queued times; measured, as the run was, from when the engine core queued each: the
    # end of the step in flight when it came (simcore.metrics.engine_core_view), else at once
    sent = run.requests["arrival_s"].to_numpy()
    queued = res.requests["arrival_s"].to_numpy()
    assert queued[0] == sent[0] == 0.0
    assert (queued >= sent).all() and (queued - sent <= res.iterations["duration_s"].max()).all()
    assert res.summary["ttft_mean_ms"] == pytest.approx(res.requests["ttft_s"].mean() * 1e3)


def test_the_rtx_pro_6000_pairs_host_had_no_p2p_before_its_operator_turned_acs_off(tmp_path):
    """LLMServingSim's calibrations of its pair: host-staged on 2026-09-08, P2P measured on 2026-09-26."""
    server = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    april = read_run(write_run(tmp_path / "a", gpu=server, memory=None, started_at="2026-04-25T18:49:44Z"))
    october = read_run(write_run(tmp_path / "o", gpu=server, memory=None, started_at="2026-10-01T00:00:00Z"))
    undated = read_run(write_run(tmp_path / "u", gpu=server, memory=None))
    assert host_interconnect(april) == "pcie_host"
    assert host_interconnect(october) is None and host_interconnect(undated) is None   # the catalog's stands
    assert host_interconnect(read_run(write_run(tmp_path / "g", started_at="2026-04-25"))) is None   # no record


def test_peer_errors_from_the_validation_summary(tmp_path):
    e = peer_errors(write_run(tmp_path / "r"))
    assert e["ttft_mean_ms"] == pytest.approx(0.10) and e["tpot_p50_ms"] == pytest.approx(-0.05)
    assert e["e2e_p99_ms"] == 0.0
    assert peer_errors(tmp_path) == {}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: (d / "vllm_meta.json").write_text("{"), "vllm_meta.json: not valid JSON"),
    (lambda d: (d / "vllm_meta.json").write_text("{}"), "lacks engine_kwargs"),
    (lambda d: (d / "vllm_requests.jsonl").write_text('{"input_toks": 1}\n'), "line 1: lacks output_toks"),
    (lambda d: (d / "vllm_requests.jsonl").write_text("\n"), "no requests"),
    (lambda d: (d / "vllm_requests.jsonl").write_text("nope\n"), "line 1: not valid JSON"),
])
def test_bad_files_are_one_line_errors(tmp_path, mutate, message):
    d = write_run(tmp_path / "r")
    mutate(d)
    with pytest.raises(RealRunError) as e:
        read_run(d)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unknown_gpu_needs_a_hardware_value(tmp_path):
    run = read_run(write_run(tmp_path / "r", gpu="Some Future GPU"))
    assert run.config is None
    with pytest.raises(RealRunError, match="not known"):
        replay_point(run)
    assert replay_point(run, hardware="l40s")["hardware"] == "l40s"
    assert not math.isnan(run.summary["ttft_mean_ms"])

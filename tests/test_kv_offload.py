"""KV offloading to host memory (simcore/kvoffload.py): exact timelines of a prefix evicted from the GPU,
kept in the host pool and loaded back; the host pool's LRU order; vLLM's sizing of the pool; the fast path
bitwise equal to the SimPy engine; the sweep file's `engine.kv_offload` and its bad inputs."""

import subprocess
import sys

import pandas as pd
import pytest

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate
from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.fast.engine import FastEngine
from simcore.kvoffload import GIB, OffloadLimits, offload_limits
from simcore.request import RequestSpec
from simcore.wiring import run_replica
from tests.test_fastpath import (OTHER_POLICIES, POLICIES, assert_identical, iterations_frame, iterations_table,
                                 itl_samples, policy_id, random_specs, requests_frame, requests_table,
                                 with_priorities, with_shared_prefixes)

BS = 16
COST = ConstantCost(per_step_s=0.01, per_token_s=0.001)
KV_BYTES_PER_TOKEN, LINK = 1000, 1e6   # a block loads in 16 x 1000 / 1e6 = 16 ms
POLICY = ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=512)


def limits(num_chunks: int, num_gpu_blocks: int = 5) -> EngineLimits:
    """4 usable GPU blocks (64 tokens): B's prompt evicts A's cached blocks."""
    return EngineLimits(num_gpu_blocks, BS, 512, enable_prefix_caching=True, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                        host_link_bytes_per_s=LINK, kv_offload=OffloadLimits(num_chunks))


def turns():
    """A's 3-block prompt (ids 1-3), B's 3 full blocks and a partial one that push A out of the GPU, then
    C: A's prompt and 15 tokens more, arriving when the engine is idle."""
    return [RequestSpec(0, 0.0, 48, 1, prefix_block_ids=(1, 2, 3)),
            RequestSpec(1, 1.0, 63, 1, prefix_block_ids=(10, 11, 12)),
            RequestSpec(2, 2.0, 63, 1, prefix_block_ids=(1, 2, 3))]


def run(specs, lim):
    engine = run_replica(POLICY, COST, lim, specs)
    return requests_frame(engine.log).set_index("request_id"), engine


def test_a_prefix_evicted_from_the_gpu_is_loaded_from_the_host_at_the_priced_time():
    df, engine = run(turns(), limits(num_chunks=8))
    host = engine.prefix_cache.host
    # C's 48-token prefix left the GPU (B evicted it) but not the host: loaded, not recomputed
    assert engine.prefix_cache.num_evicted_blocks >= 3
    assert host.num_hit_tokens == 48 and host.num_blocks_loaded == 3
    load_s = 3 * BS * KV_BYTES_PER_TOKEN / LINK
    # C waits for its load (the engine is idle: it wakes at the load's end), then prefills its last 15 tokens
    assert df.loc[2, "first_token_s"] == pytest.approx(2.0 + load_s + 0.01 + 15 * 0.001, abs=1e-12)
    assert engine.prefix_cache.cached_tokens_by_request[2] == 48   # vLLM counts loaded tokens as cached
    # without the host tier C recomputes all 63 tokens at once
    plain = EngineLimits(5, BS, 512, enable_prefix_caching=True)
    df0, engine0 = run(turns(), plain)
    assert df0.loc[2, "first_token_s"] == pytest.approx(2.0 + 0.01 + 63 * 0.001, abs=1e-12)
    stats = engine.prefix_cache.stats()
    assert stats["num_recomputed_prompt_tokens"] == engine0.prefix_cache.stats()["num_recomputed_prompt_tokens"] - 48
    assert stats["offload_hit_tokens"] == 48
    assert stats["offload_bytes_loaded"] == 3 * BS * KV_BYTES_PER_TOKEN
    assert stats["offload_bytes_stored"] == (3 + 3) * BS * KV_BYTES_PER_TOKEN   # A's and B's full blocks
    # queried past the GPU hit: A 48, B 63, C 63 (no GPU hit anywhere); C's 48 came from the host
    assert stats["offload_hit_rate"] == 48 / (48 + 63 + 63)


def test_a_load_overlaps_other_requests_steps():
    """A load runs beside the forward passes: a request decoding meanwhile keeps its step times; the loaded
    request rejoins the queue at the first step that starts after its load ended."""
    specs = [RequestSpec(0, 0.0, 48, 1, prefix_block_ids=(1, 2, 3)),
             RequestSpec(1, 1.0, 127, 1, prefix_block_ids=tuple(range(10, 17))),   # evicts A from the GPU
             RequestSpec(3, 1.9, 16, 40, prefix_block_ids=()),                      # decoding through C's load
             RequestSpec(2, 2.0, 63, 1, prefix_block_ids=(1, 2, 3))]
    df, engine = run(specs, limits(num_chunks=16, num_gpu_blocks=9))
    assert engine.prefix_cache.host.num_blocks_loaded == 3
    steps = iterations_frame(engine.log)
    issued = steps[steps.start_s > 2.0].start_s.iloc[0]   # C arrived mid-step: the next decision starts its load
    done = issued + 3 * BS * KV_BYTES_PER_TOKEN / LINK
    during = steps[(steps.start_s >= issued) & (steps.start_s < done)]
    assert len(during) >= 3 and (during.prefill_tokens == 0).all()   # C is in no step while it loads
    assert (during.duration_s == 0.01 + 0.001).all()                 # D's decode alone: no load time in it
    after = steps[steps.start_s >= done].iloc[0]
    assert after.prefill_tokens == 15                                # C's rest, right after its load
    assert df.loc[2, "first_token_s"] == pytest.approx(after.start_s + after.duration_s, abs=1e-12)


def test_host_pool_evicts_least_recent_chunks_and_keeps_a_finished_prefix_longest():
    # room for 5 chunks: B's 3 evict one of A's 3, the least recent: A's last (its first is its newest)
    df, engine = run(turns(), limits(num_chunks=5))
    host = engine.prefix_cache.host
    a_hashes = engine.prefix_cache.block_hashes(turns()[2], 3)
    assert a_hashes[2] not in host.keys()[:2]   # stored again by C after its load (vLLM stores past the load)
    # C finds A's first two blocks only: two blocks loaded, 31 tokens computed
    assert host.num_hit_tokens == 32 and host.num_blocks_loaded == 2
    load_s = 2 * BS * KV_BYTES_PER_TOKEN / LINK
    assert df.loc[2, "first_token_s"] == pytest.approx(2.0 + load_s + 0.01 + 31 * 0.001, abs=1e-12)


def test_host_chunks_of_two_blocks_store_and_load_whole_chunks_only():
    lim = EngineLimits(5, BS, 512, enable_prefix_caching=True, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                       host_link_bytes_per_s=LINK, kv_offload=OffloadLimits(8, blocks_per_chunk=2))
    df, engine = run(turns(), lim)
    host = engine.prefix_cache.host
    # A's 3 prompt blocks make one whole 32-token chunk (its third block starts a chunk it never fills)
    assert host.num_hit_tokens == 32 and host.num_blocks_loaded == 2
    load_s = 2 * BS * KV_BYTES_PER_TOKEN / LINK
    assert df.loc[2, "first_token_s"] == pytest.approx(2.0 + load_s + 0.01 + 31 * 0.001, abs=1e-12)


def test_host_pool_lru_order_after_stores_and_finishes():
    _, engine = run(turns()[:2], limits(num_chunks=8))
    cache, host = engine.prefix_cache, engine.prefix_cache.host
    a = cache.block_hashes(turns()[0])
    b = cache.block_hashes(turns()[1])
    # stored in compute order; each finish makes its request's chunks the newest, first chunk last
    assert host.keys() == [a[2], a[1], a[0], b[2], b[1], b[0]]


def test_host_pool_is_sized_as_vllm_sizes_it():
    # cpu_bytes_to_use over the workers, in page-aligned chunks of KV bytes per block x workers x blocks
    block = 16 * 131072   # Llama-3-8B bf16: 128 KiB a token, 2 MiB a 16-token block on one GPU
    assert offload_limits(8 * GIB, block, 1, 1).num_chunks == 4096
    assert offload_limits(8 * GIB, block // 2, 1, 2) == OffloadLimits(4096, 1, 2)   # TP2: half a block each
    assert offload_limits(8 * GIB, block, 4, 1).num_chunks == 1024                  # 64-token host blocks
    assert offload_limits(1 * GIB, 1000, 1, 1).num_chunks == GIB // 4096            # rounded up to a page


@pytest.mark.parametrize("policy", [POLICIES[2], POLICIES[4], POLICIES[8], OTHER_POLICIES[-1]], ids=policy_id)
def test_offload_matches_on_the_fast_path(policy):
    loaded = 0
    for seed in range(4):
        specs = with_priorities(with_shared_prefixes(random_specs(seed), seed), seed)
        lim = EngineLimits(40, 16, 512, enable_prefix_caching=True, kv_offload=OffloadLimits(30),
                           kv_bytes_per_token=100_000, host_link_bytes_per_s=1e9)
        simpy_engine = run_replica(policy, ConstantCost(0.01, 1e-4), lim, specs)
        fast_engine = FastEngine(policy, ConstantCost(0.01, 1e-4), lim, specs, record_events=True)
        fast = fast_engine.simulate()
        assert fast.events == simpy_engine.log.events
        a, b = simpy_engine.prefix_cache.host, fast_engine.prefix_cache.host
        assert (a.num_hit_tokens, a.num_chunks_stored, a.num_evicted_chunks, a.keys()) == \
               (b.num_hit_tokens, b.num_chunks_stored, b.num_evicted_chunks, b.keys())
        log = simpy_engine.log
        plain = (requests_frame(log), iterations_frame(log), log.itl_gaps_s)
        assert_identical(plain, (requests_table(fast), iterations_table(fast), (fast.itl_values_s, fast.itl_counts)), 40)
        loaded += a.num_hit_tokens
    assert loaded > 0


SESSIONS = {"model": "llama-3-8b", "hardware": "h100-sxm",
            "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate_per_s": 4.0},
                         "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 1000},
                         "output_tokens": {"dist": "lognormal", "median": 40, "sigma": 0.8, "max": 200},
                         "shared_prefix": {"num_groups": 2, "prefix_tokens": 400},
                         "sessions": {"num_turns": 3, "think_time_s": 2}}}


def sessions(fast_path: str, **engine):
    return {**SESSIONS, "engine": {"policy": "chunked_prefill", "enable_prefix_caching": True, "num_gpu_blocks": 300,
                                   "fast_path": fast_path, **engine}}


def test_simulate_with_offload_is_identical_on_both_paths_and_in_a_cluster():
    for extra in ({}, {"cluster": {"num_replicas": 2, "router": "round_robin"}}):
        a = simulate({**sessions("off", kv_offload={"cpu_gb": 2}), **extra}, seed=1)
        b = simulate({**sessions("on", kv_offload={"cpu_gb": 2}), **extra}, seed=1)
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
        pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
        assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
        assert a.summary["offload_hit_rate"] > 0 and a.summary["offload_bytes_loaded"] > 0
    plain = simulate(sessions("on"), seed=1)
    assert "offload_hit_rate" not in plain.summary
    assert a.summary["num_recomputed_prompt_tokens"] < plain.summary["num_recomputed_prompt_tokens"]


@pytest.mark.parametrize("engine, message", [
    ({"kv_offload": {"cpu_gb": 8}, "enable_prefix_caching": False},
     "engine.kv_offload: needs engine.enable_prefix_caching: true"),
    ({"kv_offload": {"cpu_gb": -1}}, "engine.kv_offload.cpu_gb: expected a number >= 0, got -1"),
    ({"kv_offload": {"kv_offloading_size": 0}}, "engine.kv_offload.kv_offloading_size: must be positive"),
    ({"kv_offload": {"cpu_gb": 8, "cpu_bytes": 1}}, "engine.kv_offload.cpu_bytes"),
    ({"kv_offload": {}}, "engine.kv_offload.cpu_gb: required"),
    ({"kv_offload": 8}, "engine.kv_offload: expected a mapping"),
    ({"kv_offload": {"cpu_gb": 8, "block_size": 24}}, "engine.kv_offload.block_size: 24 must be a multiple"),
    ({"kv_offload": {"cpu_gb": 8, "eviction_policy": "arc"}}, "engine.kv_offload.eviction_policy: only lru"),
    ({"kv_offload": {"cpu_gb": 300}}, "engine.kv_offload.cpu_gb: 300 GiB is more than the host memory of 1 x h100-sxm"),
])
def test_bad_offload_settings_are_one_line_naming_the_key(engine, message):
    raw = {**SESSIONS, "engine": {"enable_prefix_caching": True, **engine}}
    with pytest.raises(ConfigError) as e:
        resolve_point(raw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_host_memory_ceiling_scales_with_the_replicas_gpus_and_a_hardware_figure():
    raw = {**SESSIONS, "tensor_parallel_size": 2, "engine": {"enable_prefix_caching": True,
                                                             "kv_offload": {"cpu_gb": 300}}}
    assert resolve_point(raw).engine.kv_offload.cpu_gb == 300   # 2 x 256 GiB on a DGX H100
    raw = {**raw, "hardware": {"base": "h100-sxm", "host_memory_bytes": 100e9}}
    with pytest.raises(ConfigError, match=r"cpu_gb: 300 GiB is more than the host memory of 2 x h100-sxm-custom"):
        resolve_point(raw)


def test_bad_offload_setting_exits_2_in_one_line(tmp_path):
    sweep = tmp_path / "bad.yaml"
    sweep.write_text("model: llama-3-8b\nengine: {enable_prefix_caching: true, kv_offload: {cpu_gb: -8}}\n"
                     "workload: {num_requests: 5}\n")
    out = subprocess.run([sys.executable, "-m", "experiments.run", str(sweep), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith("engine.kv_offload.cpu_gb: expected a number >= 0, got -8")


def test_the_example_reports_offload_columns(tmp_path):
    import yaml
    from tests.test_examples import EXAMPLES, run
    sweep = yaml.safe_load((EXAMPLES / "kv_offload.yaml").read_text())
    sweep["workload"]["num_requests"] = 60
    sweep["grid"]["engine.kv_offload"] = sweep["grid"]["engine.kv_offload"][:2]
    f = tmp_path / "kv_offload.yaml"
    f.write_text(yaml.safe_dump(sweep))
    md = run(f, tmp_path / "out")
    assert "offload_hit_pct" in md and "recomputed_prompt_ktok" in md
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert {"offload_hit_rate", "offload_bytes_loaded", "offload_bytes_stored"} <= set(results.columns)
    assert results["offload_bytes_stored"].iloc[1] > 0

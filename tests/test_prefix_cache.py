"""Prefix caching: chained block hashes, LRU reuse with lazy eviction, the engine applying hits, and the
synthetic traffic that carries prefix ids."""
from __future__ import annotations

import numpy as np
import pytest
import simpy

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate
from policies import ChunkedPrefill, Continuous
from simcore.arrivals import open_loop
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.kvcache import PrefixCachingBlockPool
from simcore.log import EngineLog
from simcore.metrics import requests_frame
from simcore.request import Request, RequestSpec, Status
from workloads.synthetic import generate, parse_workload

BS = 4


def spec(rid, prompt, ids, output=2, arrival=0.0):
    return RequestSpec(rid, arrival, prompt, output, prefix_block_ids=tuple(ids) if ids is not None else None)


def compute_prompt(pool, req):
    """What the engine does for a request's whole prompt: admit (hit), allocate, compute, register."""
    hit = pool.admit(req)
    req.num_computed_tokens = hit
    req.status = Status.RUNNING
    pool.grow(req, req.num_prompt_tokens)
    req.num_computed_tokens = req.num_prompt_tokens
    pool.cache_full_blocks(req)
    return hit


def finish(pool, req):
    req.status = Status.FINISHED
    pool.free(req)


def test_hash_chains_over_parent_and_own_id():
    pool = PrefixCachingBlockPool(100, BS)
    a, b, c = (pool.block_hashes(spec(i, 12, ids)) for i, ids in enumerate([(1, 2, 3), (1, 2, 4), (9, 2, 3)]))
    assert a[:2] == b[:2] and a[2] != b[2]            # same prefix, different last block
    assert a[1] != c[1] and a[2] != c[2]              # same id, different parent: different hash
    unnamed = pool.block_hashes(spec(5, 12, None))    # no ids: unique to its request
    assert len(unnamed) == 3 and set(unnamed).isdisjoint(a)
    assert len(pool.block_hashes(spec(6, 11, (1, 2, 3)))) == 2  # only full blocks


def test_hit_skips_cached_prefix_but_recomputes_last_token():
    pool = PrefixCachingBlockPool(100, BS)
    r0 = Request(spec(0, 12, (1, 2, 3)))
    assert compute_prompt(pool, r0) == 0
    r1 = Request(spec(1, 14, (1, 2, 3)))                # 12 cached + 2 new tokens
    assert pool.num_cached_tokens(r1) == 12
    assert pool.num_held_hit_blocks(r1) == 3          # r0 still holds them: shared, no free block taken
    r2 = Request(spec(2, 12, (1, 2, 3)))                # the same 12-token prompt: last block recomputed
    assert pool.num_cached_tokens(r2) == 8
    assert compute_prompt(pool, r1) == 12
    assert pool.num_used_blocks == 4 and pool.num_block_refs == 3 + 4
    finish(pool, r0)
    finish(pool, r1)
    assert pool.num_used_blocks == 0 and pool.stats()["prefix_hit_rate"] == pytest.approx(12 / 26)


def test_lru_free_queue_reverse_order_and_lazy_eviction():
    pool = PrefixCachingBlockPool(5, BS)  # 4 usable blocks: vLLM keeps one as its null block
    a = Request(spec(0, 9, (10, 11)))  # 3 blocks: two full named ones + a partial tail
    compute_prompt(pool, a)
    finish(pool, a)                     # queue: tail (no hash: back at the head), [never used], a1, a0
    b = Request(spec(1, 4, None))       # takes a's partial tail block, then the never-used one
    pool.admit(b)
    pool.grow(b, 8)
    assert pool.num_evicted_blocks == 0
    c = Request(spec(2, 4, None))
    pool.admit(c)
    pool.grow(c, 4)                     # next head: a's block 1 (deepest first) is evicted
    assert pool.num_evicted_blocks == 1
    probe = Request(spec(3, 9, (10, 11)))
    assert pool.num_cached_tokens(probe) == 4  # a's block 0 survived: shared prefixes are evicted last
    assert pool.num_free_blocks == 1


def test_blocks_to_hold_counts_idle_hits_but_not_shared_ones():
    pool = PrefixCachingBlockPool(10, BS)
    a = Request(spec(0, 8, (1, 2)))
    compute_prompt(pool, a)
    from simcore.view import EngineView
    b = Request(spec(1, 10, (1, 2)))
    v = EngineView(0.0, [b], [a], pool.num_free_blocks, 10, BS, 100, prefix_cache=pool)
    assert v.num_cached_prefix_tokens(b) == 8 and v.blocks_to_hold(b, 10) == 1  # 2 shared + 1 new
    finish(pool, a)
    v = EngineView(0.0, [b], [], pool.num_free_blocks, 10, BS, 100, prefix_cache=pool)
    assert v.blocks_to_hold(b, 10) == 3  # idle cached blocks leave the free queue when touched


def run(policy, specs, caching, num_gpu_blocks=1000, block_size=16, cost=None):
    env = simpy.Environment()
    log = EngineLog()
    limits = EngineLimits(num_gpu_blocks, block_size, 8192, enable_prefix_caching=caching)
    engine = Engine(env, policy, cost or ConstantCost(0.01, 0.001), limits, log)
    env.process(open_loop(env, specs, engine.submit))
    env.run()
    return requests_frame(log), log, engine


@pytest.mark.parametrize("policy", [ChunkedPrefill(max_num_batched_tokens=512), Continuous(max_num_batched_tokens=8192)])
def test_engine_skips_cached_prefill_and_ttft_drops(policy):
    ids = tuple(range(60))
    specs = [spec(0, 1000, ids, 3, 0.0), spec(1, 1000, ids, 3, 10.0)]
    on, log_on, eng = run(policy, specs, True)
    off, log_off, _ = run(policy, specs, False)
    # the second request prefills only the uncached 40 tokens (60 full blocks of 16 cached)
    assert sum(r[2] for r in log_on.iterations) == 1000 + 40
    assert on.ttft_s[1] < off.ttft_s[1] and on.ttft_s[0] == off.ttft_s[0]
    assert eng.pool.stats()["num_cached_prompt_tokens"] == 960


@pytest.mark.parametrize("policy", [ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64),
                                    Continuous(max_num_seqs=8, max_num_batched_tokens=2048)])
def test_random_shared_prefix_traffic_under_memory_pressure(policy):
    w = parse_workload({"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 50},
                        "prompt_tokens": {"dist": "uniform", "min": 5, "max": 200},
                        "output_tokens": {"dist": "uniform", "min": 1, "max": 60},
                        "shared_prefix": {"num_groups": 3, "prefix_tokens": 100}})
    specs = generate(w, 3, 8192, block_size=16).specs
    df, log, eng = run(policy, specs, True, num_gpu_blocks=60)  # invariants checked every step
    assert (df.status == "finished").all() and (df.output_tokens == [s.num_output_tokens for s in specs]).all()
    assert df.num_preemptions.sum() > 0 and eng.pool.num_evicted_blocks > 0
    assert eng.pool.num_used_blocks == 0 and eng.pool.stats()["prefix_hit_rate"] > 0.2


def test_synthetic_prefix_ids_for_groups_and_sessions():
    w = parse_workload({"num_requests": 6, "arrival": {"process": "poisson", "rate_per_s": 1},
                        "prompt_tokens": {"dist": "fixed", "value": 40}, "output_tokens": {"dist": "fixed", "value": 8},
                        "sessions": {"num_turns": 3, "think_time_s": 100}, "shared_prefix": {"num_groups": 1, "prefix_tokens": 32}})
    specs = generate(w, 0, 8192, block_size=16).specs
    by_turn = sorted(specs, key=lambda s: (s.prefix_block_ids[2], s.arrival_s))[:3]  # one session's turns
    assert [s.num_prompt_tokens for s in by_turn] == [72, 120, 168]  # system 32 + history + new 40
    for a, b in zip(by_turn, by_turn[1:]):
        assert b.prefix_block_ids[:len(a.prefix_block_ids)] == a.prefix_block_ids
    assert all(s.prefix_block_ids[:2] == specs[0].prefix_block_ids[:2] for s in specs)  # shared system prompt
    assert [s.request_id for s in specs] == list(range(6)) and all(
        x.arrival_s <= y.arrival_s for x, y in zip(specs, specs[1:]))


def test_config_switch_and_summary():
    base = {"model": "llama-3-8b", "hardware": "h100-sxm",
            "workload": {"num_requests": 30, "arrival": {"process": "poisson", "rate_per_s": 10},
                         "prompt_tokens": {"dist": "uniform", "min": 10, "max": 300},
                         "output_tokens": {"dist": "uniform", "min": 1, "max": 30},
                         "shared_prefix": {"num_groups": 2, "prefix_tokens": 512}}}
    res = simulate({**base, "engine": {"enable_prefix_caching": True}})
    assert 0.5 < res.summary["prefix_hit_rate"] < 1 and res.summary["num_cached_prompt_tokens"] > 0
    assert res.requests["cached_prompt_tokens"].sum() == res.summary["num_cached_prompt_tokens"]
    assert "prefix_hit_rate" not in simulate(base).summary
    with pytest.raises(ConfigError, match="engine.enable_prefix_caching: policy static"):
        resolve_point({**base, "engine": {"policy": "static", "enable_prefix_caching": True}})


def test_an_allocation_earlier_in_the_step_evicts_a_later_requests_hit_as_in_vllm():
    specs = [spec(0, 64, range(4), 1, 0.0), spec(1, 64, None, 1, 0.0),    # fill and free all 8 blocks
             spec(2, 48, None, 1, 10.0), spec(3, 65, range(4), 1, 10.0)]  # 2 allocates from the LRU head
    df, log, eng = run(ChunkedPrefill(max_num_batched_tokens=512), specs, True, num_gpu_blocks=9)  # 8 usable
    # vLLM allocates request by request: 2 takes request 0's blocks 3, 2, 1 (freed tail first), so 3 hits
    # only block 0 and computes 49 tokens (vLLM 0.32's Scheduler does the same: tests/test_vllm_scheduler.py)
    assert [r[2] for r in log.iterations] == [128, 48 + 49]
    assert eng.pool.stats()["num_cached_prompt_tokens"] == 16


def test_a_request_admitted_later_in_the_step_hits_blocks_registered_earlier_in_it():
    specs = [spec(0, 40, (7, 8), 3, 0.0), spec(1, 40, (7, 8), 3, 0.0)]
    df, log, eng = run(ChunkedPrefill(max_num_batched_tokens=256), specs, True)
    assert log.iterations[0][2] == 40 + 8  # vLLM caches at scheduling: request 1 shares request 0's 2 blocks

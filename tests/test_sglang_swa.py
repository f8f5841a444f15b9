"""SGLang's hybrid sliding-window memory (simcore/sglang_swa.py): two pools sized by swa_full_tokens_ratio,
the sliding pool freeing slots out of the window when SGLang evicts them, the scheduler seeing the smaller
free count, both engines alike, and the settings it refuses."""
import pandas as pd
import pytest

from experiments.config import ConfigError, resolve_point
from experiments.simulate import memory_plan, simulate
from policies import Sglang
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits, SimulationError
from simcore.metrics import iterations_frame
from simcore.request import RequestSpec
from simcore.sglang_swa import SwaBlockPool, SwaPools
from simcore.wiring import run_replica
from tests.test_fastpath import assert_identical, run_both
from tests.test_hybrid_kv import tiny_point
from tests.test_properties import random_specs


def sglang_point(tmp_path, **engine):
    point = tiny_point(tmp_path, policy="sglang", **engine)
    point["engine"].pop("max_num_batched_tokens")
    return point


def test_the_pools_split_memory_by_the_ratio_as_sglang_does():
    # gpt-oss: 18 full and 18 sliding layers of one page size, r = 0.8: a full-pool page costs 18 + 0.8 x 18
    # layers' KV, so the full pool gets 36 / 32.4 = 1.11 times the tokens every layer whole would get
    pools = SwaPools(18, 18, 128, 16, 0.8)
    assert pools.bytes_per_block(2048) == int(32.4 * 2048 * 16)
    assert pools.num_swa_blocks(1000) == 800 and pools.num_swa_blocks(1001) == 800   # int(16,016 x 0.8) // 16
    pool = SwaBlockPool(1001, pools)
    assert (pool.num_full_blocks, pool.num_swa_blocks, pool.num_blocks) == (1000, 800, 800)   # (a null page)


def test_the_sliding_pool_frees_the_window_when_sglang_evicts():
    # window 32, pages of 16, ratio 0.5: full pool 99 pages, sliding pool 50 (it binds). One request: a
    # 64-token prompt in one prefill (nothing computed before it: nothing freed), then 39 decodes. On its 1st
    # and 33rd decode SGLang frees the sliding slots below computed - 32 - 16: 1 page at 64 computed, 3 at 96.
    pools = SwaPools(1, 1, 32, 16, 0.5)
    engine = run_replica(Sglang(), ConstantCost(1.0), EngineLimits(100, 16, 512, kv_groups=pools),
                         [RequestSpec(0, 0.0, 64, 40)])
    used = iterations_frame(engine.log).kv_blocks_used.tolist()   # the sliding pool's pages in use
    assert used[0] == 4                    # 64 tokens: 4 pages in each pool
    assert used[1:17] == [4] * 16          # page 0 freed, page 4 taken (65 tokens)
    assert used[17:33] == [5] * 16         # page 5 taken at 81 tokens
    assert used[33:39] == [4] * 6          # pages 1-2 freed, page 6 taken (97 tokens)
    assert used[-1] == 0 and len(used) == 40


def test_sglang_admits_more_with_the_sliding_pool():
    # the same memory: 60 pages of both layers whole, or the two pools at r = 0.8 (a full page costs 1.8
    # layers: 67 pages, 66 full after the null one, int(67 x 16 x 0.8) // 16 = 53 sliding). SGLang charges a
    # request its prompt and output (500 tokens) against the full pool: one fits in 960 tokens, two in 1,056;
    # and max(300, window 64) + 16 = 316 tokens against the sliding pool's 848: two fit there too
    specs = [RequestSpec(i, 0.0, 300, 200, 200) for i in range(4)]
    whole = run_replica(Sglang(), ConstantCost(1.0), EngineLimits(61, 16, 1024), specs)
    swa = run_replica(Sglang(), ConstantCost(1.0), EngineLimits(67, 16, 1024, kv_groups=SwaPools(1, 1, 64, 16, 0.8)),
                      specs)
    assert swa.pool.num_blocks == 53
    assert iterations_frame(whole.log).num_running.max() == 1 and iterations_frame(swa.log).num_running.max() == 2
    assert max(r.finish_s for r in swa.log.requests) == 400 < max(r.finish_s for r in whole.log.requests) == 800


def test_the_sliding_pools_budget_stops_admission():
    # 99 full pages (1,584 tokens) admit three requests of 300 + 100 tokens (charged 404 each, paged); the
    # sliding pool at r = 0.5 has 50 pages (800 tokens), and each is charged max(304, 64) + 16 = 320 of it:
    # the third finds 160 left, less than its 316, and is not admitted
    specs = [RequestSpec(i, 0.0, 300, 100, 100) for i in range(4)]
    engine = run_replica(Sglang(), ConstantCost(1.0), EngineLimits(100, 16, 1024, kv_groups=SwaPools(1, 1, 64, 16, 0.5)),
                         specs)
    assert iterations_frame(engine.log).num_running.max() == 2
    whole_budget = run_replica(Sglang(), ConstantCost(1.0), EngineLimits(100, 16, 1024), specs)
    assert iterations_frame(whole_budget.log).num_running.max() == 3


@pytest.mark.parametrize("num_blocks, ratio", [(60, 0.3), (70, 0.5)])
def test_fast_path_equals_simpy_bitwise_with_sglangs_pools(num_blocks, ratio):
    # an eager new_token_ratio, so that decodes outgrow the sliding pool and SGLang retracts
    policy = Sglang(chunked_prefill_size=128, init_new_token_ratio=0.05, new_token_ratio_decay_steps=2)
    pools = SwaPools(1, 1, 24, 16, ratio)
    retracted = 0
    for seed in range(5):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=num_blocks, kv_groups=pools)
        assert_identical(plain, fast, num_blocks)
        retracted += plain[0].num_preemptions.sum()
    assert retracted > 0


def test_simulate_sizes_sglangs_pools_and_runs_alike_on_both_paths(tmp_path):
    point = sglang_point(tmp_path)
    plan = memory_plan(resolve_point(point))
    whole = memory_plan(resolve_point(sglang_point(tmp_path, disable_hybrid_kv_cache_manager=True)))
    assert isinstance(plan.kv_groups, SwaPools) and whole.kv_groups is None
    assert plan.num_gpu_blocks == pytest.approx(whole.num_gpu_blocks * 4 / (2 + 0.8 * 2), rel=1e-3)   # 2 + 2 layers
    assert memory_plan(resolve_point(sglang_point(tmp_path, swa_full_tokens_ratio=0.5))).num_gpu_blocks \
        == pytest.approx(whole.num_gpu_blocks * 4 / 3, rel=1e-3)
    point["engine"]["num_gpu_blocks"] = 60
    a = simulate({**point, "engine": {**point["engine"], "fast_path": "off"}}, seed=1)
    b = simulate({**point, "engine": {**point["engine"], "fast_path": "on"}}, seed=1)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)


@pytest.mark.parametrize("engine, match", [
    ({"swa_full_tokens_ratio": 0}, "engine.swa_full_tokens_ratio: expected a number in \\(0, 1\\]"),
    ({"swa_full_tokens_ratio": 1.5}, "engine.swa_full_tokens_ratio: expected a number in \\(0, 1\\]"),
    # (refused by the SGLang policy, or where it speculates, by its SWA memory: not modelled together)
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "engine.speculative"),
])
def test_bad_settings_are_one_line(tmp_path, engine, match):
    with pytest.raises((ConfigError, SimulationError), match=match):
        memory_plan(resolve_point(sglang_point(tmp_path, **engine)))

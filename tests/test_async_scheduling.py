"""vLLM V1's async scheduling as the engines model it (simcore/async_scheduling.py): a request that arrives
while a step runs is scheduled one decision later; an idle engine takes it at once; both engines agree
bitwise; the default follows the cost model (the roofline prior: on) and engine.vllm_version, and a sweep file
can say otherwise (then the prior adds each step's CPU time to its GPU time)."""

import pytest

from experiments.config import resolve_point
from experiments.simulate import engine_limits, memory_plan, point_cost_model, simulate
from policies import ChunkedPrefill
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.request import RequestSpec
from simcore.wiring import run_replica
from tests.helpers import policy_id
from tests.test_fastpath import (OTHER_POLICIES, POLICIES, ROOFLINE, assert_identical, run_both,
                                 with_shared_prefixes)
from tests.test_properties import random_specs


def first_token_s(policy, specs, async_scheduling):
    limits = EngineLimits(100, 16, 512, async_scheduling=async_scheduling)
    log = run_replica(policy, ConstantCost(1.0), limits, specs).log
    return {r.request_id: r.first_token_s for r in log.requests}


def test_an_arrival_during_a_step_waits_one_step_more():
    # Steps of 1 s; A starts at t=0 and decodes for a while; B arrives at t=0.5, during A's first step.
    # Synchronous: B is scheduled when that step ends (t=1) and has its first token at t=2. Async: the
    # step after t=1 was already chosen when B arrived, so B runs in the step from t=2: first token at t=3.
    specs = [RequestSpec(0, 0.0, 8, 10, 10), RequestSpec(1, 0.5, 8, 3, 3)]
    policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=256)
    assert first_token_s(policy, specs, False)[1] == 2.0
    assert first_token_s(policy, specs, True)[1] == 3.0


def test_an_idle_engine_schedules_an_arrival_at_once():
    specs = [RequestSpec(0, 0.0, 8, 2, 2), RequestSpec(1, 5.25, 8, 2, 2)]   # B finds the engine idle
    policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=256)
    sync, asyn = first_token_s(policy, specs, False), first_token_s(policy, specs, True)
    assert sync == asyn == {0: 1.0, 1: 6.25}


@pytest.mark.parametrize("policy", POLICIES + OTHER_POLICIES[::2], ids=policy_id)
@pytest.mark.parametrize("cost", [ConstantCost(0.01, 1e-4), ROOFLINE], ids=["constant", "roofline"])
def test_both_engines_agree_with_async_scheduling(policy, cost):
    for seed in range(4):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, cost, num_gpu_blocks=40, async_scheduling=True)
        assert_identical(plain, fast, 40)


@pytest.mark.parametrize("policy", [POLICIES[2], POLICIES[6], OTHER_POLICIES[-1]], ids=policy_id)
def test_both_engines_agree_with_async_scheduling_and_prefix_caching(policy):
    for seed in range(3):
        specs = with_shared_prefixes(random_specs(seed), seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=40,
                               enable_prefix_caching=True, async_scheduling=True)
        assert_identical(plain, fast, 40)


@pytest.mark.parametrize("policy", POLICIES[::3], ids=policy_id)
def test_both_engines_agree_with_async_scheduling_on_ties_and_closed_loops(policy):
    specs = [RequestSpec(i, 0.5 * (i // 2), 20 + 7 * i % 40, 1 + i % 9, 1 + i % 9) for i in range(30)]
    plain, fast = run_both(policy, specs, ConstantCost(1.0), num_gpu_blocks=30, block_size=4, async_scheduling=True)
    assert_identical(plain, fast, 30)
    plain, fast = run_both(policy, random_specs(1), ConstantCost(0.01, 1e-4), num_gpu_blocks=60, closed=(4, 0.03),
                           async_scheduling=True)
    assert_identical(plain, fast, 60)


POINT = {"model": "llama-2-7b", "hardware": "h100-sxm",   # no shipped profile: the prior (or [aic])
         "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": 20},
                      "prompt_tokens": {"dist": "fixed", "value": 200}, "output_tokens": {"dist": "fixed", "value": 20}}}


def limits_of(point):
    cfg = resolve_point(point)
    return engine_limits(cfg, memory_plan(cfg), point_cost_model(cfg))


def test_the_default_follows_the_cost_model_and_a_sweep_file_overrides_it():
    assert limits_of(POINT).async_scheduling   # the prior and [aic] represent vLLM V1 on CUDA
    assert not limits_of({**POINT, "engine": {"async_scheduling": False}}).async_scheduling
    shipped = {**POINT, "model": "llama-3-8b"}   # a shipped kernel profile: the engine it serves is vLLM V1
    assert limits_of(shipped).async_scheduling
    stub = {**POINT, "profile": "constant:per_step_s=0.01"}
    assert not limits_of(stub).async_scheduling   # no such setting: synchronous
    assert limits_of({**stub, "engine": {"async_scheduling": True}}).async_scheduling


def test_async_scheduling_raises_ttft_by_about_a_step_at_light_load():
    on = simulate(POINT, 0).summary
    off = simulate({**POINT, "engine": {"async_scheduling": False}}, 0).summary
    assert on["ttft_mean_ms"] > off["ttft_mean_ms"]
    # synchronous, each step also waits for its CPU time (0.4 ms a step and 6 us a sequence, the prior's),
    # which async scheduling hides behind the GPU's
    assert 0.4 <= off["tpot_mean_ms"] - on["tpot_mean_ms"] <= 0.6

"""Prefill/decode disaggregation on the fast path (simcore/fast/disagg.py) against the SimPy deployment
(simcore/disagg.py): the same hand-offs (routing, KV allocation, link queueing, copy times), per-request rows,
iteration rows in the same order, ITL samples and summaries, bitwise; open and closed loop, both sources of
the first token, ties, swap preemption while copies hold KV."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import simpy

from experiments.fast import iterations_table, requests_table
from experiments.simulate import simulate
from policies.routers import ROUTERS
from simcore.costmodel import ConstantCost
from simcore.disagg import DisaggregatedCluster, KVLink
from simcore.engine import Engine, EngineLimits
from simcore.fast.disagg import FastDisagg
from simcore.log import EngineLog
from simcore.metrics import iterations_frame, requests_frame
from simcore.wiring import start_arrivals
from simcore.request import RequestSpec
from tests.helpers import policy_id
from tests.test_fastpath import POLICIES, ROOFLINE, assert_identical
from tests.test_properties import random_specs

DISAGG_POLICIES = [p for p in POLICIES if p.name in ("continuous", "chunked_prefill")]
CONSTANT = ConstantCost(0.01, 1e-4)


def run_both(policy, specs, cost, num_prefill, num_decode, num_gpu_blocks=40, closed=None, first="prefill",
             link=KVLink(1e6, 0.001), kv_bytes_per_token=100, block_size=16, router="least_outstanding", **engine):
    """The SimPy deployment as experiments/disaggregation.py wires it, and the fast one: their tables."""
    limits = EngineLimits(num_gpu_blocks, block_size, 512, **engine)
    routers = (ROUTERS[router](), ROUTERS["least_outstanding"]())
    max_num_seqs = getattr(policy, "max_num_seqs", None)
    env, log = simpy.Environment(), EngineLog()
    prefill_limits = dataclasses.replace(limits, handoff_after_first_token=True)
    prefill = [Engine(env, policy, cost, prefill_limits, log, replica_id=i) for i in range(num_prefill)]
    decode = [Engine(env, policy, cost, limits, log, replica_id=num_prefill + i) for i in range(num_decode)]
    plain = DisaggregatedCluster(env, prefill, decode, *routers, link, kv_bytes_per_token, first, max_num_seqs)
    start_arrivals(env, specs, plain.submit, plain.chain_on_done, closed)
    env.run()
    fast_deployment = FastDisagg(policy, cost, limits, specs, num_prefill, num_decode, *routers, link,
                                 kv_bytes_per_token, first, max_num_seqs, closed, record_events=True)
    fast = fast_deployment.simulate()
    assert fast.events == log.events
    assert plain.handoffs == fast_deployment.handoffs
    return ((requests_frame(log), iterations_frame(log), log.itl_gaps_s),
            (requests_table(fast), iterations_table(fast), (fast.itl_values_s, fast.itl_counts)))


@pytest.mark.parametrize("policy", DISAGG_POLICIES, ids=policy_id)
@pytest.mark.parametrize("first", ["prefill", "decode"])
@pytest.mark.parametrize("closed", [None, (6, 0.0), (6, 0.05)], ids=["open", "closed", "think"])
def test_fast_disaggregation_matches_the_simpy_deployment(policy, first, closed):
    num_handoffs = 0
    for seed in range(3):
        specs = random_specs(seed)
        for cost, pools in ((CONSTANT, (1, 1)), (ROOFLINE, (2, 3))):
            plain, fast = run_both(policy, specs, cost, *pools, closed=closed, first=first)
            assert_identical(plain, fast, 40 * sum(pools))
            num_handoffs += int((plain[0].replica_id >= pools[0]).sum())
    assert num_handoffs > 0


@pytest.mark.parametrize("policy", DISAGG_POLICIES[::2], ids=policy_id)
def test_fast_disaggregation_breaks_ties_as_simpy_does(policy):
    # Integral step and copy times: copies end on step ends, arrivals on both, identical requests in lock step.
    rng = np.random.default_rng(7)
    grid = [RequestSpec(i, 0.5 * int(t), int(p), int(o), int(o)) for i, (t, p, o) in
            enumerate(zip(np.sort(rng.integers(0, 40, 30)), rng.integers(1, 60, 30), rng.integers(1, 12, 30)))]
    same = [RequestSpec(i, 0.25, 32, 8, 8) for i in range(24)]
    for specs, closed in ((grid, None), (same, None), (same, (6, 0.0)), (same, (7, 1.0))):
        for link in (KVLink(100.0, 0.0), KVLink(16.0, 0.5)):   # bytes = tokens here: 0.01-0.6 s, 0.5-4.5 s
            plain, fast = run_both(policy, specs, ConstantCost(1.0), 2, 2, num_gpu_blocks=30, closed=closed,
                                   link=link, kv_bytes_per_token=1, block_size=4)
            assert_identical(plain, fast, 4 * 30)


@pytest.mark.parametrize("policy", DISAGG_POLICIES[2:4], ids=policy_id)
def test_fast_disaggregation_with_swap_and_a_tight_decode_pool(policy):
    for seed in range(3):
        plain, fast = run_both(policy, random_specs(seed), CONSTANT, 2, 2, preemption_mode="swap",
                               num_swap_blocks=12, kv_bytes_per_token=100_000, host_link_bytes_per_s=1e9)
        assert_identical(plain, fast, 4 * 40)
        # decode replicas short of KV: copies wait for blocks (FIFO), slow links queue copies
        plain, fast = run_both(policy, random_specs(seed), ROOFLINE, 1, 2, num_gpu_blocks=30, closed=(8, 0.0),
                               link=KVLink(1e5, 0.01))
        assert_identical(plain, fast, 3 * 30)


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm",
        "workload": {"num_requests": 300, "arrival": {"process": "poisson", "rate_per_s": 30.0},
                     "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 1.0, "max": 8000},
                     "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 1024}},
        "slo": {"ttft_ms": 300, "tpot_ms": 30}}


@pytest.mark.parametrize("disaggregation", [
    {"num_prefill_replicas": 1, "num_decode_replicas": 2},
    {"num_prefill_replicas": 2, "num_decode_replicas": 2, "first_token_from": "decode", "link_bandwidth_gb_per_s": 5}],
    ids=["prefill", "decode"])
def test_simulate_runs_disaggregation_on_the_fast_path_with_identical_results(disaggregation):
    for engine in ({"policy": "chunked_prefill", "max_num_batched_tokens": 512, "num_gpu_blocks": 300},
                   {"policy": "continuous", "num_gpu_blocks": 400}):
        point = {**BASE, "disaggregation": disaggregation}
        a = simulate({**point, "engine": {**engine, "fast_path": "off"}}, seed=1)
        b = simulate({**point, "engine": {**engine, "fast_path": "on"}}, seed=1)
        for x, y in ((a.requests, b.requests), (a.iterations, b.iterations), (a.replicas, b.replicas)):
            pd.testing.assert_frame_equal(x, y, check_exact=True)
        assert list(a.summary) == list(b.summary)
        assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
        assert b.summary["num_kv_transfers"] > 0

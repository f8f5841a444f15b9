"""Admission control on the fast path (simcore/fast/gateway.py) against the SimPy engine (simcore/gateway.py):
identical request events, rows, iteration rows, ITL samples and summaries with gateway caps, queue deadlines
and client time-outs (requests abandoned mid-step, their KV freed), open and closed loop, every policy; and a
deadline that ends nothing leaves the fast engine's quiet stretches in place."""
from __future__ import annotations

import copy

import pandas as pd
import pytest

from experiments.simulate import simulate
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.fast.engine import FastEngine
from simcore.gateway import GatewayLimits
from simcore.request import RequestSpec
from tests.helpers import policy_id
from tests.test_fastpath import OTHER_POLICIES, POLICIES, ROOFLINE, assert_identical, run_both
from tests.test_properties import random_specs

GATEWAYS = [GatewayLimits(max_waiting=3), GatewayLimits(max_outstanding=5), GatewayLimits(max_queue_s=0.05),
            GatewayLimits(client_timeout_s=0.08),
            GatewayLimits(max_waiting=4, max_queue_s=0.1, client_timeout_s=0.2)]


def ends(frame) -> dict:
    return frame.reject_reason.value_counts().to_dict()


@pytest.mark.parametrize("policy", POLICIES + OTHER_POLICIES, ids=policy_id)
def test_fast_gateway_matches_the_simpy_engine(policy):
    seen = {}
    for k, gateway in enumerate(GATEWAYS):
        for seed in range(2):
            for closed in (None, (5, 0.0), (5, 0.02)):
                specs = random_specs(seed + 2 * k)
                plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), 40, closed=closed, gateway=gateway)
                assert_identical(plain, fast, 40)
                for reason, n in ends(plain[0]).items():
                    seen[reason] = seen.get(reason, 0) + n
    assert {"gateway_full", "queue_timeout", "client_timeout"} <= set(seen)


def test_a_client_abandons_mid_run_on_both_engines():
    # chunked prefill of a 64-token prompt in 16-token steps of 1 s (tests/test_gateway.py's timeline): its
    # client leaves at 1.5 s during the second step; it leaves when that step ends, its blocks freed
    from policies import ChunkedPrefill
    policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=16)
    specs = [RequestSpec(0, 0.0, 64, 4), RequestSpec(1, 2.5, 16, 1)]
    plain, fast = run_both(policy, specs, ConstantCost(1.0), 1000, max_model_len=8192,
                           gateway=GatewayLimits(client_timeout_s=1.5))
    assert_identical(plain, fast, 1000)
    rows = fast[0]
    assert list(zip(rows.status, rows.reject_reason.fillna(""), rows.finish_s)) == [
        ("rejected", "client_timeout", 2.0), ("finished", "", 3.5)]
    assert list(fast[1].kv_blocks_used) == [1, 0, 0]


def test_abandoned_mid_run_under_the_roofline_model():
    abandoned = 0
    for seed in range(4):
        plain, fast = run_both(POLICIES[2], random_specs(seed), ROOFLINE, 40,
                               gateway=GatewayLimits(client_timeout_s=0.03))
        assert_identical(plain, fast, 40)
        df = plain[0]
        abandoned += int(((df.reject_reason == "client_timeout") & df.admitted_s.notna()).sum())
    assert abandoned > 0   # some were running (admitted) when their clients left


def test_quiet_stretches_survive_a_gateway_whose_deadlines_end_nothing():
    # 8 requests decode 400 tokens each; client time-outs of 1000 s never apply (all have first tokens)
    specs = [RequestSpec(i, 0.001 * i, 32, 400) for i in range(8)]
    decisions = {}
    for gateway in (None, GatewayLimits(client_timeout_s=1000.0, max_queue_s=1000.0)):
        engine = FastEngine(POLICIES[2], ConstantCost(0.01, 1e-4), EngineLimits(400, 16, 512, gateway=gateway), specs)
        calls = [0]
        decide = engine.decide

        def counted(now, decide=decide, calls=calls):
            calls[0] += 1
            return decide(now)
        engine.decide = counted
        log = engine.simulate()
        decisions[gateway is not None] = (calls[0], len(log.iteration_floats))
    assert decisions[True] == decisions[False]
    assert decisions[True][0] < decisions[True][1] / 20   # whole stretches per decision, not a step each


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm",
        "engine": {"policy": "chunked_prefill", "max_num_batched_tokens": 512, "num_gpu_blocks": 300},
        "workload": {"num_requests": 300, "arrival": {"process": "poisson", "rate_per_s": 40.0},
                     "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 1.0, "max": 4000},
                     "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 512}},
        "gateway": {"max_waiting": 20, "max_queue_s": 1.0, "client_timeout_s": 2.0}, "slo": {"ttft_ms": 1000}}


@pytest.mark.parametrize("cluster", [None, {"num_replicas": 2, "router": "least_outstanding"}],
                         ids=["one", "cluster"])
def test_a_gateway_point_runs_on_the_fast_path_with_identical_results(cluster):
    cfg = copy.deepcopy(BASE)
    if cluster is not None:
        cfg["cluster"] = cluster
    runs = []
    for mode in ("off", "on"):
        runs.append(simulate({**cfg, "engine": {**cfg["engine"], "fast_path": mode}}, seed=1))
    a, b = runs
    for x, y in ((a.requests, b.requests), (a.iterations, b.iterations)):
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert list(a.summary) == list(b.summary)
    assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
    assert b.summary["num_dropped"] + b.summary["num_abandoned"] + b.summary["num_gateway_refused"] > 0

"""Autoscaling on the fast path (simcore/fast/autoscaling.py) against the SimPy engine (simcore/autoscaler.py):
the same scaling log (starts after the start-up delay, drains, leaves), GPU time, routing, request events,
rows, iteration rows and ITL samples, with and without a gateway, open and closed loop, for every signal; and
sweep points with autoscaling that run on the fast path by default."""
from __future__ import annotations

import copy

import pandas as pd
import pytest
import simpy

from experiments.fast import fast_path_reason, iterations_table, requests_table
from experiments.config import resolve_point
from experiments.simulate import simulate
from policies import Continuous
from policies.routers import ROUTERS, LeastOutstanding
from simcore.autoscaler import AutoscaledCluster, AutoscalingLimits, ScalingEvent
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.fast.cluster import FastCluster
from simcore.gateway import GatewayLimits
from simcore.log import EngineLog
from simcore.metrics import iterations_frame, requests_frame
from simcore.request import RequestSpec
from simcore.wiring import on_done_of, start_arrivals
from tests.helpers import policy_id
from tests.test_fastpath import OTHER_POLICIES, POLICIES, ROOFLINE, assert_identical
from tests.test_properties import random_specs

THRESHOLDS = {"waiting_per_replica": (1.0, 0.2), "running_per_replica": (3.0, 1.0), "kv_usage": (0.5, 0.1),
              "ttft_p99_s": (0.05, 0.01)}


def run_both(policy, router, specs, cost, scaling: AutoscalingLimits, gateway=None, closed=None, num_gpu_blocks=40):
    """The SimPy autoscaled cluster as experiments.simulate wires it, and the fast one: (tables, tables, scaler)."""
    limits = EngineLimits(num_gpu_blocks, 16, 8192 if cost is ONE_SECOND else 512, gateway=gateway)
    n = scaling.max_replicas
    env, log = simpy.Environment(), EngineLog()
    engines = [Engine(env, policy, cost, limits, log, replica_id=i) for i in range(n)]
    scaler = AutoscaledCluster(engines, router, scaling, len(specs))
    start_arrivals(env, specs, scaler.submit, on_done_of(engines), closed)
    env.run()
    fast_cluster = FastCluster(policy, cost, limits, specs, router, n, closed, record_events=True, autoscaling=scaling)
    fast = fast_cluster.simulate()
    fast_scaler = fast_cluster.cluster
    assert fast.events == log.events
    assert scaler.routed_to == fast_scaler.routed_to
    assert scaler.events == fast_scaler.events
    assert (scaler.gpu_s, scaler.end_s) == (fast_scaler.gpu_s, fast_scaler.end_s)
    return ((requests_frame(log), iterations_frame(log), log.itl_gaps_s),
            (requests_table(fast), iterations_table(fast), (fast.itl_values_s, fast.itl_counts)), fast_scaler)


ONE_SECOND = ConstantCost(1.0)


def test_a_replica_serves_only_after_its_startup_on_the_fast_path():
    # tests/test_autoscaling.py's timeline: replica 1 starts at the 1.25 s look and serves from 3.85
    specs = [RequestSpec(0, 0.0, 16, 3), RequestSpec(1, 0.1, 16, 3), RequestSpec(2, 0.2, 16, 3),
             RequestSpec(3, 2.0, 16, 3), RequestSpec(4, 4.0, 16, 3)]
    scaling = AutoscalingLimits(1, 2, "waiting_per_replica", 1.5, -1.0, startup_s=2.6, interval_s=1.25, cooldown_s=0.0)
    plain, fast, scaler = run_both(Continuous(max_num_seqs=1, max_num_batched_tokens=64), LeastOutstanding(), specs,
                                   ONE_SECOND, scaling, num_gpu_blocks=1000)
    assert_identical(plain, fast, 2000)
    assert scaler.events == [ScalingEvent(0.0, 0, "serve"), ScalingEvent(1.25, 1, "start"),
                             ScalingEvent(3.85, 1, "serve")]
    assert list(zip(fast[0].replica_id, fast[0].first_token_s, fast[0].finish_s)) == [
        (0, 1.0, 3.0), (0, 4.0, 6.0), (0, 7.0, 9.0), (0, 10.0, 12.0), (1, 5.0, 7.0)]
    assert scaler.gpu_s == pytest.approx([12.5, 12.5 - 1.25])


@pytest.mark.parametrize("policy", [POLICIES[2], POLICIES[4], POLICIES[0], OTHER_POLICIES[0], OTHER_POLICIES[5]],
                         ids=policy_id)
def test_fast_autoscaling_matches_the_simpy_engine(policy):
    kinds = set()
    for seed in range(2):
        for signal, (up, down) in THRESHOLDS.items():
            for gateway in (None, GatewayLimits(max_waiting=4, max_queue_s=0.1, client_timeout_s=0.15)):
                for closed in (None, (6, 0.05)):
                    router = ROUTERS["least_outstanding" if seed else "round_robin"]()
                    scaling = AutoscalingLimits(1, 3, signal, up, down, startup_s=0.05, interval_s=0.02,
                                                cooldown_s=0.03)
                    plain, fast, scaler = run_both(policy, router, random_specs(seed), ConstantCost(0.01, 1e-4),
                                                   scaling, gateway, closed)
                    assert_identical(plain, fast, 120)
                    kinds |= {e.kind for e in scaler.events}
    assert kinds == {"start", "serve", "drain", "leave"}   # scaled up (after start-up) and down (drained)


def test_fast_autoscaling_under_the_roofline_model():
    for seed in range(3):
        scaling = AutoscalingLimits(1, 4, "kv_usage", 0.4, 0.1, startup_s=0.02, interval_s=0.01, cooldown_s=0.02)
        plain, fast, _ = run_both(POLICIES[2], ROUTERS["least_kv_usage"](), random_specs(seed), ROOFLINE, scaling)
        assert_identical(plain, fast, 160)


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm", "profile": "constant:per_step_s=0.01",
        "engine": {"policy": "chunked_prefill", "max_num_seqs": 4},
        "workload": {"num_requests": 200, "arrival": {"process": "poisson",
                                                       "rate_per_s": {"spike": {"base": 5, "peak": 60, "start_s": 5,
                                                                                "duration_s": 5}}},
                     "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 20}},
        "slo": {"ttft_ms": 1000}, "gateway": {"max_waiting": 12, "client_timeout_s": 3},
        "autoscaling": {"min_replicas": 1, "max_replicas": 4, "signal": "waiting_per_replica", "scale_up_above": 2,
                        "scale_down_below": 0.5, "interval_s": 1, "cooldown_s": 2, "gpu_price_per_hour": 3.6}}


@pytest.mark.parametrize("signal", ["waiting_per_replica", "ttft_p99_s"])
def test_an_autoscaled_sweep_point_runs_on_the_fast_path_with_identical_results(signal):
    cfg = copy.deepcopy(BASE)
    if signal == "ttft_p99_s":
        cfg["autoscaling"].update(signal=signal, scale_up_above=0.3, scale_down_below=0.05, window_s=5)
    assert fast_path_reason(resolve_point(copy.deepcopy(cfg)), []) is None
    a, b = (simulate({**copy.deepcopy(cfg), "engine": {**cfg["engine"], "fast_path": mode}}, seed=0)
            for mode in ("off", "on"))
    for x, y in ((a.requests, b.requests), (a.iterations, b.iterations), (a.replicas, b.replicas)):
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert list(a.summary) == list(b.summary)
    assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
    assert b.summary["num_scale_ups"] >= 1 and b.summary["replicas_peak"] >= 2


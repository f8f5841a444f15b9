"""A cluster on the fast path (simcore/fast/cluster.py) against the SimPy cluster (simcore/cluster.py): the
same routing, per-request rows, iteration rows in the same order, ITL samples and summaries, bitwise, for
every router, open and closed loop, and ties (equal-time events of different replicas)."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import simpy

from experiments.fast import iterations_table, requests_table
from experiments.simulate import simulate
from policies.routers import ROUTERS, LengthSplit, PrefixAffinity, VllmDP
from simcore.cluster import Cluster
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.fast.cluster import FastCluster
from simcore.log import EngineLog
from simcore.metrics import iterations_frame, requests_frame
from simcore.wiring import on_done_of, start_arrivals
from simcore.request import RequestSpec
from tests.test_fastpath import (OTHER_POLICIES, POLICIES, ROOFLINE, assert_identical, with_priorities,
                                 with_shared_prefixes)
from tests.helpers import policy_id
from tests.test_properties import random_specs

CONSTANT = ConstantCost(0.01, 1e-4)


def run_both(policy, router, specs, cost, num_replicas, num_gpu_blocks=40, closed=None, block_size=16,
             **engine):
    """The SimPy cluster as experiments.simulate wires it, and the fast cluster: (tables, tables, routing)."""
    limits = EngineLimits(num_gpu_blocks, block_size, 512, **engine)
    env, log = simpy.Environment(), EngineLog()
    engines = [Engine(env, policy, cost, limits, log, replica_id=i) for i in range(num_replicas)]
    cluster = Cluster(engines, router)
    start_arrivals(env, specs, cluster.submit, on_done_of(engines), closed)
    env.run()
    fast_cluster = FastCluster(policy, cost, limits, specs, router, num_replicas, closed, record_events=True)
    fast = fast_cluster.simulate()
    assert fast.events == log.events
    if limits.enable_prefix_caching:
        for a, b in zip((e.prefix_cache for e in engines), fast_cluster.prefix_caches):
            assert (a.num_hit_tokens, a.num_evicted_blocks, a.cached_tokens_by_request) == \
                   (b.num_hit_tokens, b.num_evicted_blocks, b.cached_tokens_by_request)
    assert cluster.routed_to == fast_cluster.cluster.routed_to
    return ((requests_frame(log), iterations_frame(log), log.itl_gaps_s),
            (requests_table(fast), iterations_table(fast), (fast.itl_values_s, fast.itl_counts)))


@pytest.mark.parametrize("router", ROUTERS.values(), ids=lambda r: r.name)
@pytest.mark.parametrize("policy", [POLICIES[2], POLICIES[4], OTHER_POLICIES[0], OTHER_POLICIES[5]],
                         ids=policy_id)
@pytest.mark.parametrize("closed", [None, (6, 0.0), (6, 0.05)], ids=["open", "closed", "think"])
def test_fast_cluster_matches_the_simpy_cluster(router, policy, closed):
    for seed in range(3):
        for cost in (CONSTANT, ROOFLINE):
            specs = with_priorities(random_specs(seed), seed)
            plain, fast = run_both(policy, router(), specs, cost, 3, closed=closed)
            assert_identical(plain, fast, 3 * 40)
            assert plain[0].replica_id.nunique() > 1 or router is LengthSplit


@pytest.mark.parametrize("policy", POLICIES + OTHER_POLICIES, ids=policy_id)
def test_fast_cluster_breaks_ties_as_simpy_does(policy):
    # Equal-time events of different replicas everywhere: identical requests and one-second steps keep the
    # replicas in lock step, arrivals land on step ends, and closed-loop users send when requests end.
    rng = np.random.default_rng(7)
    grid = [RequestSpec(i, 0.5 * int(t), int(p), int(o), int(o)) for i, (t, p, o) in
            enumerate(zip(np.sort(rng.integers(0, 40, 30)), rng.integers(1, 60, 30), rng.integers(1, 12, 30)))]
    same = [RequestSpec(i, 0.25, 32, 8, 8) for i in range(24)]
    for router in (ROUTERS["round_robin"](), ROUTERS["least_outstanding"]()):
        for specs, closed in ((grid, None), (same, None), (same, (6, 0.0)), (same, (7, 1.0))):
            plain, fast = run_both(policy, router, specs, ConstantCost(1.0), 3, num_gpu_blocks=30, closed=closed,
                                   block_size=4)
            assert_identical(plain, fast, 3 * 30)


def test_fast_cluster_with_prefix_caching_and_swap():
    hits = 0
    for seed in range(3):
        specs = with_shared_prefixes(random_specs(seed), seed)
        plain, fast = run_both(POLICIES[4], PrefixAffinity(balance_abs_threshold=4), specs, CONSTANT, 3,
                               enable_prefix_caching=True)
        assert_identical(plain, fast, 3 * 40)
        hits += int(plain[1].prefill_tokens.sum() < sum(s.num_prompt_tokens for s in specs[:-1]))
        plain, fast = run_both(POLICIES[2], ROUTERS["least_kv_usage"](), random_specs(seed), CONSTANT, 2,
                               preemption_mode="swap", num_swap_blocks=12, kv_bytes_per_token=100_000,
                               host_link_bytes_per_s=1e9)
        assert_identical(plain, fast, 2 * 40)
    assert hits > 0


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm",
        "workload": {"num_requests": 300, "arrival": {"process": "poisson", "rate_per_s": 60.0},
                     "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 1.0, "max": 8000},
                     "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 1024}}}


@pytest.mark.parametrize("cluster", [{"num_replicas": 4, "router": "least_outstanding"},
                                     {"num_replicas": 2, "router": "length_split", "by": "prompt_tokens",
                                      "threshold_tokens": 800}], ids=lambda c: c["router"])
def test_simulate_runs_a_cluster_on_the_fast_path_with_identical_results(cluster):
    for engine in ({"policy": "chunked_prefill", "max_num_batched_tokens": 512, "num_gpu_blocks": 300},
                   {"policy": "static", "max_num_seqs": 16, "batch_timeout_s": 0.2}):
        a = simulate({**BASE, "cluster": cluster, "engine": {**engine, "fast_path": "off"}}, seed=1)
        b = simulate({**BASE, "cluster": cluster, "engine": {**engine, "fast_path": "on"}}, seed=1)
        for x, y in ((a.requests, b.requests), (a.iterations, b.iterations), (a.replicas, b.replicas)):
            pd.testing.assert_frame_equal(x, y, check_exact=True)
        assert list(a.summary) == list(b.summary)
        assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
        assert b.summary["num_replicas"] == cluster["num_replicas"]


def test_a_cluster_sweep_point_runs_on_the_fast_path_by_default():
    from experiments.config import resolve_point
    from experiments.fast import fast_path_reason
    cfg = resolve_point({**BASE, "cluster": {"num_replicas": 2}})
    assert fast_path_reason(cfg, []) is None


HELD_SEEN = []   # the routers below are deep-copied by each cluster: what they saw goes here


@dataclass(frozen=True)
class WatchedVllmDP(VllmDP):
    def route(self, spec, replicas, num_routed):
        HELD_SEEN.append(sum(r.num_held for r in replicas))
        return super().route(spec, replicas, num_routed)


@pytest.mark.parametrize("version", ["0.19.0", "0.32.0"])
def test_fast_cluster_routes_as_vllms_dp_front_end_with_arrivals_held_by_async_scheduling(version):
    """vLLM 0.27+'s DP front end counts the requests it sent and has not seen finish, those an engine holds
    until its step ends included (ReplicaLoad.num_held): both clusters see the same counts."""
    HELD_SEEN.clear()
    for seed in range(3):
        plain, fast = run_both(POLICIES[2], WatchedVllmDP(vllm_version=version), random_specs(seed), ROOFLINE, 3,
                               async_scheduling=True)
        assert_identical(plain, fast, 3 * 40)
    assert max(HELD_SEEN) > 0

"""Routers decide from load snapshots; the cluster runs N replicas in one simulation."""
from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest
import simpy

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate
from policies import ChunkedPrefill
from policies.routers import LeastKVUsage, LeastOutstanding, LengthSplit, PrefixAffinity, RoundRobin, VllmDP
from simcore.arrivals import open_loop
from simcore.cluster import Cluster, ReplicaLoad
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.log import EngineLog
from simcore.metrics import requests_frame
from simcore.request import RequestSpec


def load(i, waiting=0, running=0, used=0, total=100, cached=0, held=0):
    return ReplicaLoad(i, waiting, running, used, total, cached, held)


SPEC = RequestSpec(0, 0.0, 100, 10, max_new_tokens=64)


def test_round_robin_ignores_load():
    loads = [load(0, waiting=9), load(1), load(2)]
    assert [RoundRobin().route(SPEC, loads, k) for k in range(5)] == [0, 1, 2, 0, 1]


def test_least_outstanding_and_least_kv():
    loads = [load(0, waiting=2, running=1, used=10), load(1, running=2, used=90), load(2, waiting=1, running=2, used=5)]
    assert LeastOutstanding().route(SPEC, loads, 0) == 1
    assert LeastKVUsage().route(SPEC, loads, 0) == 2
    assert LeastOutstanding().route(SPEC, [load(0, 1), load(1, 1)], 0) == 0  # ties: lowest index


def test_prefix_affinity_prefers_longest_cached_prefix_until_imbalanced():
    loads = [load(0, running=3), load(1, running=5, cached=64), load(2, running=1, cached=32)]
    assert PrefixAffinity().route(SPEC, loads, 0) == 1
    assert PrefixAffinity(balance_abs_threshold=3).route(SPEC, loads, 0) == 2  # gap 4 > 3: least loaded
    assert PrefixAffinity().route(SPEC, [load(0, running=2), load(1, running=1)], 0) == 1  # no hit anywhere


def test_length_split_pools():
    loads = [load(0, running=5), load(1, running=2), load(2, running=1), load(3, running=3)]
    r = LengthSplit(threshold_tokens=1000, num_long_replicas=2)
    long_spec = RequestSpec(1, 0.0, 100, 1500, max_new_tokens=2048)
    assert r.route(long_spec, loads, 0) == 1 and r.route(SPEC, loads, 0) == 2
    assert r.route(RequestSpec(2, 0.0, 100, 10), loads, 0) == 1  # no max_tokens: may be long
    assert LengthSplit(threshold_tokens=50, by="output_tokens").route(SPEC, loads, 0) == 2
    assert LengthSplit(threshold_tokens=50, by="prompt_tokens").route(SPEC, loads, 0) == 0
    with pytest.raises(ValueError, match="cluster.by"):
        LengthSplit(by="words")


def run_cluster(router, specs, n=3, caching=False):
    env = simpy.Environment()
    log = EngineLog()
    limits = EngineLimits(1000, 16, 8192, enable_prefix_caching=caching)
    engines = [Engine(env, ChunkedPrefill(), ConstantCost(1.0), limits, log, replica_id=i) for i in range(n)]
    cluster = Cluster(engines, router)
    env.process(open_loop(env, specs, cluster.submit))
    env.run()
    return requests_frame(log), cluster


def test_cluster_round_robin_timeline():
    specs = [RequestSpec(i, 0.5 * i, 20, 2) for i in range(6)]
    df, cluster = run_cluster(RoundRobin(), specs)
    assert df.replica_id.tolist() == [0, 1, 2, 0, 1, 2] and list(cluster.routed_to) == [0, 1, 2, 0, 1, 2]
    assert df.first_token_s.tolist() == [1.0, 1.5, 2.0, 3.0, 3.5, 4.0]  # first token after one 1 s step


def test_cluster_prefix_affinity_follows_the_cache():
    ids = tuple(range(8))
    specs = [RequestSpec(0, 0.0, 200, 2, prefix_block_ids=ids), RequestSpec(1, 0.1, 10, 2),
             RequestSpec(2, 5.0, 200, 2, prefix_block_ids=ids)]
    df, _ = run_cluster(PrefixAffinity(), specs, caching=True)
    assert df.replica_id.tolist() == [0, 1, 0]  # request 2 goes where request 0's prefix is cached
    df, _ = run_cluster(LeastOutstanding(), specs, caching=True)
    assert df.replica_id.tolist() == [0, 1, 0]
    df, _ = run_cluster(RoundRobin(), specs, caching=True)
    assert df.replica_id.tolist() == [0, 1, 2]


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm",
        "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": 20},
                     "prompt_tokens": {"dist": "uniform", "min": 10, "max": 300},
                     "output_tokens": {"dist": "uniform", "min": 1, "max": 40}}}


def test_simulate_cluster_summary_and_replicas():
    res = simulate({**BASE, "cluster": {"num_replicas": 4, "router": "least_outstanding"}})
    s = res.summary
    assert s["num_replicas"] == 4 and s["router"] == "least_outstanding" and s["num_finished"] == 40
    assert res.replicas.num_requests.sum() == 40 and len(res.replicas) == 4
    assert s["replica_requests_max"] >= s["replica_requests_min"] >= 1
    assert res.resolved["cluster"]["router"] == "least_outstanding"
    one = simulate(BASE)
    assert one.replicas is None and "num_replicas" not in one.summary


@pytest.mark.parametrize("cluster,msg", [
    ({"num_replicas": 0}, "cluster.num_replicas"),
    ({"num_replicas": 2, "router": "random"}, "cluster.router: unknown router 'random'"),
    ({"num_replicas": 2, "router": "round_robin", "threshold_tokens": 5}, "cluster.threshold_tokens: not a knob"),
    ({"num_replicas": 2, "router": "length_split", "num_long_replicas": 2}, "cluster.num_long_replicas"),
    ({"num_replicas": 2, "router": "vllm_dp", "stats_interval_s": 0}, "cluster.stats_interval_s: expected"),
    ({"num_replicas": 2, "router": "vllm_dp", "_published": {}}, "cluster._published: not a knob"),
    ({"num_replicas": 2, "router": "vllm_dp", "vllm_version": 0.19}, "cluster.vllm_version: expected a release as a"),
    ({"num_replicas": 2, "router": "vllm_dp", "waiting_weight": 2.0},
     "cluster.waiting_weight: vLLM 0.32.0's front end has no waiting weight"),
    ({"num_replicas": 2, "router": "vllm_dp", "vllm_version": "0.19.0", "waiting_weight": "x"},
     "cluster.waiting_weight: expected a number"),
    ({"num_replicas": 2, "router": "vllm_dp", "counts_published": "yes"}, "cluster.counts_published: expected true"),
])
def test_cluster_config_errors(cluster, msg):
    with pytest.raises(ConfigError, match=msg):
        resolve_point({**BASE, "cluster": cluster})


def test_vllm_dp_before_0_27_scores_the_published_counts_and_its_own_sends_since():
    """vLLM 0.19's front end reads its DP ranks' counts from the coordinator's snapshot (every 0.1 s) and
    counts each request it sends as one more waiting there, x 4, until the next: a burst alternates between
    two ranks 2 running requests apart, where the exact least-outstanding sends it all to the emptier one."""
    router = VllmDP(vllm_version="0.19.0")
    burst = [RequestSpec(k, 0.01 * k, 100, 10) for k in range(4)]
    frozen = [load(0, running=10), load(1, running=12)]   # the replicas as the burst finds them
    assert [router.route(spec, frozen, k) for k, spec in enumerate(burst)] == [0, 1, 0, 1]
    assert [LeastOutstanding().route(spec, frozen, k) for k, spec in enumerate(burst)] == [0, 0, 0, 0]
    # the next interval: a fresh snapshot, where replica 1 has emptied
    later = RequestSpec(9, 0.15, 100, 10)
    assert router.route(later, [load(0, running=12), load(1, running=3)], 4) == 1
    # waiting requests weigh 4 times: 1 waiting and 9 running (13) loses to 12 running
    assert VllmDP(vllm_version="0.19.0").route(SPEC, [load(0, waiting=1, running=9), load(1, running=12)], 0) == 1


def test_vllm_dp_ties_go_to_the_lowest_rank_before_0_25_and_rotate_after():
    idle = [load(0), load(1), load(2)]
    burst = [RequestSpec(k, 0.0, 100, 10) for k in range(6)]
    for version, expected in (("0.24.0", [0, 1, 2, 0, 1, 2]), ("0.25.0", [0, 1, 2, 0, 1, 2])):
        router = VllmDP(vllm_version=version)
        assert [router.route(spec, idle, k) for k, spec in enumerate(burst)] == expected
    # two ranks tied in the snapshot after a send each: 0.24 scans from rank 0, 0.25 from the rotated start
    tied = [load(0, running=5), load(1, running=5)]
    old, new = VllmDP(vllm_version="0.24.0"), VllmDP(vllm_version="0.25.0")
    assert [old.route(spec, tied, k) for k, spec in enumerate(burst[:2])] == [0, 1]
    assert old.route(RequestSpec(7, 0.2, 100, 10), tied, 2) == 0          # fresh snapshot: rank 0 again
    assert [new.route(spec, tied, k) for k, spec in enumerate(burst[:2])] == [0, 1]
    assert new.route(RequestSpec(7, 0.2, 100, 10), tied, 2) == 0          # the start has come round to 0
    assert new.route(RequestSpec(8, 0.3, 100, 10), tied, 3) == 1          # and moves on: rank 1 wins the tie


def test_vllm_dp_from_0_27_takes_its_own_in_flight_count_and_the_kv_pressure_of_a_queue():
    router = VllmDP(vllm_version="0.27.0")
    # the snapshot says rank 0 is empty, but this front end has 6 requests in flight there (sent since)
    assert router.route(SPEC, [load(0, held=6), load(1, running=4)], 0) == 1
    # a queue weighs by KV pressure: 3 waiting + 5 running on a 90%-full pool scores 8 + 3 x 6 x 0.4 = 15.2
    router = VllmDP(vllm_version="0.27.0")
    assert router.route(SPEC, [load(0, waiting=3, running=5, used=90), load(1, running=14)], 0) == 1
    router = VllmDP(vllm_version="0.27.0")   # at half full and below it weighs nothing: 8 against 9
    assert router.route(SPEC, [load(0, waiting=3, running=5, used=50), load(1, running=9)], 0) == 0
    router = VllmDP(vllm_version="0.26.0")   # before 0.27: 3 x 4 + 5 = 17 against 14
    assert router.route(SPEC, [load(0, waiting=3, running=5, used=50), load(1, running=14)], 0) == 1


def test_a_vllm_dp_router_runs_the_engines_release_unless_it_names_one():
    dp = {"num_replicas": 2, "router": "vllm_dp"}
    engine = {"policy": "chunked_prefill", "vllm_version": "0.19.0"}
    assert resolve_point({**BASE, "cluster": dp}).cluster.router.vllm_version == "0.32.0"
    routed = resolve_point({**BASE, "engine": engine, "cluster": dp}).cluster.router
    assert (routed.vllm_version, routed.waiting_weight) == ("0.19.0", 4.0)
    named = resolve_point({**BASE, "engine": engine, "cluster": {**dp, "vllm_version": "0.30.0"}}).cluster.router
    assert (named.vllm_version, named.waiting_weight) == ("0.30.0", None)


def test_a_dense_models_dp_ranks_publish_no_counts_from_vllm_0_14_to_0_26():
    """vLLM 0.14-0.26 run a dense model's DP ranks as engines that publish no request counts: its front end
    routes on zeros its coordinator republishes every 5 s and its own sends since, blind to load."""
    dp = {"num_replicas": 2, "router": "vllm_dp"}
    def published(model, version, **knobs):
        engine = {"policy": "chunked_prefill", "vllm_version": version}
        return resolve_point({**BASE, "model": model, "engine": engine, "cluster": {**dp, **knobs}}
                             ).cluster.router.counts_published
    assert [published("llama-3-8b", v) for v in ("0.13.0", "0.14.0", "0.19.0", "0.26.0", "0.27.0")] == \
        [True, False, False, False, True]
    assert published("mistralai/Mixtral-8x7B-v0.1", "0.19.0") is True     # MoE ranks always publish
    assert published("llama-3-8b", "0.19.0", counts_published=True) is True   # a file may say otherwise
    router = VllmDP(vllm_version="0.19.0", counts_published=False)
    busy = [load(0, waiting=30, running=100), load(1)]                   # rank 0 far busier: not seen
    assert [router.route(RequestSpec(k, 0.5 * k, 100, 10), busy, k) for k in range(9)] == [0, 1] * 4 + [0]
    # the 5 s republish of zeros: the scan starts over at rank 0 although rank 0 had one send more
    assert [router.route(RequestSpec(k, 5.0 + 0.5 * k, 100, 10), busy, k) for k in range(3)] == [0, 1, 0]


def test_vllm_dp_chooses_as_vllms_own_front_end_does():
    """vLLM's `DPLBAsyncMPClient.get_core_engine_for_request` (the installed release, 0.27 or later) and the
    router, fed the same coordinator snapshots, sends and finishes, choose the same rank every time."""
    core_client = pytest.importorskip("vllm.v1.engine.core_client")
    import vllm
    version = vllm.__version__.split("+")[0]
    router = VllmDP(vllm_version=version)
    if not router.vllm_rules.dp_inflight_score:
        pytest.skip(f"vLLM {version} scores waiting x 4 + running")
    rng = random.Random(7)
    n = 4
    client = object.__new__(core_client.DPLBAsyncMPClient)
    client.client_count, client.eng_start_index, client.reqs_in_flight = 1, 0, {}
    client.core_engines = [bytes([i, 0]) for i in range(n)]
    client.engine_inflight = Counter()
    in_flight = [set() for _ in range(n)]   # what each rank has of the requests sent and not finished
    checked = 0
    for k in range(3000):
        for rank in range(n):               # some finish
            for rid in [r for r in in_flight[rank] if rng.random() < 0.05]:
                in_flight[rank].discard(rid)
                client.engine_inflight[client.reqs_in_flight.pop(rid)] -= 1
        t = k * 0.03                        # a new snapshot every ~3-4 arrivals
        loads = []
        for rank in range(n):               # the ranks as they are now: of what is in flight, some wait
            total = len(in_flight[rank])
            running = rng.randint(0, total)
            waiting = rng.randint(0, total - running)
            loads.append(load(rank, waiting, running, used=rng.randint(0, 100), held=total - running - waiting))
        if int(t // 0.1) != router._published.get("interval"):
            client.lb_engines = [[r.num_waiting, r.num_running, r.kv_usage] for r in loads]
        rid = str(k)
        request = SimpleNamespace(request_id=rid, data_parallel_rank=None, pooling_params=None)
        theirs = client.core_engines.index(client.get_core_engine_for_request(request))
        ours = router.route(RequestSpec(k, t, 100, 10), loads, k)
        assert ours == theirs, f"request {k}"
        in_flight[ours].add(rid)
        checked += 1
    assert checked == 3000


def test_each_cluster_routes_with_a_fresh_copy_of_a_router_that_remembers():
    """Two runs from one configured router: the second does not start from the first's snapshot."""
    router = VllmDP()
    env = simpy.Environment()
    engines = [Engine(env, ChunkedPrefill(), ConstantCost(0.01, 0.0), EngineLimits(100, 16, 4096), EngineLog(),
                      replica_id=i) for i in range(2)]
    first, second = Cluster(engines, router), Cluster(engines, router)
    assert [first.route(RequestSpec(k, 0.0, 100, 10)) for k in range(3)] == [0, 1, 0]
    assert second.route(RequestSpec(3, 0.0, 100, 10)) == 0   # its own snapshot: nothing sent yet
    assert router._published == {}                            # the configured one is never used


def test_vllm_dp_is_not_a_decode_pools_router():
    with pytest.raises(ConfigError, match="disaggregation.decode_router: vllm_dp routes at a request's arrival"):
        resolve_point({**BASE, "disaggregation": {"num_prefill_replicas": 1, "num_decode_replicas": 2,
                                                  "decode_router": "vllm_dp"}})

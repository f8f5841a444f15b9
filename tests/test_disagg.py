"""Prefill/decode disaggregation: exact timelines with a constant-cost stub and a known link, KV accounting on
both pools, whole runs through `simulate`, and strict configuration errors."""
from __future__ import annotations

import pandas as pd
import pytest
import simpy

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate
from policies import ChunkedPrefill, Continuous
from policies.routers import RoundRobin
from simcore.arrivals import open_loop
from simcore.costmodel import ConstantCost
from simcore.disagg import DisaggregatedCluster, KVLink
from simcore.engine import Engine, EngineLimits, SimulationError
from simcore.log import EngineLog
from simcore.metrics import goodput_stats, meets_slo, requests_frame
from simcore.request import RequestSpec


def run(specs, *, mode="prefill", prefill_blocks=1000, decode_blocks=1000, link=KVLink(1000.0, 0.5),
        kv_bytes_per_token=10, policy=None, num_prefill=1, num_decode=1, max_num_seqs=None):
    env = simpy.Environment()
    log = EngineLog()
    policy = policy or ChunkedPrefill()
    prefill = [Engine(env, policy, ConstantCost(1.0), EngineLimits(prefill_blocks, 16, 8192,
                                                                   handoff_after_first_token=True), log, replica_id=i)
               for i in range(num_prefill)]
    decode = [Engine(env, policy, ConstantCost(1.0), EngineLimits(decode_blocks, 16, 8192), log,
                     replica_id=num_prefill + i) for i in range(num_decode)]
    cluster = DisaggregatedCluster(env, prefill, decode, RoundRobin(), RoundRobin(), link, kv_bytes_per_token,
                                   mode, max_num_seqs)
    cluster.chain_on_done(None)
    env.process(open_loop(env, specs, cluster.submit))
    env.run()
    return requests_frame(log), log, cluster


TWO = [RequestSpec(0, 0.0, 100, 3), RequestSpec(1, 0.0, 50, 2)]


def test_timeline_first_token_from_prefill():
    # t=0-1: both prompts in one prefill step; first tokens at 1.0 on the prefill replica. The link sends
    # one KV at a time: request 0 (100 tokens x 10 B at 1000 B/s + 0.5 s) 1.0-2.5, request 1 2.5-3.5.
    # Decode replica: request 0 decodes 2.5-3.5 (token 2) and 3.5-4.5 (token 3, done); request 1 arrives
    # at 3.5, just after the decode replica started its 3.5 step, so its token 2 comes 4.5-5.5.
    df, log, cluster = run(TWO)
    assert cluster.handoffs == [(0, 0, 1, 1.0, 1.0, 1.0, 2.5, 1000), (1, 0, 1, 1.0, 1.0, 2.5, 3.5, 500)]
    assert df.replica_id.tolist() == [1, 1]
    assert df.first_token_s.tolist() == [1.0, 1.0] and df.finish_s.tolist() == [4.5, 5.5]
    assert df.ttft_s.tolist() == [1.0, 1.0] and df.tpot_s.tolist() == [1.75, 4.5]
    assert log.itl_gaps_s == [2.5, 1.0, 4.5]  # the transfer delays the second token
    assert [(r[0], r[2], r[3], r[5], r[-1]) for r in log.iterations] == [  # start, prefill, decode, seqs, replica
        (0.0, 150, 0, 2, 0), (2.5, 0, 1, 1, 1), (3.5, 0, 1, 1, 1), (4.5, 0, 1, 1, 1)]


def test_timeline_first_token_from_decode():
    # The decode replica recomputes the last prompt token (a 1-token step over 99 cached) and samples the
    # first token itself: TTFT = prefill + transfer + that step.
    df, log, cluster = run(TWO, mode="decode")
    assert [h[5:7] for h in cluster.handoffs] == [(1.0, 2.5), (2.5, 3.5)]
    assert df.first_token_s.tolist() == [3.5, 5.5] and df.finish_s.tolist() == [5.5, 6.5]
    assert df.ttft_s.tolist() == [3.5, 5.5] and log.itl_gaps_s == [1.0, 1.0, 1.0]
    assert [(r[0], r[2], r[3]) for r in log.iterations] == [
        (0.0, 150, 0), (2.5, 1, 0), (3.5, 0, 1), (4.5, 1, 1), (5.5, 0, 1)]


def test_prefill_side_frees_kv_only_after_the_transfer():
    # 10 prefill blocks hold one 100-token prompt (7 blocks) at a time. Request 0's KV leaves over a slow
    # link (0.5 + 1000/200 = 5.5 s), so request 1 waits for its release at 6.5 before its prefill 6.5-7.5.
    df, log, cluster = run(TWO, prefill_blocks=10, link=KVLink(200.0, 0.5))
    assert df.first_token_s.tolist() == [1.0, 7.5]
    assert [h[5:7] for h in cluster.handoffs] == [(1.0, 6.5), (7.5, 10.5)]
    prefill_rows = [r for r in log.iterations if r[-1] == 0]
    assert [(r[0], r[9]) for r in prefill_rows] == [(0.0, 7), (6.5, 4)]  # blocks held at each step's end
    assert all(e.pool.num_used_blocks == 0 for e in cluster.prefill + cluster.decode)


def test_decode_side_allocates_on_transfer_and_queues_when_full():
    # 9 decode blocks: request 0 holds 7 (100 prompt + up to 3 tokens); request 1 (50 tokens + 1, 4 blocks)
    # waits in the decode replica's queue until request 0 finishes at 4.5, then transfers 4.5-5.5.
    df, log, cluster = run(TWO, decode_blocks=9)
    assert cluster.handoffs[1][4:7] == (4.5, 4.5, 5.5)  # allocated, started, ended
    assert df.finish_s.tolist() == [4.5, 6.5]
    assert df.tpot_s.tolist() == [1.75, 5.5]
    assert max(r[9] for r in log.iterations if r[-1] == 1) <= 9


def test_decode_sequence_cap_holds_transfers_back():
    df, _, cluster = run(TWO, max_num_seqs=1)
    assert cluster.handoffs[1][4] == 4.5  # request 1 waits for request 0 to leave the decode batch
    assert df.status.tolist() == ["finished", "finished"]


def test_one_token_outputs_never_leave_the_prefill_pool():
    df, _, cluster = run([RequestSpec(0, 0.0, 40, 1), RequestSpec(1, 0.0, 40, 2)])
    assert df.replica_id.tolist() == [0, 1] and [h[0] for h in cluster.handoffs] == [1]
    assert df.finish_s.tolist() == pytest.approx([1.0, 2.9])  # transfer 0.5 + 0.4 s (1.0-1.9), one decode step


def test_kv_that_never_fits_a_decode_replica_is_an_error():
    with pytest.raises(SimulationError, match="cannot be received"):
        run([RequestSpec(0, 0.0, 200, 3)], decode_blocks=5)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("policy", [ChunkedPrefill(max_num_batched_tokens=64, max_num_seqs=8),
                                    Continuous(max_num_batched_tokens=512, max_num_seqs=8)])
def test_random_workloads_finish_with_kv_invariants(mode, policy):
    import numpy as np
    rng = np.random.default_rng(3)
    specs = [RequestSpec(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(0.3, 60)), rng.integers(1, 300, 60), rng.integers(1, 40, 60)))]
    df, log, cluster = run(specs, mode=mode, policy=policy, prefill_blocks=40, decode_blocks=30, num_prefill=2,
                           num_decode=3, link=KVLink(5e4, 0.01), max_num_seqs=8)
    assert len(df) == 60 and set(df.status) == {"finished"}
    assert all(e.pool.num_used_blocks == 0 and not e.sending and not e.receiving
               for e in cluster.prefill + cluster.decode)
    decode_ids = {e.replica_id for e in cluster.decode}
    assert df[df.output_tokens > 1].replica_id.isin(decode_ids).all()  # invariants were checked per iteration


# ---- through simulate() ----

BASE = {"model": "llama-3-8b", "hardware": "h100-sxm",
        "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 30},
                     "prompt_tokens": {"dist": "uniform", "min": 10, "max": 2000},
                     "output_tokens": {"dist": "uniform", "min": 1, "max": 60}},
        "slo": {"ttft_ms": 300, "tpot_ms": 30}}
DISAGG = {"num_prefill_replicas": 2, "num_decode_replicas": 2, "link_bandwidth_gb_per_s": 25,
          "link_latency_s": 0.001}


def test_simulate_disaggregated_tables_and_goodput():
    res = simulate({**BASE, "disaggregation": DISAGG})
    s, req = res.summary, res.requests
    assert s["num_finished"] == 60 and s["num_gpus"] == 4 and s["num_prefill_replicas"] == 2
    assert s["num_kv_transfers"] == int((req.output_tokens > 1).sum())
    assert res.replicas.role.tolist() == ["prefill", "prefill", "decode", "decode"]
    assert res.replicas.num_requests.iloc[:2].sum() == 60
    assert set(res.iterations.role) == {"prefill", "decode"}
    moved = req[req.output_tokens > 1]
    assert moved.prefill_replica_id.isin([0, 1]).all() and moved.decode_replica_id.isin([2, 3]).all()
    kv_bytes = res.resolved["memory"]["kv_bytes_per_token"]
    expect = 1e-3 + moved.prompt_tokens * kv_bytes / 25e9
    assert (moved.kv_transfer_s - expect).abs().max() < 1e-12
    assert s["goodput_rps"] == pytest.approx(req.meets_slo.sum() / s["duration_s"])
    assert s["goodput_rps_per_gpu"] == pytest.approx(s["goodput_rps"] / 4)
    assert res.resolved["disaggregation"]["num_decode_replicas"] == 2


def test_simulate_same_seed_identical():
    a = simulate({**BASE, "disaggregation": DISAGG}, seed=5)
    b = simulate({**BASE, "disaggregation": DISAGG}, seed=5)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert a.summary.keys() == b.summary.keys()
    assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)  # NaN == NaN


def test_simulate_closed_loop_disaggregated():
    cfg = {**BASE, "workload": {**BASE["workload"], "arrival": {"process": "closed", "concurrency": 6}},
           "disaggregation": {**DISAGG, "first_token_from": "decode"}}
    assert simulate(cfg).summary["num_finished"] == 60


def test_meets_slo_per_request():
    df = pd.DataFrame({"status": ["finished", "finished", "finished", "rejected"], "ttft_s": [0.1, 0.5, 0.1, None],
                       "tpot_s": [0.01, 0.01, None, None], "e2e_s": [1.0, 1.0, 0.1, None]})
    good = meets_slo(df, ttft_ms=200, tpot_ms=20)
    assert good.tolist() == [True, False, True, False]  # one-token output: TPOT counts as 0
    assert goodput_stats(good, 2.0, 4) == {"slo_attainment": 0.5, "goodput_rps": 1.0, "goodput_rps_per_gpu": 0.25}


@pytest.mark.parametrize("extra,msg", [
    ({"disaggregation": {"num_prefill_replicas": 0, "num_decode_replicas": 2}}, "disaggregation.num_prefill_replicas"),
    ({"disaggregation": {"num_prefill_replicas": 1}}, "disaggregation.num_decode_replicas"),
    ({"disaggregation": {**DISAGG, "bandwidth": 5}}, "disaggregation.bandwidth: unknown key"),
    ({"disaggregation": {**DISAGG, "link_bandwidth_gb_per_s": 0}}, "disaggregation.link_bandwidth_gb_per_s"),
    ({"disaggregation": {**DISAGG, "link_latency_s": -1}}, "disaggregation.link_latency_s"),
    ({"disaggregation": {**DISAGG, "first_token_from": "client"}}, "disaggregation.first_token_from"),
    ({"disaggregation": {**DISAGG, "router": "random"}}, "disaggregation.router: unknown router"),
    ({"disaggregation": {**DISAGG, "decode_router": "prefix_affinity"}}, "disaggregation.decode_router"),
    ({"disaggregation": {"num_prefill_replicas": 1, "num_decode_replicas": 1, "router": "length_split"}},
     "disaggregation.router: length_split"),
    ({"disaggregation": DISAGG, "cluster": {"num_replicas": 2}}, "either cluster"),
    ({"disaggregation": DISAGG, "engine": {"policy": "tgi"}}, "engine.policy tgi is not supported"),
    ({"disaggregation": DISAGG, "engine": {"enable_prefix_caching": True}}, "enable_prefix_caching"),
    ({"disaggregation": [1, 2]}, "disaggregation: expected a mapping"),
    ({"slo": {"ttft_ms": 0}}, "slo.ttft_ms"),
    ({"slo": {"ttft_p99_ms": 5}}, "slo.ttft_p99_ms: unknown key"),
])
def test_config_errors(extra, msg):
    with pytest.raises(ConfigError, match=msg):
        resolve_point({**BASE, **extra})


# ---- the shipped comparison ----

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples"


def test_example_sweeps_compare_the_same_gpus():
    from experiments.config import expand, load_sweep_file
    disagg = expand(load_sweep_file(EXAMPLES / "disaggregation.yaml"))
    coloc = expand(load_sweep_file(EXAMPLES / "disaggregation_colocated.yaml"))
    assert {p.config.num_gpus for p in disagg + coloc} == {4}
    assert {p.config.slo for p in disagg} == {p.config.slo for p in coloc}
    rates = lambda pts: sorted({p.config.workload.arrival.rate_per_s for p in pts})  # noqa: E731
    assert rates(disagg) == rates(coloc)
    # the workload swept whole keeps each point's own rate (no aliasing between points)
    assert [p.raw["workload"]["arrival"]["rate_per_s"] for p in coloc[:3]] == [16, 24, 32]


def test_goodput_rate_interpolates_below_the_first_miss():
    import importlib.util
    spec = importlib.util.spec_from_file_location("plot_disaggregation", EXAMPLES / "plot_disaggregation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    curve = pd.DataFrame({"rate_per_gpu": [1, 2, 3, 4, 5], "slo_attainment": [1.0, 0.95, 0.85, 0.95, 0.2]})
    assert mod.max_rate_meeting(curve) == pytest.approx(2.5)  # 0.95 at 2, 0.85 at 3: 90% at 2.5; 4 ignored
    assert mod.max_rate_meeting(curve.assign(slo_attainment=0.5)) == 0.0
    assert mod.max_rate_meeting(curve.assign(slo_attainment=1.0)) == 5


def test_disaggregation_runs_on_the_fast_path_with_the_same_goodput():
    from experiments.fast import fast_path_reason
    cfg = resolve_point({**BASE, "disaggregation": DISAGG})
    assert fast_path_reason(cfg, []) is None   # simcore/fast/disagg.py; tests/test_fastdisagg.py: identical tables
    both = {**BASE, "disaggregation": DISAGG}
    fast = simulate(both)
    slow = simulate({**both, "engine": {**both.get("engine", {}), "fast_path": "off"}})
    assert fast.summary["goodput_rps"] == pytest.approx(slow.summary["goodput_rps"])
    assert fast.requests.meets_slo.tolist() == slow.requests.meets_slo.tolist()

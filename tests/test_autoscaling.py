"""Autoscaling (simcore/autoscaler.py) on exact timelines (1 s per step, computed by hand): a replica that
serves only after its start-up delay, a draining replica that takes no new work and leaves with its last
request; the sweep file's strict `autoscaling:` section and the results it adds."""
from __future__ import annotations

import copy

import pytest
import simpy

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate
from policies import Continuous
from policies.routers import LeastOutstanding
from simcore.autoscaler import SERVING, AutoscaledCluster, AutoscalingLimits, ScalingEvent
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.log import EngineLog
from simcore.metrics import requests_frame
from simcore.wiring import on_done_of, start_arrivals
from simcore.request import RequestSpec

ONE_AT_A_TIME = Continuous(max_num_seqs=1, max_num_batched_tokens=64)


def cluster(specs, **limits):
    env, log = simpy.Environment(), EngineLog()
    engines = [Engine(env, ONE_AT_A_TIME, ConstantCost(1.0), EngineLimits(1000, 16, 8192), log, replica_id=i)
               for i in range(2)]
    lim = AutoscalingLimits(**{"min_replicas": 1, "max_replicas": 2, "signal": "waiting_per_replica",
                               "cooldown_s": 0.0, **limits})
    c = AutoscaledCluster(engines, LeastOutstanding(), lim, len(specs))
    start_arrivals(env, specs, c.submit, on_done_of(engines))
    return env, c, log


def test_a_started_replica_serves_only_after_its_startup():
    # each request takes 3 steps (prefill + 2 decodes); replica 0 runs A [0,3], B [3,6], C [6,9], D [9,12].
    # At the 1.25 s look 2 wait (B, C) > 1.5 per replica: replica 1 starts, serving from 1.25 + 2.6 = 3.85.
    # D at 2.0 can only go to replica 0; E at 4.0 goes to replica 1 (0 outstanding): [4,7].
    specs = [RequestSpec(0, 0.0, 16, 3), RequestSpec(1, 0.1, 16, 3), RequestSpec(2, 0.2, 16, 3),
             RequestSpec(3, 2.0, 16, 3), RequestSpec(4, 4.0, 16, 3)]
    env, c, log = cluster(specs, scale_up_above=1.5, scale_down_below=-1.0, startup_s=2.6, interval_s=1.25)
    env.run()
    assert list(c.routed_to) == [0, 0, 0, 0, 1]
    assert c.events == [ScalingEvent(0.0, 0, "serve"), ScalingEvent(1.25, 1, "start"), ScalingEvent(3.85, 1, "serve")]
    df = requests_frame(log)
    assert list(zip(df.replica_id, df.first_token_s, df.finish_s)) == [
        (0, 1.0, 3.0), (0, 4.0, 6.0), (0, 7.0, 9.0), (0, 10.0, 12.0), (1, 5.0, 7.0)]
    # replica 1 holds its GPU from its start at 1.25; both until the scaler's first look after the end (12.5)
    assert c.gpu_s == pytest.approx([12.5, 12.5 - 1.25])


def test_a_draining_replica_takes_no_new_work_and_leaves_with_its_last_request():
    # both replicas serve; A at 0 -> replica 0, B at 0.1 -> replica 1 (fewer outstanding), [0.1, 3.1].
    # Replica 1 drains at 0.5: C at 1.0 goes to replica 0 although replica 1 has fewer outstanding.
    specs = [RequestSpec(0, 0.0, 16, 3), RequestSpec(1, 0.1, 16, 3), RequestSpec(2, 1.0, 16, 3)]
    env, c, log = cluster(specs, scale_up_above=100.0, scale_down_below=-1.0, startup_s=0.0, interval_s=1000.0)
    c.state[1], c.since[1] = SERVING, 0.0

    def drain_at_half_a_second():
        yield env.timeout(0.5)
        c._drain(1)
    env.process(drain_at_half_a_second())
    env.run()
    assert list(c.routed_to) == [0, 1, 0]
    assert c.events[-2:] == [ScalingEvent(0.5, 1, "drain"), ScalingEvent(3.1, 1, "leave")]
    assert c.gpu_s[1] == pytest.approx(3.1)
    df = requests_frame(log)
    assert list(zip(df.replica_id, df.finish_s)) == [(0, 3.0), (1, 3.1), (0, 6.0)]


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm", "profile": "constant:per_step_s=0.01",
        "engine": {"policy": "chunked_prefill", "max_num_seqs": 4},
        "workload": {"num_requests": 200, "arrival": {"process": "poisson",
                                                       "rate_per_s": {"spike": {"base": 5, "peak": 60, "start_s": 5,
                                                                                "duration_s": 5}}},
                     "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 20}},
        "slo": {"ttft_ms": 1000},
        "autoscaling": {"min_replicas": 1, "max_replicas": 4, "signal": "waiting_per_replica", "scale_up_above": 2,
                        "scale_down_below": 0.5, "interval_s": 1, "cooldown_s": 2, "gpu_price_per_hour": 3.6}}


def test_a_spike_scales_out_and_back_in_and_the_results_say_so():
    s = simulate(copy.deepcopy(BASE), 0).summary
    assert s["num_scale_ups"] >= 1 and s["num_scale_downs"] >= 1 and s["replicas_peak"] >= 2
    # the default start-up: Llama-3-8B's 16 GB of bf16 weights over the H100's 50 GB/s host link
    assert s["startup_s"] == pytest.approx(16.06e9 / 50e9, rel=0.01)
    assert s["cost"] == pytest.approx(s["gpu_hours"] * 3.6) and s["slo_attainment_by_hour"].startswith("0:")
    assert s["replica_timeline"].startswith("0:1 ")


@pytest.mark.parametrize("change, key", [
    ({"signal": "cpu"}, "autoscaling.signal"),
    ({"max_replicas": 0}, "autoscaling.max_replicas"),
    ({"min_replicas": 5}, "autoscaling.max_replicas: 4 is below min_replicas 5"),
    ({"scale_down_below": 3}, "autoscaling.scale_down_below"),
    ({"warmup_s": 3}, "autoscaling.warmup_s"),
    ({"interval_s": 0}, "autoscaling.interval_s"),
])
def test_bad_autoscaling_sections_name_the_key(change, key):
    cfg = copy.deepcopy(BASE)
    cfg["autoscaling"].update(change)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_point(cfg)


def test_autoscaling_decides_the_replica_count():
    cfg = copy.deepcopy(BASE)
    cfg["cluster"] = {"num_replicas": 3}
    with pytest.raises(ConfigError, match=r"cluster\.num_replicas: not used with autoscaling"):
        resolve_point(cfg)
    del cfg["autoscaling"]["signal"]
    with pytest.raises(ConfigError, match=r"autoscaling\.signal: required"):
        resolve_point(cfg)

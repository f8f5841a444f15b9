"""Admission control at the gateway (simcore/gateway.py) on exact timelines (1 s per step, computed by hand):
a request refused at a full queue, one dropped at its queue deadline, one abandoned by its client while it
prefills (its KV freed, never counted as served); and the sweep file's strict `gateway:` section."""
from __future__ import annotations

import copy

import pytest
import simpy

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate
from policies import ChunkedPrefill, Continuous
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.gateway import GatewayLimits
from simcore.log import RequestEvent as E
from simcore.metrics import requests_frame
from simcore.wiring import run_replica
from simcore.request import RequestSpec


def run(policy, specs, **gateway):
    limits = EngineLimits(1000, 16, 8192, gateway=GatewayLimits(**gateway))
    engine = run_replica(policy, ConstantCost(1.0), limits, specs, env=simpy.Environment())
    df = requests_frame(engine.log)
    none = lambda v: None if v is None or v != v else v  # noqa: E731  (NaN: absent)
    return {r.request_id: (r.status, none(r.reject_reason), none(r.first_token_s), r.finish_s)
            for r in df.itertuples()}, engine


ONE_AT_A_TIME = Continuous(max_num_seqs=1, max_num_batched_tokens=64)
# A: arrives at 0, 2 output tokens: prefill [0,1] (first token at 1), decode [1,2] (done at 2).
# B arrives at 0.1 and waits for A's slot; C at 0.2.
SPECS = [RequestSpec(0, 0.0, 16, 2), RequestSpec(1, 0.1, 16, 2), RequestSpec(2, 0.2, 16, 2)]


def test_a_request_is_refused_when_the_queue_is_full():
    rows, engine = run(ONE_AT_A_TIME, SPECS, max_waiting=1)
    # C finds B waiting (1 = max_waiting): a 429 at 0.2; B runs after A: first token at 3, done at 4
    assert rows == {0: ("finished", None, 1.0, 2.0), 1: ("finished", None, 3.0, 4.0),
                    2: ("rejected", "gateway_full", None, 0.2)}
    assert E(0.2, 2, "rejected") in engine.log.events


def test_outstanding_counts_running_requests_too():
    rows, _ = run(ONE_AT_A_TIME, SPECS, max_outstanding=1)
    # A runs (1 outstanding): B and C are both refused on arrival
    assert [rows[i][1] for i in range(3)] == [None, "gateway_full", "gateway_full"]


def test_a_request_is_dropped_at_its_queue_deadline():
    rows, _ = run(ONE_AT_A_TIME, SPECS[:2], max_queue_s=1.5)
    # B waits from 0.1; its deadline 1.6 comes before A frees the slot at 2: dropped at 1.6, never admitted
    assert rows == {0: ("finished", None, 1.0, 2.0), 1: ("rejected", "queue_timeout", None, 1.6)}


def test_a_client_abandons_a_prefill_and_its_kv_is_freed():
    # A's 64-token prompt in 16-token chunks: [0,1], [1,2], [2,3], [3,4] would give its first token at 4.
    # Its client gives up at 1.5, during the second step; the engine ends it when that step ends, at 2.
    policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=16)
    rows, engine = run(policy, [RequestSpec(0, 0.0, 64, 4), RequestSpec(1, 2.5, 16, 1)], client_timeout_s=1.5)
    assert rows == {0: ("rejected", "client_timeout", None, 2.0), 1: ("finished", None, 3.5, 3.5)}
    # the step that ended at 2 left nothing running and no KV held; B then runs alone from 2.5
    it = engine.log.iterations
    assert [(r.start_s, r.prefill_tokens, r.num_running, r.kv_blocks_used) for r in it] == [
        (0.0, 16, 1, 1), (1.0, 16, 0, 0), (2.5, 16, 0, 0)]


def test_a_client_deadline_spares_a_request_that_has_its_first_token():
    rows, _ = run(ONE_AT_A_TIME, SPECS[:1], client_timeout_s=1.5)
    assert rows == {0: ("finished", None, 1.0, 2.0)}


BASE = {"model": "llama-3-8b", "hardware": "h100-sxm", "profile": "constant:per_step_s=0.01",
        "engine": {"policy": "chunked_prefill"},
        "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate_per_s": float("inf")},
                     "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 20}},
        "slo": {"ttft_ms": 1000}}


def test_a_sweep_point_with_a_gateway_counts_what_it_refused():
    cfg = copy.deepcopy(BASE)
    cfg["gateway"] = {"max_waiting": 10}
    cfg["engine"]["max_num_seqs"] = 4
    s = simulate(cfg, 0).summary
    # 50 at t = 0: 4 admitted at the first step... the queue holds 10, so 50 - 10 = 40 are refused on arrival
    # (the engine's first decision comes after every arrival at t = 0)
    assert (s["num_rejected"], s["num_gateway_refused"], s["num_dropped"], s["num_abandoned"]) == (40, 40, 0, 0)
    assert "gateway_full=40" in s["rejected_reasons"] and s["num_finished"] == 10


@pytest.mark.parametrize("block, key", [
    ({"max_waiting": 0}, "gateway.max_waiting"),
    ({"max_waiting": 2.5}, "gateway.max_waiting"),
    ({"max_queue_s": -1}, "gateway.max_queue_s"),
    ({"timeout": 3}, "gateway.timeout"),
    ({}, "gateway: expected at least one"),
    ("yes", "gateway"),
])
def test_bad_gateway_sections_name_the_key(block, key):
    cfg = copy.deepcopy(BASE)
    cfg["gateway"] = block
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_point(cfg)

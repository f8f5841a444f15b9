"""n-gram speculation under the TGI policy (policies/speculation_counting.py, docs/speculative.md "Per engine"):
the same draws and pricing as vLLM's; TGI's reservation (`input + max_new_tokens + speculate - 1` at once) and
its server dropping a batch's drafts when new requests join it. Hand-worked k = 2 timelines at acceptance 1
and 0, the difference from vLLM V1, the fast engine bitwise equal, and the refusals."""
import pytest

from costmodels import RooflineCostModel, get_gpu, get_model
from costmodels.speculative_proposer import proposer_cost
from policies import ChunkedPrefill, Tgi
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.metrics import iterations_frame, requests_frame
from simcore.request import RequestSpec
from simcore.speculative import Speculation, default_acceptance
from simcore.wiring import run_replica
from tests.test_fastpath import assert_identical, run_both
from tests.test_properties import random_specs


def run(policy, engine, acceptance, specs):
    spec = Speculation("ngram", 2, tuple(acceptance), engine=engine)
    e = run_replica(policy, ConstantCost(1.0), EngineLimits(100, 4, 512, speculative=spec), specs)
    return e, requests_frame(e.log), iterations_frame(e.log)


ONE = [RequestSpec(0, 0.0, 10, 7, max_new_tokens=7)]


def test_all_drafts_accepted_by_hand():
    # t 0-1 prefill 10, then verifications of 1 + 2 accepting both: tokens 1, 4, 7. TGI reserves 10 + 7 + 2 - 1
    # = 18 tokens (5 blocks of 4) at admission and holds them to the end; vLLM holds what it computed: 3, 4
    e, reqs, its = run(Tgi(), "tgi", [1.0, 1.0], ONE)
    assert reqs.finish_s[0] == 3.0 and list(e.log.itl_gaps_s) == [1.0, 1.0]
    assert list(its.decode_tokens) == [0, 3, 3] and list(its.kv_blocks_used)[:2] == [5, 5]
    e, reqs, its = run(ChunkedPrefill(), "vllm", [1.0, 1.0], ONE)
    assert reqs.finish_s[0] == 3.0 and list(its.kv_blocks_used)[:2] == [3, 4]


def test_rejected_drafts_by_hand():
    # six verifications of 1 + 2, each emitting one token; the 5 blocks stay reserved (nothing given back)
    e, reqs, its = run(Tgi(), "tgi", [0.0, 0.0], ONE)
    assert reqs.finish_s[0] == 7.0 and list(e.log.itl_gaps_s) == [1.0] * 6
    assert list(its.decode_tokens) == [0] + [3] * 6 and set(its.kv_blocks_used[:6]) == {5}
    c = e.spec_counters
    assert (c.num_verifications, c.num_draft_tokens, c.num_accepted_tokens) == (6, 12, 0)


def test_the_reservation_counts_the_drafts():
    # queue.rs: `input_length + max_new_tokens + speculate - 1`; without speculation 10 + 7 - 1 = 16 (4 blocks)
    spec = RequestSpec(0, 0.0, 10, 7, max_new_tokens=7)
    assert Tgi.reserved_tokens(spec, 512, 2) == 18 and Tgi.reserved_tokens(spec, 512) == 16


def test_a_reservation_past_the_pool_only_with_the_drafts_fails_loudly():
    # 386 + 10 - 1 = 395 tokens fit the 99 blocks of 4; with speculate 2, 397 do not (TGI refuses it at validation)
    from simcore.engine import SimulationError
    big = [RequestSpec(0, 0.0, 386, 10, max_new_tokens=10)]
    assert Tgi.reserved_tokens(big[0], 512) == 395
    with pytest.raises(SimulationError, match="speculate 2 > the KV pool"):
        run(Tgi(), "tgi", [0.0, 0.0], big)


TWO = [RequestSpec(0, 0.0, 10, 7, max_new_tokens=7), RequestSpec(1, 1.5, 10, 3, max_new_tokens=3)]


def test_a_joining_request_drops_the_batch_drafts_with_chunking():
    # t 0-1 prefill r0; 1-2 r0 verifies 1 + 2 (4 tokens out). At t 2 r1 waits: the forward that onboards it is
    # concatenated with a batch without drafts, so r0 takes 1 token (5 out); 2-3 ... then 3-4 everyone verifies
    # 1 + 2: r0 emits its last 2, r1 its last 2. vLLM V1 verifies r0's drafts beside r1's prefill (done at 3).
    e, reqs, its = run(Tgi(), "tgi", [1.0, 1.0], TWO)
    assert list(reqs.finish_s) == [4.0, 4.0] and list(its.decode_tokens) == [0, 3, 1, 6]
    e, reqs, its = run(ChunkedPrefill(), "vllm", [1.0, 1.0], TWO)
    assert reqs.finish_s[0] == 3.0 and list(its.decode_tokens)[:3] == [0, 3, 3]


def test_without_chunking_the_drafts_survive_the_separate_prefill():
    # the running batch pauses for r1's prefill-only forward (2-3); both batches then have drafts, and their
    # concatenation keeps them: 3-4 r0 verifies 1 + 2 (its last 3), r1 1 + 2 (its last 2)
    e, reqs, its = run(Tgi(prefill_chunking=False), "tgi", [1.0, 1.0], TWO)
    assert list(reqs.finish_s) == [4.0, 4.0] and list(its.decode_tokens) == [0, 3, 0, 6]


# ---- both engines, bitwise ----

ROOFLINE = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"))


@pytest.mark.parametrize("policy", [Tgi(max_batch_prefill_tokens=256), Tgi(prefill_chunking=False,
                                                                            max_batch_prefill_tokens=512)])
def test_fast_path_matches_the_simpy_engine(policy):
    proposer = proposer_cost("ngram", 3, get_model("llama-3-8b"), get_gpu("h100-sxm"), None)
    for seed in range(3):
        spec = Speculation("ngram", 3, default_acceptance("ngram", 3), seed, proposer, engine="tgi")
        for cost in (ConstantCost(0.01, 1e-4), ROOFLINE):
            plain, fast = run_both(policy, random_specs(seed), cost, num_gpu_blocks=60, speculative=spec)
            assert_identical(plain, fast, 60)


# ---- the sweep file ----

WORKLOAD = {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": 30},
            "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 2000},
            "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.8, "max": 500}}


def test_a_point_speculates_on_tgi_on_both_engines():
    import pandas as pd
    from experiments.simulate import simulate
    runs = [simulate({"model": "llama-3.1-8b", "workload": WORKLOAD,
                      "engine": {"policy": "tgi", "fast_path": fp, "num_gpu_blocks": 400,
                                 "speculative": {"method": "ngram", "num_speculative_tokens": 3}}}, seed=2)
            for fp in ("on", "off")]
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    assert runs[0].summary["spec_decode_steps"] > 0 and runs[0].summary["spec_acceptance_length"] > 2


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "draft_model"])
def test_methods_tgi_does_not_run_are_one_line_naming_the_key(method):
    from experiments.config import resolve_point
    from experiments.configcheck import ConfigError
    spec = {"method": method, "num_speculative_tokens": 2, "acceptance": 0.5}
    if method == "draft_model":
        spec["draft_model"] = "llama-3-8b"
    with pytest.raises(ConfigError) as e:
        resolve_point({"model": "llama-3.1-8b", "workload": WORKLOAD, "engine": {"policy": "tgi", "speculative": spec}})
    assert str(e.value).startswith("engine.speculative.method:") and "\n" not in str(e.value)
    assert "Medusa" in str(e.value)

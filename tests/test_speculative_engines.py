"""Speculative decoding under the SGLang and TensorRT-LLM policies (policies/speculation_counting.py): the
same draws and pricing as vLLM's, their own counting of drafts: hand-worked timelines (k = 2, acceptance 1
and 0), where they differ from vLLM V1, and the fast engine bitwise equal to the SimPy engine."""
import numpy as np
import pytest

from costmodels import RooflineCostModel, get_gpu, get_model
from costmodels.speculative_proposer import proposer_cost
from policies import ChunkedPrefill, Sglang, TrtLlm
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.metrics import iterations_frame, requests_frame
from simcore.request import Request, RequestSpec
from simcore.speculative import Speculation, default_acceptance
from simcore.wiring import run_replica
from tests.helpers import running, view
from tests.test_fastpath import assert_identical, run_both
from tests.test_properties import random_specs


def one_request(policy, engine, acceptance, method="eagle3", output=7):
    spec = Speculation(method, 2, tuple(acceptance), engine=engine)
    limits = EngineLimits(100, 4, 512, speculative=spec)
    e = run_replica(policy, ConstantCost(1.0), limits, [RequestSpec(0, 0.0, 10, output, max_new_tokens=output)])
    return e, requests_frame(e.log), iterations_frame(e.log)


SGLANG = Sglang(max_running_requests=8)
TRTLLM_MAX_UTIL = TrtLlm(capacity_scheduler_policy="MAX_UTILIZATION")


# ---- SGLang ----

def test_sglang_all_drafts_accepted_by_hand():
    # t 0-1 prefill 10 (3 blocks of 4), then verifications of 1 + 2 tokens accepting both: tokens 1, 4, 7.
    # KV holds only computed tokens between steps: 13 -> 4 blocks (vLLM: 13 + 2 lookahead -> 4, then 5).
    e, reqs, its = one_request(SGLANG, "sglang", [1.0, 1.0])
    assert reqs.finish_s[0] == 3.0 and list(e.log.itl_gaps_s) == [1.0, 1.0]
    assert list(its.decode_tokens) == [0, 3, 3] and list(its.kv_blocks_used)[:2] == [3, 4]


def test_sglang_rejected_drafts_give_their_kv_back_by_hand():
    # each step holds computed + 3 while it runs, then frees the 2 rejected slots: computed 11, 12, 13, 14, 15
    # -> 3, 3, 3, 4, 4, 4 blocks after the steps (vLLM keeps them: 3, 4, 4, 5, 5, 5)
    e, reqs, its = one_request(SGLANG, "sglang", [0.0, 0.0])
    assert reqs.finish_s[0] == 7.0 and list(e.log.itl_gaps_s) == [1.0] * 6
    assert list(its.kv_blocks_used)[:6] == [3, 3, 3, 4, 4, 4]
    c = e.spec_counters
    assert (c.num_verifications, c.num_draft_tokens, c.num_accepted_tokens) == (6, 12, 0)


def sglang_view(free, method_slots):
    a, b = running(0, 20, 5, block_size=1), running(1, 20, 1, block_size=1)
    a.num_spec_tokens = b.num_spec_tokens = 2
    v = view(running_=[a, b], free=free, block_size=1)
    v.num_speculative_tokens, v.num_lookahead_tokens = 2, method_slots
    return v


def test_sglang_decode_checks_room_for_the_verification_and_the_draft_tree():
    # check_decode_mem(decode_mem_cache_buf_multiplier): every request needs num_draft_tokens (3) + topk x
    # num_steps (2) free slots, 10 for two; vLLM's 2 x (3 + 2 lookahead) = 10 as well, but held, not checked
    batch = Sglang().schedule(sglang_view(10, 2))
    assert [(s.request_id, s.num_new_tokens) for s in batch.scheduled] == [(0, 3), (1, 3)] and not batch.preempt
    # 9 free: retract from the back of the batch (request 1), not by fewest generated tokens first: SGLang
    # can only filter a speculative batch from its back
    batch = Sglang().schedule(sglang_view(9, 2))
    assert [s.request_id for s in batch.scheduled] == [0] and batch.preempt == (1,)
    # n-gram: one tree slot, 3 + 1 a request
    assert not Sglang().schedule(sglang_view(8, 1)).preempt


def test_sglang_without_speculation_still_retracts_by_generated_tokens():
    v = sglang_view(1, 0)
    v.num_speculative_tokens = 0
    for r in v.running:
        r.num_spec_tokens = 0
    batch = Sglang().schedule(v)
    assert batch.preempt == (1,) and [(s.request_id, s.num_new_tokens) for s in batch.scheduled] == [(0, 1)]


# ---- TensorRT-LLM ----

def test_trtllm_all_drafts_accepted_by_hand():
    # one-model EAGLE-3 keeps k - 1 = 1 extra slot: context 10 + 1 -> 3 blocks; each step holds computed +
    # 3 + 1, then rewinds the rejected drafts: 13 + 1 -> 4 blocks
    e, reqs, its = one_request(TRTLLM_MAX_UTIL, "trtllm", [1.0, 1.0])
    assert reqs.finish_s[0] == 3.0 and list(e.log.itl_gaps_s) == [1.0, 1.0]
    assert list(its.decode_tokens) == [0, 3, 3] and list(its.kv_blocks_used)[:2] == [3, 4]


def test_trtllm_rejected_drafts_are_rewound_by_hand():
    # computed 11, 12, 13, 14, 15 plus the extra slot: 12 .. 16 tokens -> 3, 3, 4, 4, 4, 4 blocks
    e, reqs, its = one_request(TRTLLM_MAX_UTIL, "trtllm", [0.0, 0.0])
    assert reqs.finish_s[0] == 7.0
    assert list(its.kv_blocks_used)[:6] == [3, 3, 4, 4, 4, 4]


def test_trtllm_ngram_and_draft_models_keep_no_extra_slots():
    assert Speculation("ngram", 3, (0.5,) * 3, engine="trtllm").num_lookahead_tokens == 0
    assert Speculation("draft_model", 3, (0.5,) * 3, engine="trtllm").num_lookahead_tokens == 0
    assert Speculation("mtp", 3, (0.5,) * 3, engine="trtllm").num_lookahead_tokens == 2


def trtllm_view():
    a, b = running(0, 20, 3), running(1, 20, 3)
    a.num_spec_tokens = b.num_spec_tokens = 3
    v = view(running_=[a, b], block_size=16)
    v.num_speculative_tokens, v.num_lookahead_tokens = 3, 2
    return v


def test_trtllm_budget_takes_whole_verifications():
    # microBatchScheduler: a generation request needs 1 + its drafts of max_num_tokens, or it stops there;
    # vLLM gives the second one what is left (2 tokens: its drafts cut short)
    batch = TrtLlm(max_num_tokens=6, capacity_scheduler_policy="MAX_UTILIZATION").schedule(trtllm_view())
    assert [(s.request_id, s.num_new_tokens, s.num_reserved_tokens) for s in batch.scheduled] == [(0, 4, 22 + 4 + 2)]
    v = trtllm_view()
    v.num_lookahead_tokens = 3
    assert [s.num_new_tokens for s in ChunkedPrefill(max_num_batched_tokens=6).schedule(v).scheduled] == [4, 2]


def test_trtllm_guaranteed_no_evict_reserves_the_drafts_past_max_output():
    v = view(waiting=[Request(RequestSpec(5, 0.0, 30, 20, max_new_tokens=20))], block_size=16)
    v.num_speculative_tokens, v.num_lookahead_tokens = 3, 2
    (s,) = TrtLlm().schedule(v).scheduled
    assert (s.num_new_tokens, s.num_reserved_tokens) == (30, 50 + 2 + 3)


# ---- both engines, bitwise ----

ROOFLINE = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"))
POLICIES = {"sglang": Sglang(max_running_requests=6, chunked_prefill_size=64, new_token_ratio_decay_steps=20),
            "trtllm_gne": TrtLlm(max_batch_size=6, max_num_tokens=512),
            "trtllm_maxutil": TrtLlm(max_batch_size=6, max_num_tokens=64, enable_chunked_context=True,
                                     capacity_scheduler_policy="MAX_UTILIZATION")}


def capped_specs(seed):
    """Requests whose max_new_tokens is their output: SGLang's admission estimates are then exact, and a
    fast-decaying new_token_ratio overcommits the pool, so that decode steps retract."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.02, 25))
    return [RequestSpec(i, float(t), int(rng.integers(10, 150)), o, max_new_tokens=o)
            for i, (t, o) in enumerate(zip(arrivals, (int(x) for x in rng.integers(20, 200, 25))))]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_fast_path_matches_the_simpy_engine(name, method):
    engine = "sglang" if name == "sglang" else "trtllm"
    num_preemptions = 0
    for seed in range(3):
        specs = capped_specs(seed) if name == "sglang" else random_specs(seed)
        proposer = proposer_cost(method, 3, get_model("llama-3-8b"), get_gpu("h100-sxm"), None)
        spec = Speculation(method, 3, default_acceptance(method, 3), seed, proposer, engine=engine)
        for cost in (ConstantCost(0.01, 1e-4), ROOFLINE):
            plain, fast = run_both(POLICIES[name], specs, cost, num_gpu_blocks=40, speculative=spec)
            assert_identical(plain, fast, 40)
            num_preemptions += plain[0].num_preemptions.sum()
    if name != "trtllm_gne":   # (it never preempts)
        assert num_preemptions > 0   # retraction / pausing with drafts in flight is exercised


# ---- the sweep file ----

WORKLOAD = {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": 30},
            "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 2000},
            "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.8, "max": 500}}


@pytest.mark.parametrize("policy", ["sglang", "trtllm"])
def test_a_point_speculates_on_sglang_and_trtllm_on_both_engines(policy):
    import pandas as pd
    from experiments.simulate import simulate
    runs = [simulate({"model": "llama-3.1-8b", "workload": WORKLOAD,
                      "engine": {"policy": policy, "fast_path": fp, "num_gpu_blocks": 400,
                                 "speculative": {"method": "eagle3", "num_speculative_tokens": 3}}}, seed=2)
            for fp in ("on", "off")]
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    assert runs[0].summary["spec_decode_steps"] > 0 and runs[0].summary["spec_acceptance_length"] > 2


def test_sglang_speculating_runs_48_requests_unless_told():
    from experiments.config import resolve_point
    spec = {"method": "eagle3", "num_speculative_tokens": 3}
    point = resolve_point({"model": "llama-3.1-8b", "workload": WORKLOAD,
                           "engine": {"policy": "sglang", "speculative": spec}})
    assert point.policy.max_running_requests == 48
    point = resolve_point({"model": "llama-3.1-8b", "workload": WORKLOAD,
                           "engine": {"policy": "sglang", "max_running_requests": 100, "speculative": spec}})
    assert point.policy.max_running_requests == 100
    plain = resolve_point({"model": "llama-3.1-8b", "workload": WORKLOAD, "engine": {"policy": "sglang"}})
    assert plain.policy.max_running_requests is None


@pytest.mark.parametrize("engine, key", [
    ({"policy": "trtllm", "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
     "engine.speculative.method"),
    ({"policy": "sglang", "enable_mixed_chunk": True, "speculative": {"method": "eagle3", "num_speculative_tokens": 2}},
     "engine.enable_mixed_chunk"),
    ({"policy": "static", "speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "engine.speculative"),
])
def test_what_an_engine_does_not_run_is_one_line_naming_the_key(engine, key):
    from experiments.config import resolve_point
    from experiments.configcheck import ConfigError
    with pytest.raises(ConfigError) as e:
        resolve_point({"model": "llama-3.1-8b", "workload": WORKLOAD, "engine": engine})
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)


def test_sglang_speculating_at_128_users_runs_48_at_most():
    # examples/speculative_engines.yaml at its last load, fewer requests: SGLang's 48-request default binds
    import yaml
    from pathlib import Path
    from experiments.config import expand
    from experiments.simulate import simulate
    sweep = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "speculative_engines.yaml")
                           .read_text())
    sweep["workload"]["num_requests"] = 256
    sweep["grid"] = {"engine.policy": ["chunked_prefill", "sglang"]}
    sweep["engine"]["speculative"] = {"method": "eagle3", "num_speculative_tokens": 3}
    sweep["workload"]["arrival"]["concurrency"] = 128
    vllm, sglang = (simulate(p.config, seed=0) for p in expand(sweep))
    assert sglang.iterations.num_running.max() == 48 < vllm.iterations.num_running.max()
    assert sglang.summary["ttft_p50_ms"] > 10 * vllm.summary["ttft_p50_ms"]


def test_trtllm_guaranteed_no_evict_refuses_a_request_whose_reservation_with_drafts_never_fits():
    # 4 blocks of 16 = 64 tokens. EAGLE-3 with 3 drafts on TensorRT-LLM's one-model path reserves prompt +
    # max output + 2 extra slots + 3 drafts: 30 + 30 + 5 = 65 tokens, 5 blocks, for the first request (its
    # 60 alone would fit); it is refused on arrival, and the second (10 + 10 + 5) runs instead of waiting
    # behind it forever.
    spec = Speculation("eagle3", 3, default_acceptance("eagle3", 3), 0, None, engine="trtllm")
    specs = [RequestSpec(0, 0.0, 30, 30, max_new_tokens=30), RequestSpec(1, 0.001, 10, 10, max_new_tokens=10)]
    plain, fast = run_both(TrtLlm(max_batch_size=4, max_num_tokens=256), specs, ConstantCost(0.01, 1e-4),
                           num_gpu_blocks=4, speculative=spec)
    assert_identical(plain, fast, 4)
    requests = plain[0].set_index("request_id")
    assert requests.loc[0, "status"] == "rejected" and requests.loc[0, "reject_reason"] == "exceeds_kv_capacity"
    assert requests.loc[1, "status"] == "finished"

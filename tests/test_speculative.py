"""Speculative decoding (simcore/speculative.py, engine.speculative): hand-worked timelines, vLLM V1's budget
and KV counting of drafts, the shared draws, the fast engine bitwise equal to the SimPy engine, bad input."""
import dataclasses

import numpy as np
import pytest

from costmodels import RooflineCostModel, get_gpu, get_model
from costmodels.speculative_proposer import NGRAM_CPU_S_PER_REQUEST, proposer_cost
from experiments.configcheck import ConfigError
from experiments.speculative_config import parse_speculative
from policies import ChunkedPrefill, Continuous
from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.metrics import iterations_frame, requests_frame
from simcore.request import RequestSpec
from simcore.speculative import AcceptanceDraws, Speculation, default_acceptance, geometric
from simcore.wiring import run_replica
from tests.helpers import running, view
from tests.test_fastpath import assert_identical, run_both, with_shared_prefixes
from tests.test_properties import random_specs


def one_request(acceptance, prompt=10, output=7, k=2, method="eagle3", block_size=4):
    spec = Speculation(method, k, tuple(acceptance))
    limits = EngineLimits(100, block_size, 512, speculative=spec)
    engine = run_replica(ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=64), ConstantCost(1.0), limits,
                         [RequestSpec(0, 0.0, prompt, output)])
    return engine, requests_frame(engine.log), iterations_frame(engine.log)


def test_all_drafts_accepted_by_hand():
    # t 0-1: prefill 10, first token. Each later step verifies 1 + 2 tokens, accepts both: 3 tokens a step,
    # one streamed chunk (one ITL gap). Tokens 1, 4, 7: finished at t = 3.
    engine, reqs, its = one_request([1.0, 1.0])
    assert reqs.finish_s[0] == 3.0 and reqs.first_token_s[0] == 1.0
    assert list(engine.log.itl_gaps_s) == [1.0, 1.0]
    assert reqs.tpot_s[0] == pytest.approx(2.0 / 6)   # (finish - first token) / (output - 1), as vllm bench serve
    assert list(its.prefill_tokens) == [10, 0, 0] and list(its.decode_tokens) == [0, 3, 3]
    # KV (block 4): the step's tokens plus 2 lookahead slots: 10+2 -> 3 blocks, 10+3+2 -> 4, 13+3+2 -> 5
    assert list(its.kv_blocks_used)[:2] == [3, 4]   # (the last step's KV is freed at its finish)
    c = engine.spec_counters
    assert (c.num_verifications, c.num_draft_tokens, c.num_accepted_tokens) == (2, 4, 4)


def test_no_draft_accepted_by_hand():
    # every verification rejects both drafts: one token a step, the drafts rolled back, their KV kept
    engine, reqs, its = one_request([0.0, 0.0])
    assert reqs.finish_s[0] == 7.0
    assert list(engine.log.itl_gaps_s) == [1.0] * 6
    # computed after step j >= 2: 10 + (j - 2) + 1 ... held = computed + 3 + 2 at each step's start
    assert list(its.kv_blocks_used)[:6] == [3, 4, 4, 5, 5, 5]
    c = engine.spec_counters
    assert (c.num_verifications, c.num_draft_tokens, c.num_accepted_tokens) == (6, 12, 0)


def test_last_chunk_stops_at_the_output_length():
    # 3 tokens a step, but only 5 to make: 1, then 3, then the last 1 (extra accepted tokens dropped)
    engine, reqs, _ = one_request([1.0, 1.0], output=5)
    assert reqs.finish_s[0] == 3.0 and reqs.output_tokens[0] == 5


def test_drafts_share_the_token_budget_and_hold_lookahead_kv():
    # vLLM V1: a decoding request asks for 1 + its drafts; the budget cuts the next one short; KV for the
    # scheduled tokens plus num_lookahead_tokens (k) slots
    a, b = running(0, 20, 3), running(1, 20, 3)
    a.num_spec_tokens = b.num_spec_tokens = 3
    v = view(running_=[a, b], block_size=16)
    v.num_lookahead_tokens = 3
    batch = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=6).schedule(v)
    assert [(s.request_id, s.num_new_tokens, s.num_reserved_tokens) for s in batch.scheduled] == \
           [(0, 4, 22 + 4 + 3), (1, 2, 22 + 2 + 3)]


def test_drafts_stop_below_max_model_len():
    # vLLM: num_new_tokens <= max_model_len - num_computed_tokens - 1 (room for the sampled token)
    r = running(0, 20, 3, output=100)
    r.num_spec_tokens = 4
    v = view(running_=[r], max_model_len=25)
    v.num_lookahead_tokens = 4
    (s,) = ChunkedPrefill().schedule(v).scheduled
    assert (s.num_new_tokens, s.num_reserved_tokens) == (2, 25)


def test_draws_depend_on_seed_and_request_only():
    spec = Speculation("eagle3", 3, geometric(0.7, 3), seed=5)
    d = AcceptanceDraws(spec)
    first = d.draws_for(7, 50)
    assert first == AcceptanceDraws(spec).draws_for(7, 50)   # a pure function of (seed, request)
    assert first != d.draws_for(8, 50)
    assert first != AcceptanceDraws(dataclasses.replace(spec, seed=6)).draws_for(7, 50)
    # P(at least i accepted) = r_i: the mean accepted count is sum(r_i)
    many = [a for rid in range(400) for a in d.draws_for(rid, 50)]
    assert np.mean(many) == pytest.approx(sum(spec.acceptance), rel=0.03)


ROOFLINE = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"))
SPEC_POLICIES = [ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64),
                 ChunkedPrefill(max_num_seqs=16, max_num_batched_tokens=7),   # budget cuts drafts short
                 Continuous(max_num_seqs=6, max_num_batched_tokens=512, mix_prefill_decode=True, watermark=0.0)]


@pytest.mark.parametrize("policy", SPEC_POLICIES, ids=["cp64", "cp7", "continuous_v1"])
@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_fast_path_matches_the_simpy_engine_with_speculation(policy, method):
    num_preemptions = 0
    for seed in range(4):
        specs = random_specs(seed)
        proposer = proposer_cost(method, 3, get_model("llama-3-8b"), get_gpu("h100-sxm"), None)
        spec = Speculation(method, 3, default_acceptance(method, 3), seed, proposer)
        for cost in (ConstantCost(0.01, 1e-4), ROOFLINE):
            plain, fast = run_both(policy, specs, cost, num_gpu_blocks=40, speculative=spec)
            assert_identical(plain, fast, 40)
            num_preemptions += plain[0].num_preemptions.sum()
    if policy is not SPEC_POLICIES[1]:   # (7 tokens a step never fill 40 blocks)
        assert num_preemptions > 0   # the recompute path (drafts dropped) is exercised


def test_proposer_prices_k_passes():
    m, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    eagle = proposer_cost("eagle3", 3, m, gpu, None)
    assert eagle.draft.model.num_layers == 1 and eagle.draft.model.hidden_size == m.hidden_size
    one = proposer_cost("eagle3", 1, m, gpu, None).time_s([(4, 100)], [])
    assert 0 < one < eagle.time_s([(4, 100)], [])   # more drafts, more sequential passes
    assert proposer_cost("ngram", 3, m, gpu, None).time_s([(4, 100)], [50]) == 2 * NGRAM_CPU_S_PER_REQUEST


@pytest.mark.parametrize("value, key", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "engine.speculative.method"),
    ({"method": "eagle", "num_speculative_tokens": 0}, "engine.speculative.num_speculative_tokens"),
    ({"method": "eagle"}, "engine.speculative.num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 2, "acceptance": 1.2}, "engine.speculative.acceptance"),
    ({"method": "eagle", "num_speculative_tokens": 2, "acceptance": [-0.1, -0.2]}, "engine.speculative.acceptance"),
    ({"method": "eagle", "num_speculative_tokens": 2, "acceptance": [0.5, 0.6]}, "engine.speculative.acceptance"),
    ({"method": "eagle", "num_speculative_tokens": 3, "acceptance": [0.5, 0.4]}, "engine.speculative.acceptance"),
    ({"method": "draft_model", "num_speculative_tokens": 3, "acceptance": 0.6}, "engine.speculative.draft_model"),
    ({"method": "draft_model", "num_speculative_tokens": 3}, "engine.speculative.draft_model"),
    ({"method": "draft_model", "num_speculative_tokens": 3, "draft_model": "no-such-model-1b"},
     "engine.speculative.draft_model"),
    ({"method": "eagle3", "num_speculative_tokens": 3, "speculative_model": "x"}, "engine.speculative.speculative_model"),
])
def test_bad_speculative_config_is_one_line_naming_the_key(value, key):
    with pytest.raises(ConfigError) as e:
        parse_speculative(value)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_defaults_are_the_published_figures():
    assert parse_speculative({"method": "mtp"}).acceptance == (0.875,)   # DeepSeek-V3: 85-90% for token 2
    assert parse_speculative({"method": "eagle3", "num_speculative_tokens": 2}).acceptance == geometric(0.743, 2)
    rates = parse_speculative({"method": "ngram", "num_speculative_tokens": 7}).acceptance
    assert rates[:5] == (0.81, 0.74, 0.70, 0.68, 0.66) and list(rates) == sorted(rates, reverse=True)


def test_a_cluster_with_speculation_matches_on_the_fast_path():
    # replicas behind a router share one set of counters; every request's draws follow it to its replica
    import pandas as pd
    from experiments.simulate import simulate
    workload = {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 40},
                "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.8, "max": 2000},
                "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.8, "max": 500}}
    runs = [simulate({"model": "llama-3.1-8b", "workload": workload,
                      "cluster": {"num_replicas": 3, "router": "least_outstanding"},
                      "engine": {"fast_path": fp, "num_gpu_blocks": 300,
                                 "speculative": {"method": "ngram", "num_speculative_tokens": 4}}}, seed=3)
            for fp in ("on", "off")]
    a, b = (r.iterations.sort_values(["start_s", "replica_id"], kind="stable").reset_index(drop=True) for r in runs)
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    keys = ("spec_decode_steps", "spec_acceptance_length", "spec_draft_acceptance_rate", "tpot_mean_ms")
    assert [runs[0].summary[k] for k in keys] == [runs[1].summary[k] for k in keys]
    assert runs[0].summary["spec_decode_steps"] > 0


def test_prefix_caching_registers_only_sampled_tokens_blocks():
    # vLLM caches min(computed + scheduled, request.num_tokens): never a block holding drafts. Prompt 10,
    # block 4, k = 2, every draft rejected: the step after sampling g tokens holds 10 + g - 1 + 3 tokens of
    # KV but registers (10 + g) // 4 blocks (draft-holding block 2 waits until token 11 is sampled)
    registered = []
    limits = EngineLimits(100, 4, 512, enable_prefix_caching=True,
                          speculative=Speculation("eagle3", 2, (0.0, 0.0)))
    run_replica(ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=64), ConstantCost(1.0), limits,
                [RequestSpec(0, 0.0, 10, 7)],
                on_step=lambda engine, batch: registered.append(engine.prefix_cache._num_registered.get(0)))
    assert registered == [2, 2, 3, 3, 3, 3, None]   # (freed at its finish)


@pytest.mark.parametrize("method, hit", [("ngram", 12), ("eagle3", 8), ("mtp", 8)])
def test_eagle_prefix_hit_drops_its_last_block(method, hit):
    # a second request with the same 3-block prefix: 12 tokens hit; drafters that read the target's hidden
    # states recompute the last hit block (vLLM's drop_eagle_block)
    specs = [RequestSpec(i, 10.0 * i, 16, 3, prefix_block_ids=(1, 2, 3)) for i in range(2)]
    limits = EngineLimits(100, 4, 512, enable_prefix_caching=True,
                          speculative=Speculation(method, 1 if method == "mtp" else 2, (0.5,) * (1 if method == "mtp" else 2)))
    engine = run_replica(ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=64), ConstantCost(1.0), limits, specs)
    assert engine.prefix_cache.cached_tokens_by_request == {0: 0, 1: hit}


@pytest.mark.parametrize("policy", SPEC_POLICIES[::2], ids=["cp64", "continuous_v1"])
@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_fast_path_matches_the_simpy_engine_with_speculation_and_prefix_caching(policy, method):
    hits = 0
    for seed in range(3):
        specs = with_shared_prefixes(random_specs(seed), seed)
        spec = Speculation(method, 3, default_acceptance(method, 3), seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=40,
                               enable_prefix_caching=True, speculative=spec)
        assert_identical(plain, fast, 40)
        hits += plain[1].prefill_tokens.sum() < sum(s.num_prompt_tokens for s in specs)
    assert hits > 0   # cached prefixes were skipped

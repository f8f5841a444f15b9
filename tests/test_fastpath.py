"""The fast path (simcore/fast/engine.py) against the SimPy engine: identical per-request rows, iteration rows,
ITL samples and summaries on random small workloads, for every supported policy and knob combination."""

import numpy as np
import pandas as pd
import pytest

from costmodels import RooflineCostModel, get_gpu, get_model
from experiments.fast import iterations_table, requests_table
from experiments.simulate import simulate
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from policies import ChunkedPrefill, Continuous, Sglang, Tgi, TrtLlm
from simcore.costmodel import ConstantCost
from simcore.batch import QUIET, Batch, DecodeShortcut, Scheduled
from simcore.engine import EngineLimits, SimulationError
from simcore.fast.engine import FastEngine
from simcore.metrics import iterations_frame, itl_samples, requests_frame, summarize
from simcore.wiring import run_replica
from simcore.request import RequestSpec
from tests.helpers import policy_id
from tests.test_properties import POLICIES as PROPERTY_POLICIES
from tests.test_properties import random_specs

# test_properties' policies, plus a watermark and a token budget below the running count (same order)
POLICIES = [*PROPERTY_POLICIES[:5], Continuous(max_num_seqs=3, max_num_batched_tokens=512, watermark=0.2),
            *PROPERTY_POLICIES[5:],
            ChunkedPrefill(max_num_seqs=4, max_num_batched_tokens=4)]   # fewer tokens than running requests
# every other policy and mode: on the fast engine through their own `schedule`, step by step
OTHER_POLICIES = [
    Tgi(max_batch_prefill_tokens=256),
    Tgi(max_batch_prefill_tokens=1024, prefill_chunking=False, max_batch_size=5),
    TrtLlm(max_batch_size=6, max_num_tokens=512),
    TrtLlm(max_batch_size=6, max_num_tokens=256, capacity_scheduler_policy="MAX_UTILIZATION",
           enable_chunked_context=True),
    TrtLlm(max_batch_size=6, max_num_tokens=256, enable_chunked_context=True, context_chunking_policy="EQUAL_PROGRESS"),
    Sglang(chunked_prefill_size=128, max_prefill_tokens=256, max_running_requests=6),
    Sglang(chunked_prefill_size=64, max_prefill_tokens=256, enable_mixed_chunk=True),
    ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64, scheduling_policy="priority"),
    ChunkedPrefill(max_num_seqs=16, max_num_batched_tokens=128, long_prefill_token_threshold=32,
                   scheduling_policy="priority"),
]
ROOFLINE = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"))


def with_priorities(specs, seed):
    """Random priority classes 0..2 (read only by priority scheduling)."""
    rng = np.random.default_rng(seed + 100)
    return [dataclasses.replace(s, priority=int(rng.integers(0, 3))) for s in specs]


def run_both(policy, specs, cost, num_gpu_blocks, closed=None, block_size=16, max_model_len=512, **engine):
    limits = EngineLimits(num_gpu_blocks, block_size, max_model_len, **engine)
    simpy_engine = run_replica(policy, cost, limits, specs, closed=closed)
    log = simpy_engine.log
    fast_engine = FastEngine(policy, cost, limits, specs, closed=closed, record_events=True)
    fast = fast_engine.simulate()
    assert fast.events == log.events   # the same request events (arrived ... finished), in the same order
    if limits.enable_prefix_caching:   # the same hits, evictions and per-request cached tokens
        a, b = simpy_engine.prefix_cache, fast_engine.prefix_cache
        assert (a.num_hit_tokens, a.num_evicted_blocks, a.cached_tokens_by_request) == \
               (b.num_hit_tokens, b.num_evicted_blocks, b.cached_tokens_by_request)
    plain = (requests_frame(log), iterations_frame(log), log.itl_gaps_s)
    return plain, (requests_table(fast), iterations_table(fast), (fast.itl_values_s, fast.itl_counts))


def assert_identical(plain, fast, num_gpu_blocks):
    pd.testing.assert_frame_equal(plain[0], fast[0], check_exact=True)
    pd.testing.assert_frame_equal(plain[1], fast[1], check_exact=True)
    for a, b in zip(itl_samples(plain[2]), itl_samples(fast[2])):
        np.testing.assert_array_equal(a, b)
    sa, sb = (summarize(p[0], p[1], p[2], num_gpu_blocks) for p in (plain, fast))
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k] == sb[k] or (sa[k] != sa[k] and sb[k] != sb[k]), k


@pytest.mark.parametrize("policy", POLICIES, ids=policy_id)
@pytest.mark.parametrize("cost", [ConstantCost(0.01, 1e-4), ROOFLINE], ids=["constant", "roofline"])
def test_fast_path_matches_the_simpy_engine_on_random_workloads(policy, cost):
    num_preemptions = 0
    for seed in range(5):
        specs = random_specs(seed)
        # 40 blocks = 640 tokens: tight enough to force preemptions and rejections
        plain, fast = run_both(policy, specs, cost, num_gpu_blocks=40)
        assert_identical(plain, fast, 40)
        num_preemptions += plain[0].num_preemptions.sum()
    if policy in (POLICIES[2], POLICIES[6]):   # these do preempt here: the recompute path is exercised
        assert num_preemptions > 0


@pytest.mark.parametrize("policy", OTHER_POLICIES, ids=policy_id)
@pytest.mark.parametrize("cost", [ConstantCost(0.01, 1e-4), ROOFLINE], ids=["constant", "roofline"])
def test_every_other_policy_matches_on_the_fast_path(policy, cost):
    num_preemptions = 0
    for seed in range(5):
        specs = with_priorities(random_specs(seed), seed)
        plain, fast = run_both(policy, specs, cost, num_gpu_blocks=40)
        assert_identical(plain, fast, 40)
        num_preemptions += plain[0].num_preemptions.sum()
    if getattr(policy, "scheduling_policy", None) == "priority":
        assert num_preemptions > 0   # priority preemption (of a request anywhere in running) is exercised


@pytest.mark.parametrize("policy", POLICIES[2:], ids=policy_id)
def test_swap_preemption_matches_on_the_fast_path(policy):
    # a small host swap space: some victims are swapped (with copy times), the rest recomputed
    for seed in range(4):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=40, preemption_mode="swap",
                               num_swap_blocks=12, kv_bytes_per_token=100_000, host_link_bytes_per_s=1e9)
        assert_identical(plain, fast, 40)


def with_shared_prefixes(specs, seed, block_size=16):
    """Prompts that open with one of three shared 'documents' (prefix-cache ids), the rest unique."""
    rng = np.random.default_rng(seed + 200)
    out = []
    for s in specs:
        doc = int(rng.integers(0, 3))
        ids = tuple(1000 * doc + k for k in range(s.num_prompt_tokens // block_size))
        out.append(dataclasses.replace(s, prefix_block_ids=ids[:int(rng.integers(0, len(ids) + 1))]))
    return out


@pytest.mark.parametrize("policy", [POLICIES[2], POLICIES[4], POLICIES[6], POLICIES[8], OTHER_POLICIES[-1]],
                         ids=policy_id)
def test_prefix_caching_matches_on_the_fast_path(policy):
    hits = 0
    for seed in range(4):
        specs = with_priorities(with_shared_prefixes(random_specs(seed), seed), seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=40,
                               enable_prefix_caching=True)
        assert_identical(plain, fast, 40)
        hits += (plain[1].prefill_tokens.sum() < sum(s.num_prompt_tokens for s in specs[:-1]))
    assert hits > 0   # cached prefixes were skipped


@pytest.mark.parametrize("policy", POLICIES[::2] + OTHER_POLICIES[::2], ids=policy_id)
@pytest.mark.parametrize("think_time_s", [0.0, 0.03])
def test_fast_path_matches_with_closed_loop_users(policy, think_time_s):
    for seed in range(3):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=60,
                               closed=(int(3 + seed), think_time_s))
        assert_identical(plain, fast, 60)


@pytest.mark.parametrize("policy", POLICIES + OTHER_POLICIES, ids=policy_id)
def test_fast_path_breaks_ties_as_simpy_does(policy):
    # Arrivals land exactly on iteration ends (1 s steps, arrivals on a 0.5 s grid): SimPy's order of
    # equal-time events (creation order) decides whether a step sees them.
    rng = np.random.default_rng(7)
    specs = [RequestSpec(i, 0.5 * int(t), int(p), int(o), int(o)) for i, (t, p, o) in
             enumerate(zip(np.sort(rng.integers(0, 40, 30)), rng.integers(1, 60, 30), rng.integers(1, 12, 30)))]
    plain, fast = run_both(policy, specs, ConstantCost(1.0), num_gpu_blocks=30, block_size=4)
    assert_identical(plain, fast, 30)


def test_simulate_gives_identical_results_on_both_paths():
    base = {"model": "llama-3-8b", "hardware": "h100-sxm",
            "workload": {"num_requests": 150, "arrival": {"process": "poisson", "rate_per_s": 20.0},
                         "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 1.0, "max": 8000},
                         "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 1024}}}
    for engine in ({"policy": "chunked_prefill", "max_num_batched_tokens": 512, "num_gpu_blocks": 600},
                   {"policy": "continuous", "num_gpu_blocks": 900},
                   {"policy": "static", "max_num_seqs": 16, "batch_timeout_s": 0.2}):
        a = simulate({**base, "engine": {**engine, "fast_path": "off"}}, seed=1)
        b = simulate({**base, "engine": {**engine, "fast_path": "on"}}, seed=1)
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
        pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
        assert a.summary.keys() == b.summary.keys()
        assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
        # every token gap and when it ended: the same pairs (in time order; equal-time gaps may differ in order)
        assert len(b.itl_gaps_s) == len(a.itl_gaps_s) == len(b.itl_end_s)
        pa, pb = (np.lexsort((np.asarray(r.itl_gaps_s), np.asarray(r.itl_end_s))) for r in (a, b))
        np.testing.assert_array_equal(np.asarray(a.itl_end_s)[pa], np.asarray(b.itl_end_s)[pb])
        np.testing.assert_array_equal(np.asarray(a.itl_gaps_s)[pa], np.asarray(b.itl_gaps_s)[pb])
        assert np.all(np.diff(np.asarray(b.itl_end_s)) >= 0)


def test_priority_classes_pass_through_and_priority_scheduling_runs_on_the_fast_path():
    cfg = {"engine": {"policy": "chunked_prefill", "max_num_batched_tokens": 256, "num_gpu_blocks": 300},
           "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 30.0},
                        "prompt_tokens": {"dist": "uniform", "min": 10, "max": 600},
                        "output_tokens": {"dist": "uniform", "min": 1, "max": 80},
                        "priority": {"classes": [0, 1], "weights": [0.3, 0.7]}}}
    a = simulate({**cfg, "engine": {**cfg["engine"], "fast_path": "off"}}, seed=2)
    b = simulate({**cfg, "engine": {**cfg["engine"], "fast_path": "on"}}, seed=2)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert a.summary.keys() == b.summary.keys() and "ttft_p99_ms_prio1" in b.summary
    cfg["engine"]["scheduling_policy"] = "priority"
    a = simulate({**cfg, "engine": {**cfg["engine"], "fast_path": "off"}}, seed=2)
    b = simulate({**cfg, "engine": {**cfg["engine"], "fast_path": "on"}}, seed=2)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert a.requests.num_preemptions.sum() > 0


@dataclass(frozen=True)
class ShortestFirst:
    """A policy written here, outside simcore and unregistered: running requests take all they have left
    (preempting the newest when KV runs out), then waiting ones are admitted whole, shortest prompt first.
    It offers no fast-path shortcut, and runs on the fast engine as it is."""
    name: ClassVar[str] = "shortest_first"
    holds_slots_until_drained: ClassVar[bool] = False
    max_num_seqs: int = 4

    def kv_tokens_needed(self, spec, max_model_len: int) -> int:
        return spec.num_prompt_tokens + spec.num_output_tokens

    def schedule(self, view) -> Batch:
        free, running, scheduled, preempted = view.num_free_blocks, list(view.running), [], []
        i = 0
        while i < len(running):
            req = running[i]
            need = view.blocks_to_hold(req, req.num_tokens)
            while need > free:
                victim = running.pop()
                preempted.append(victim.request_id)
                free += view.blocks_freed(victim)
                if victim is req:
                    break
            if preempted and preempted[-1] == req.request_id:
                break
            scheduled.append(Scheduled(req.request_id, req.num_uncomputed_tokens))
            free -= need
            i += 1
        if not preempted:
            for req in sorted(view.waiting, key=lambda r: (r.num_prompt_tokens, r.request_id)):
                need = view.blocks_to_hold(req, req.num_tokens)
                if len(running) + len(scheduled) - i >= self.max_num_seqs or need > free:
                    break
                scheduled.append(Scheduled(req.request_id, req.num_uncomputed_tokens))
                free -= need
        return Batch(tuple(scheduled), tuple(preempted))


def test_a_new_policy_runs_on_the_fast_path_without_touching_simcore():
    policy = ShortestFirst()
    num_preemptions = 0
    for seed in range(4):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, ConstantCost(0.01, 1e-4), num_gpu_blocks=30)
        assert_identical(plain, fast, 30)
        num_preemptions += plain[0].num_preemptions.sum()
    assert num_preemptions > 0


@dataclass(frozen=True)
class AlwaysQuiet(ChunkedPrefill):
    """A broken shortcut: claims a quiet step even when the decodes' KV growth does not fit."""

    def schedule_decodes(self, view):
        return QUIET if view.running and not view.waiting else super().schedule_decodes(view)


def test_a_shortcut_that_breaks_its_promise_fails_loudly():
    specs = [RequestSpec(i, 0.0, 30, 40) for i in range(3)]   # three decoders outgrow 8 blocks of 16
    limits = EngineLimits(9, 16, 512)
    with pytest.raises(SimulationError, match="answered a quiet step"):
        FastEngine(AlwaysQuiet(max_num_batched_tokens=64), ConstantCost(), limits, specs).simulate()
    run_both(ChunkedPrefill(max_num_batched_tokens=64), specs, ConstantCost(), 9)   # the honest one runs


def test_fast_path_on_refuses_what_it_does_not_model():
    # pipeline parallelism: batches in flight through the stages (simcore/pipeline.py), SimPy only
    cfg = {"model": "llama-3-70b", "hardware": "h200-sxm", "pipeline_parallel_size": 2,
           "engine": {"policy": "chunked_prefill", "fast_path": "on"},
           "workload": {"num_requests": 5, "arrival": {"process": "poisson", "rate_per_s": 5.0},
                        "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 3}}}
    with pytest.raises(Exception, match="fast_path: on, but pipeline parallelism"):
        simulate(cfg)
    cfg["engine"]["fast_path"] = "auto"   # auto falls back to the SimPy engine
    assert simulate(cfg).summary["num_finished"] == 5


def test_simulate_with_swap_and_prefix_caching_is_identical_on_both_paths():
    base = {"model": "llama-3-8b", "hardware": "h100-sxm",
            "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate_per_s": 25.0},
                         "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 1.0, "max": 4000},
                         "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.8, "max": 512}}}
    for engine in ({"policy": "continuous", "preemption_mode": "swap", "num_gpu_blocks": 400, "swap_space_gb": 0.05},
                   {"policy": "chunked_prefill", "enable_prefix_caching": True, "num_gpu_blocks": 500}):
        a = simulate({**base, "engine": {**engine, "fast_path": "off"}}, seed=3)
        b = simulate({**base, "engine": {**engine, "fast_path": "on"}}, seed=3)
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
        pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
        assert all(a.summary[k] == b.summary[k] or a.summary[k] != a.summary[k] for k in a.summary)
        assert a.requests.num_preemptions.sum() > 0


def test_vectorised_roofline_equals_step_time_bitwise():
    rng = np.random.default_rng(0)
    for _ in range(200):
        ctx = rng.integers(1, 8000, size=int(rng.integers(1, 300)))
        steps = np.arange(6)
        vec = ROOFLINE.decode_steps_time_s(len(ctx), ctx.sum() + len(ctx) * steps, len(ctx))
        one = [ROOFLINE.step_time_s(decode=(ctx + j).tolist(), num_logits=len(ctx)) for j in steps]
        fn = ROOFLINE.decode_step_time_fn(len(ctx), len(ctx))
        assert vec.tolist() == one == [fn(int(ctx.sum()) + len(ctx) * j) for j in steps]


def test_profile_cost_model_prices_from_sums_bitwise():
    from costmodels.selection import load_cost_model
    try:
        profile = load_cost_model("llama-3-8b__h100-sxm__tp1__bf16", get_model("llama-3-8b"), get_gpu("h100-sxm"))
    except Exception as e:   # the shipped profile is data: skip cleanly without it
        pytest.skip(f"no shipped H100 profile ({e})")
    rng = np.random.default_rng(1)
    for _ in range(200):
        ctx = rng.integers(1, 8000, size=int(rng.integers(1, 300))).tolist()
        prefill = [(int(rng.integers(1, 4000)), int(rng.integers(0, 4000)))] if rng.random() < 0.5 else []
        assert profile.step_time_sums_s(prefill, len(ctx), sum(ctx), None) == profile.step_time_s(prefill, ctx)
        assert profile.decode_step_time_fn(len(ctx))(sum(ctx)) == profile.step_time_s(decode=ctx)


# TGI, TRT-LLM and SGLang through their own `schedule_decodes`, in every mode; the knobs that gate their
# shortcut (TGI's max_waiting_tokens, SGLang's ratio decay) are short here so that quiet stretches happen
SHORTCUT_POLICIES = [
    Tgi(max_batch_prefill_tokens=256),
    Tgi(max_batch_prefill_tokens=1024, prefill_chunking=False, max_batch_size=5, max_waiting_tokens=3),
    TrtLlm(max_batch_size=6, max_num_tokens=512),
    TrtLlm(max_batch_size=6, max_num_tokens=512, capacity_scheduler_policy="MAX_UTILIZATION"),
    TrtLlm(max_batch_size=6, max_num_tokens=256, capacity_scheduler_policy="MAX_UTILIZATION",
           enable_chunked_context=True),
    TrtLlm(max_batch_size=8, max_num_tokens=256, enable_chunked_context=True),
    Sglang(chunked_prefill_size=128, max_prefill_tokens=256, max_running_requests=6, new_token_ratio_decay_steps=4),
    Sglang(chunked_prefill_size=64, max_prefill_tokens=256, enable_mixed_chunk=True, new_token_ratio_decay_steps=4),
]


@pytest.mark.parametrize("policy", SHORTCUT_POLICIES, ids=policy_id)
@pytest.mark.parametrize("cost", [ConstantCost(0.01, 1e-4), ROOFLINE], ids=["constant", "roofline"])
def test_tgi_trtllm_sglang_shortcuts_match_and_are_taken(policy, cost, monkeypatch):
    answers = {"quiet": 0, "admit": 0}
    decide = FastEngine.decide

    def counted(engine, now):   # every shortcut answer passes through decide (a quiet one skips _start_shortcut)
        decision = decide(engine, now)
        if isinstance(decision, DecodeShortcut):
            answers["quiet" if decision.is_quiet else "admit"] += 1
        return decision
    monkeypatch.setattr(FastEngine, "decide", counted)
    for seed in range(5):
        specs = random_specs(seed)
        plain, fast = run_both(policy, specs, cost, num_gpu_blocks=40)
        assert_identical(plain, fast, 40)
    if policy.schedule_decodes is None:   # TGI without chunking: not offered (policies/tgi.py says why)
        assert answers["quiet"] == answers["admit"] == 0
        return
    assert answers["quiet"] > 5   # quiet stretches are taken (admissions too, where the policy offers them)
    if policy.name == "sglang" or (policy.name == "trtllm" and not policy.enable_chunked_context):
        assert answers["admit"] > 0

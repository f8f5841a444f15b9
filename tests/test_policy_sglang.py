"""SGLang scheduler decisions on hand-built views (docs/engines.md section 4)."""
import pytest

from policies.sglang import Sglang, SglangState
from simcore.batch import Batch, Scheduled
from simcore.request import RequestSpec
from tests.engine_views import decoding, prefilling, view, waiting

POLICY = Sglang()
INIT = POLICY.init_ratio
DECAY = (POLICY.init_ratio - POLICY.min_ratio) / POLICY.new_token_ratio_decay_steps


def test_defaults_follow_sglang():
    assert INIT == 0.7 and POLICY.min_ratio == pytest.approx(0.098)
    assert POLICY.chunked_prefill_size == 8192 and POLICY.max_prefill_tokens == 16384


def test_a_prefill_step_runs_alone_and_leaves_the_ratio_unchanged():
    running = [decoding(0, 100, 5, max_new=50)]
    batch = POLICY.schedule(view([waiting(1, 200, max_new=50)], running, state=SglangState(INIT)))
    assert batch == Batch((Scheduled(1, 200),), policy_state=SglangState(INIT))


def test_admission_charges_running_requests_the_ratio_of_their_remaining_output():
    running = [decoding(0, 100, 5, max_new=50)]  # 100 - 5 = 95 output tokens may remain
    queue = [waiting(1, 200, max_new=50)]          # charged 200 + 100 tokens
    # 23 free blocks = 368 tokens: 368 - 0.7 x 95 > 300 admits it ...
    assert POLICY.schedule(view(queue, running, free=23, state=SglangState(INIT))).scheduled == (Scheduled(1, 200),)
    # ... 368 - 1.0 x 95 < 300 does not: the batch is marked full and the running request decodes
    assert POLICY.schedule(view(queue, running, free=23, state=SglangState(1.0))) == Batch(
        (Scheduled(0, 1),), policy_state=SglangState(1.0 - DECAY, frozenset({0})))


def test_a_full_batch_is_not_refilled_until_a_running_request_leaves():
    queue = [waiting(1, 200, max_new=50)]
    full = SglangState(INIT, frozenset({0}))
    assert POLICY.schedule(view(queue, [decoding(0, 100, 5)], state=full)) == Batch(
        (Scheduled(0, 1),), policy_state=SglangState(INIT - DECAY, frozenset({0})))
    # request 0 finished: admission is tried again
    assert POLICY.schedule(view(queue, [decoding(2, 100, 5)], state=full)) == Batch(
        (Scheduled(1, 200),), policy_state=SglangState(INIT))


def test_ratio_decays_to_its_floor_and_resets_when_nothing_runs():
    floor = SglangState(POLICY.min_ratio)
    assert POLICY.schedule(view([], [decoding(0, 100, 5)], state=floor)).policy_state == floor
    assert POLICY.schedule(view([waiting(1, 100)], [], state=SglangState(0.3))).policy_state == SglangState(INIT)


def test_retraction_takes_the_fewest_generated_then_the_longest_prompt():
    # every request's next token needs a new block; one block is free
    running = [decoding(0, 87, 10, max_new=200), decoding(1, 79, 2, max_new=200), decoding(2, 95, 2, max_new=200)]
    batch = POLICY.schedule(view([], running, free=1, now=5.0, state=SglangState(0.2)))
    # request 2 (2 generated, 95-token prompt) goes; then the ratio jumps to (12 + 20 x 2) / (400 + 1)
    assert batch == Batch((Scheduled(0, 1), Scheduled(1, 1)), preempt=(2,),
                          policy_state=SglangState(min(1.0, 52 / 401), None, ((2, 5.0),)))


def test_retraction_ties_go_to_the_latest_admitted():
    running = [decoding(0, 95, 2, max_new=200), decoding(1, 95, 2, max_new=200)]
    assert POLICY.schedule(view([], running, free=1, state=SglangState(INIT))).preempt == (1,)


def test_retracted_requests_rejoin_the_back_of_the_queue():
    retracted = waiting(0, 100, generated=7, preemptions=1, arrival=0.0)  # retracted at t = 5
    fresh = waiting(1, 100, arrival=3.0)
    state = SglangState(INIT, None, ((0, 5.0),))
    batch = POLICY.schedule(view([retracted, fresh], [], state=state))
    assert batch == Batch((Scheduled(1, 100), Scheduled(0, 107)), policy_state=SglangState(INIT))


def test_a_long_prompt_becomes_the_one_chunked_request_and_continues_first():
    assert POLICY.schedule(view([waiting(0, 10000, max_new=10), waiting(1, 200, max_new=10)])).scheduled == (
        Scheduled(0, 8192),)
    running = [prefilling(0, 10000, 8192, max_new=10)]
    assert POLICY.schedule(view([waiting(1, 200, max_new=10)], running, state=SglangState(INIT))).scheduled == (
        Scheduled(0, 1808), Scheduled(1, 200))


def test_max_prefill_tokens_only_stops_a_second_request():
    policy = Sglang(chunked_prefill_size=0, max_prefill_tokens=1000)
    assert policy.schedule(view([waiting(0, 1500), waiting(1, 100)])).scheduled == (Scheduled(0, 1500),)
    assert policy.schedule(view([waiting(1, 100), waiting(0, 1500)])).scheduled == (Scheduled(1, 100),)


def test_max_running_requests_marks_the_batch_full():
    policy = Sglang(max_running_requests=2)
    batch = policy.schedule(view([waiting(1, 100), waiting(2, 100)], [decoding(0, 100, 5)], state=SglangState(INIT)))
    # the mark covers the running batch the admission joins: any of 0 and 1 leaving clears it
    assert batch == Batch((Scheduled(1, 100),), policy_state=SglangState(INIT, frozenset({0, 1})))


def test_a_batch_filled_from_an_idle_start_is_cleared_when_one_leaves():
    # admitting max_running_requests with nothing running marks the batch full; it must clear when one of
    # those requests leaves (SGLang resets batch_is_full whenever the running batch shrinks)
    policy = Sglang(max_running_requests=2)
    batch = policy.schedule(view([waiting(0, 100), waiting(1, 100), waiting(2, 100)]))
    assert [s.request_id for s in batch.scheduled] == [0, 1] and batch.policy_state.full_ids == frozenset({0, 1})
    after = policy.schedule(view([waiting(2, 100)], [decoding(1, 100, 5)], state=batch.policy_state))
    assert after.scheduled == (Scheduled(2, 100),)


def test_mixed_chunk_puts_the_decodes_in_the_prefill_step():
    policy = Sglang(enable_mixed_chunk=True)
    batch = policy.schedule(view([waiting(1, 200)], [decoding(0, 100, 5)], state=SglangState(INIT)))
    assert batch == Batch((Scheduled(0, 1), Scheduled(1, 200)), policy_state=SglangState(INIT))


def test_kv_needed_covers_the_admission_estimate():
    assert POLICY.kv_tokens_needed(RequestSpec(0, 0.0, 100, 20, 50), 8192) == 151
    assert POLICY.kv_tokens_needed(RequestSpec(0, 0.0, 100, 20, None), 8192) == 100 + 4096 + 1

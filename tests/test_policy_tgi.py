"""TGI router v3 decisions on hand-built views (docs/engines.md section 2)."""
import pytest

from policies.tgi import Tgi, TgiState
from simcore.batch import Batch, Scheduled
from simcore.engine import SimulationError
from simcore.request import RequestSpec
from tests.engine_views import decoding, prefilling, view, waiting


def decodes(rids):
    return tuple(Scheduled(r, 1) for r in rids)


def test_fresh_batch_reserves_prompt_plus_max_new_and_chunks_the_last_prompt():
    v = view([waiting(0, 3000, max_new=200), waiting(1, 2000, max_new=200)])
    # reserve input + max_new - 1; the second prompt is cut to what is left of max_batch_prefill_tokens
    assert Tgi().schedule(v) == Batch((Scheduled(0, 3000, 3199), Scheduled(1, 1096, 2199)),
                                      policy_state=TgiState(1, False))


def test_without_chunking_a_prompt_that_overflows_the_prefill_budget_waits():
    v = view([waiting(0, 3000, max_new=200), waiting(1, 2000, max_new=200)])
    assert Tgi(prefill_chunking=False).schedule(v) == Batch((Scheduled(0, 3000, 3199),),
                                                            policy_state=TgiState(1, False))


def test_waiting_served_ratio_holds_new_requests_back_until_enough_queue():
    running = [decoding(r, 100, 5) for r in range(10)]
    queue = [waiting(10, 100, max_new=50), waiting(11, 100, max_new=50)]
    policy = Tgi(prefill_chunking=False)
    # 2 waiting < floor(10 running * 0.3): keep decoding, count the step
    assert policy.schedule(view(queue, running, state=TgiState(3))) == Batch(
        decodes(range(10)), policy_state=TgiState(4, False))
    # after max_waiting_tokens decode steps any number is onboarded, in a prefill-only forward
    assert policy.schedule(view(queue, running, state=TgiState(20))) == Batch(
        (Scheduled(10, 100, 199), Scheduled(11, 100, 199)), policy_state=TgiState(1, True))
    # ... which is always followed by a decode of everything, without looking at the queue
    assert policy.schedule(view(queue, running, state=TgiState(1, True))) == Batch(
        decodes(range(10)), policy_state=TgiState(2, False))


def test_enough_queue_onboards_but_not_a_partial_min_size_batch():
    running = [decoding(r, 100, 5) for r in range(10)]
    queue = [waiting(10, 100, max_new=50), waiting(11, 100, max_new=50), waiting(12, 100, max_new=50)]
    policy = Tgi(prefill_chunking=False)
    free = 2 * 13  # 199 tokens = 13 blocks each: the third reservation does not fit
    assert policy.schedule(view(queue, running, free=free + 13, state=TgiState(1))).scheduled == (
        Scheduled(10, 100, 199), Scheduled(11, 100, 199), Scheduled(12, 100, 199))
    # only 2 of the min_size 3 fit: everything goes back, the running batch decodes
    assert policy.schedule(view(queue, running, free=free, state=TgiState(1))) == Batch(
        decodes(range(10)), policy_state=TgiState(2, False))


def test_max_batch_size_caps_what_joins_a_running_batch_without_chunking():
    running = [decoding(r, 100, 5) for r in range(3)]
    queue = [waiting(r, 100, max_new=50) for r in (3, 4, 5)]
    batch = Tgi(prefill_chunking=False, max_batch_size=5).schedule(view(queue, running, state=TgiState(1)))
    assert batch == Batch((Scheduled(3, 100, 199), Scheduled(4, 100, 199)), policy_state=TgiState(1, True))


def test_with_chunking_new_prompts_ride_in_the_running_batch_forward():
    running = [decoding(r, 100, 5) for r in range(3)]
    # budget 4096 - 3 tokens already in the forward, rounded up to the block size (16) = 4096
    batch = Tgi().schedule(view([waiting(3, 5000, max_new=100)], running, state=TgiState(1)))
    assert batch == Batch(decodes(range(3)) + (Scheduled(3, 4096, 5099),), policy_state=TgiState(1, True))


def test_decode_forward_carries_the_next_chunk_of_an_unfinished_prompt():
    running = [prefilling(0, 9000, 4096)] + [decoding(r, 100, 5) for r in (1, 2, 3)]
    # server side: max_batch_prefill_tokens - (batch size - 1) for the oldest prefilling request
    batch = Tgi().schedule(view([waiting(4, 100)], running, state=TgiState(1, True)))
    # (with chunking the step counter is never read, so it is not advanced: TgiState)
    assert batch == Batch((Scheduled(0, 4093),) + decodes((1, 2, 3)), policy_state=TgiState(1, False))


def test_head_of_line_blocking_on_the_kv_reservation():
    running = [decoding(0, 100, 5)]
    queue = [waiting(1, 4000, max_new=800), waiting(2, 100, max_new=50)]  # 4799 tokens = 300 blocks
    batch = Tgi().schedule(view(queue, running, free=200, state=TgiState(1)))
    assert batch == Batch(decodes([0]), policy_state=TgiState(1, False))


def test_prompt_longer_than_the_prefill_budget_without_chunking_fails_loudly():
    with pytest.raises(SimulationError, match="max_batch_prefill_tokens"):
        Tgi(prefill_chunking=False).schedule(view([waiting(0, 5000, max_new=10)]))


def test_max_batch_total_tokens_limits_the_allocator():
    policy = Tgi(max_batch_total_tokens=1600)  # 100 of the 1000 blocks
    queue = [waiting(r, 1000, max_new=100) for r in range(3)]  # 1099 tokens = 69 blocks each
    assert policy.schedule(view(queue, free=1000)).scheduled == (Scheduled(0, 1000, 1099),)
    with pytest.raises(SimulationError, match="max_batch_total_tokens"):
        policy.schedule(view([waiting(0, 3000, max_new=200)], free=1000))
    with pytest.raises(SimulationError, match="exceeds the KV pool"):
        Tgi(max_batch_total_tokens=10**6).schedule(view([waiting(0, 100)], free=1000))


def test_kv_needed_is_the_reservation_and_bad_knobs_are_refused():
    assert Tgi().kv_tokens_needed(RequestSpec(0, 0.0, 100, 20, 50), 8192) == 149
    assert Tgi().kv_tokens_needed(RequestSpec(0, 0.0, 100, 20, None), 8192) == 8191
    with pytest.raises(ValueError, match="max_batch_size"):
        Tgi(max_batch_size=0)

"""TensorRT-LLM capacity + micro-batch scheduler decisions on hand-built views (docs/engines.md section 3)."""
import pytest

from policies.trtllm import TrtLlm
from simcore.batch import Batch, Scheduled
from simcore.engine import SimulationError
from simcore.request import RequestSpec
from tests.engine_views import decoding, prefilling, view, waiting

MU = "MAX_UTILIZATION"


def test_guaranteed_no_evict_reserves_to_completion_with_head_of_line_blocking():
    running = [decoding(0, 100, 5, max_new=50, blocks=13)]  # holds its 200-token reservation
    queue = [waiting(1, 1000, max_new=100),   # 1100 tokens = 69 blocks: fits in 100
             waiting(2, 2000, max_new=100),   # 132 blocks: does not fit in the 31 left
             waiting(3, 50, max_new=100)]     # would fit, but FCFS stops at the head
    assert TrtLlm().schedule(view(queue, running, free=100)) == Batch(
        (Scheduled(0, 1), Scheduled(1, 1000, 1100)))


def test_max_num_tokens_stops_the_micro_batch_at_the_first_misfit():
    running = [decoding(0, 100, 5, max_new=50, blocks=13)]
    queue = [waiting(1, 1000, max_new=100), waiting(2, 600, max_new=100), waiting(3, 10, max_new=100)]
    assert TrtLlm(max_num_tokens=1500).schedule(view(queue, running, free=1000)) == Batch(
        (Scheduled(0, 1), Scheduled(1, 1000, 1100)))


def test_context_longer_than_max_num_tokens_without_chunking_is_an_error():
    with pytest.raises(SimulationError, match="enable_chunked_context"):
        TrtLlm(max_num_tokens=512).schedule(view([waiting(0, 600, max_new=10)]))


def test_max_batch_size_caps_the_capacity_scheduler():
    running = [decoding(0, 100, 5, max_new=50, blocks=13), decoding(1, 100, 5, max_new=50, blocks=13)]
    batch = TrtLlm(max_batch_size=2).schedule(view([waiting(2, 10, max_new=10)], running))
    assert batch == Batch((Scheduled(0, 1), Scheduled(1, 1)))


def test_max_utilization_pauses_the_most_recently_started():
    running = [decoding(0, 96, 1), decoding(1, 96, 1)]  # both need a new block for their next token
    batch = TrtLlm(capacity_scheduler_policy=MU).schedule(view([waiting(2, 10)], running, free=1))
    assert batch == Batch((Scheduled(0, 1),), preempt=(1,))


def test_max_utilization_resumes_an_earlier_paused_request_by_pausing_a_later_one():
    paused = waiting(0, 300, generated=20, preemptions=1)  # recomputes prompt + 20 tokens: 20 blocks
    running = [decoding(1, 96, 1)]                            # holds 6 blocks
    batch = TrtLlm(capacity_scheduler_policy=MU).schedule(view([paused], running, free=15))
    assert batch == Batch((Scheduled(0, 320, 320),), preempt=(1,))


def test_max_utilization_stops_at_a_new_request_when_nothing_later_has_started():
    running = [decoding(0, 96, 1)]
    batch = TrtLlm(capacity_scheduler_policy=MU).schedule(view([waiting(1, 100), waiting(2, 10)], running, free=3))
    assert batch == Batch((Scheduled(0, 1),))  # request 1 needs 7 blocks; 2 waits behind it


def chunking_view():
    running = [decoding(0, 100, 5, max_new=50, blocks=13), decoding(1, 100, 5, max_new=50, blocks=13),
               prefilling(2, 400, 250, max_new=100, blocks=32)]  # holds its 500-token reservation; 150 to go
    return view([waiting(3, 50, max_new=100)], running, free=100)


def test_fcfs_context_chunking_gives_the_leftover_budget_in_arrival_order_in_block_multiples():
    policy = TrtLlm(max_num_tokens=100, enable_chunked_context=True)
    # 98 tokens left after two decodes: request 2 gets 96 (a block multiple), request 3 the last 2 -> 0
    assert policy.schedule(chunking_view()) == Batch((Scheduled(2, 96), Scheduled(0, 1), Scheduled(1, 1)))


def test_equal_progress_context_chunking_grows_every_context_one_unit_per_round():
    policy = TrtLlm(max_num_tokens=100, enable_chunked_context=True, context_chunking_policy="EQUAL_PROGRESS")
    assert policy.schedule(chunking_view()) == Batch(
        (Scheduled(2, 48), Scheduled(3, 50, 150), Scheduled(0, 1), Scheduled(1, 1)))


def test_contexts_that_all_fit_are_not_chunked():
    policy = TrtLlm(enable_chunked_context=True)
    assert policy.schedule(chunking_view()).scheduled[:2] == (Scheduled(2, 150), Scheduled(3, 50, 150))


def test_kv_needed_and_knob_validation():
    spec = RequestSpec(0, 0.0, 100, 20, 50)
    assert TrtLlm().kv_tokens_needed(spec, 8192) == 150
    assert TrtLlm(capacity_scheduler_policy=MU).kv_tokens_needed(spec, 8192) == 120
    with pytest.raises(ValueError, match="capacity_scheduler_policy"):
        TrtLlm(capacity_scheduler_policy="STATIC")
    with pytest.raises(ValueError, match="context_chunking_policy"):
        TrtLlm(context_chunking_policy="FCFS")

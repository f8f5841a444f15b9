"""Policy decisions on hand-built views, asserted exactly (no SimPy)."""
from policies import ChunkedPrefill, Continuous, Static
from policies.static import StaticBatchState
from simcore.batch import Batch, Scheduled as S
from simcore.request import Status
from tests.helpers import req, running, view

# ---- chunked_prefill (vLLM V1) ----


def test_chunked_running_first_then_waiting_fcfs_under_the_budget():
    v = view(waiting=[req(10, 300), req(11, 50)], running_=[running(1, 100, 5), running(2, 100, 7)])
    b = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=256).schedule(v)
    # two decodes, then the head of waiting gets the remaining 254 tokens; 11 gets nothing (budget 0)
    assert b == Batch((S(1, 1), S(2, 1), S(10, 254)))


def test_chunked_partial_prefill_in_running_continues_first():
    partial = req(3, 1000, computed=512, blocks=32, status=Status.RUNNING)
    v = view(waiting=[req(10, 100)], running_=[running(1, 100, 5), partial])
    b = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=512).schedule(v)
    assert b == Batch((S(1, 1), S(3, 488), S(10, 23)))


def test_chunked_long_prefill_threshold_caps_each_request():
    v = view(waiting=[req(10, 1000), req(11, 1000)])
    b = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=512, long_prefill_token_threshold=200).schedule(v)
    assert b == Batch((S(10, 200), S(11, 200)))


def test_chunked_head_of_line_blocking_on_kv():
    # head needs 63 blocks for its whole prompt (scheduler_reserve_full_isl); 10 free -> nobody is admitted
    v = view(waiting=[req(10, 1000), req(11, 16)], free=10)
    assert ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=8192).schedule(v) == Batch()


def test_chunked_max_num_seqs_limits_admissions():
    v = view(waiting=[req(10, 10), req(11, 10)], running_=[running(1, 100, 5)])
    assert ChunkedPrefill(max_num_seqs=2, max_num_batched_tokens=512).schedule(v) == Batch((S(1, 1), S(10, 10)))


def test_chunked_preempts_the_most_recent_and_admits_nobody():
    # A's next token opens a new block (computed 32 = 2 full blocks); no block free -> preempt the tail (B).
    a = running(1, 30, 3)            # computed 32 -> needs block 3
    b = running(2, 10, 2)            # 1 block
    v = view(waiting=[req(10, 5)], running_=[a, b], free=0)
    assert ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=512).schedule(v) == Batch((S(1, 1),), (2,))


def test_chunked_preempts_itself_when_alone():
    a = running(1, 30, 3)
    v = view(running_=[a], free=0)
    assert ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=512).schedule(v) == Batch((), (1,))


# ---- continuous (vLLM V0 / Orca) ----


def test_continuous_admission_step_is_prefill_only():
    v = view(waiting=[req(10, 100), req(11, 200)], running_=[running(1, 100, 5)])
    b = Continuous(max_num_seqs=8, max_num_batched_tokens=8192).schedule(v)
    assert b == Batch((S(10, 100), S(11, 200)))


def test_continuous_whole_prompts_stop_at_the_budget():
    v = view(waiting=[req(10, 300), req(11, 300), req(12, 10)])
    b = Continuous(max_num_seqs=8, max_num_batched_tokens=500).schedule(v)
    assert b == Batch((S(10, 300),))  # 11 does not fit whole; FCFS stops there (12 is not skipped ahead)


def test_continuous_decodes_when_nothing_can_be_admitted():
    v = view(waiting=[req(10, 100)], running_=[running(1, 100, 5), running(2, 50, 3)])
    b = Continuous(max_num_seqs=2, max_num_batched_tokens=8192).schedule(v)
    assert b == Batch((S(1, 1), S(2, 1)))


def test_continuous_watermark_keeps_one_percent_free():
    # 1000 blocks -> 10 kept free; a 100-token prompt needs 7 blocks
    assert Continuous().schedule(view(waiting=[req(10, 100)], free=16)) == Batch()
    assert Continuous().schedule(view(waiting=[req(10, 100)], free=17)) == Batch((S(10, 100),))


def test_continuous_max_reservation_reserves_prompt_plus_max_tokens():
    v = view(waiting=[req(10, 100, max_new=200), req(11, 100, max_new=300)], free=30)
    b = Continuous(kv_reservation="max").schedule(v)
    # 10 reserves 300 tokens = 19 blocks; 11 would need 25 more -> head-of-line stop
    assert b == Batch((S(10, 100, 300),))


def test_continuous_mixed_puts_decodes_first():
    v = view(waiting=[req(10, 100)], running_=[running(1, 100, 5)])
    b = Continuous(mix_prefill_decode=True).schedule(v)
    assert b == Batch((S(1, 1), S(10, 100)))


def test_continuous_swapped_requests_block_prefills_and_swap_back_in():
    swapped = req(5, 40, computed=44, generated=5, blocks=3, status=Status.SWAPPED)
    v = view(waiting=[swapped, req(10, 100)], running_=[running(1, 100, 5)])
    b = Continuous().schedule(v)
    assert b == Batch((S(1, 1), S(5, 1)))


# ---- static (FasterTransformer / HF generate) ----


def test_static_forms_a_padded_batch_when_idle():
    v = view(waiting=[req(10, 100, max_new=50), req(11, 300, max_new=20), req(12, 5, max_new=5)])
    b = Static(max_num_seqs=2).schedule(v)
    # rows padded to 300 prompt tokens, each reserving 300 + 50 tokens of KV
    assert b == Batch((S(10, 100, 350), S(11, 300, 350)), padded_shape=((300, 0), (300, 0)),
                      policy_state=StaticBatchState(300))   # carried while the batch runs


def test_static_decode_step_computes_finished_rows_as_padding():
    a = running(1, 300, 4)
    done = req(2, 100, 4, computed=103, generated=4, blocks=22, status=Status.DRAINING)
    b = Static().schedule(view(waiting=[req(10, 5)], running_=[a], draining=[done]))
    assert b == Batch((S(1, 1),), padded_shape=((1, 303), (1, 303)))  # nobody joins


def test_static_reserves_max_model_len_without_max_tokens():
    # no max_tokens: each row reserves up to max_model_len (2048 tokens = 128 blocks)
    v = view(waiting=[req(10, 100), req(11, 100)], free=200, max_model_len=2048)
    assert len(Static().schedule(v).scheduled) == 1


def test_static_waits_for_the_batch_to_fill_until_the_timeout():
    v = view(waiting=[req(10, 100, max_new=10)], now=0.5)
    assert Static(max_num_seqs=4, batch_timeout_s=2.0).schedule(v) == Batch(wake_at_s=2.0)

"""Exact engine timelines with a constant-cost stub (1 s per iteration), computed by hand."""
from policies import ChunkedPrefill, Continuous, Static
from simcore.log import RequestEvent as E
from simcore.request import RequestSpec
from tests.helpers import run_engine

# A: 3 output tokens, B: 1, both at t=0; C: 1 token, arrives at t=0.5 while the first step runs.
SPECS = [RequestSpec(0, 0.0, 4, 3, 3), RequestSpec(1, 0.0, 4, 1, 3), RequestSpec(2, 0.5, 4, 1, 3)]


def timeline(policy):
    df, log, _ = run_engine(policy, SPECS)
    return [(r.request_id, r.first_token_s, r.finish_s) for r in df.itertuples()], log


def test_static_holds_the_batch_until_the_longest_output_ends():
    rows, log = timeline(Static(max_num_seqs=2))
    # [0,1] padded prefill of A and B; B done at 1 but its slot is padding in [1,2] and [2,3];
    # C joins only after the batch drains at 3 and is prefilled in [3,4].
    assert rows == [(0, 1.0, 3.0), (1, 1.0, 1.0), (2, 4.0, 4.0)]
    assert [(it.prefill_tokens, it.decode_tokens, it.padding_tokens, it.num_seqs) for it in log.iterations] == [
        (8, 0, 0, 2), (0, 1, 1, 1), (0, 1, 1, 1), (4, 0, 0, 1)]  # (prefill, decode, padding, seqs)


def test_continuous_prefill_first_stalls_decodes_for_a_new_prompt():
    rows, _ = timeline(Continuous(max_num_seqs=8, max_num_batched_tokens=64))
    # [0,1] prefill A+B; [1,2] prefill-only step for C (A's decode waits); [2,3], [3,4] decode A.
    assert rows == [(0, 1.0, 4.0), (1, 1.0, 1.0), (2, 2.0, 2.0)]


def test_continuous_mixed_steps_as_in_orca():
    rows, _ = timeline(Continuous(max_num_seqs=8, max_num_batched_tokens=64, mix_prefill_decode=True))
    assert rows == [(0, 1.0, 3.0), (1, 1.0, 1.0), (2, 2.0, 2.0)]


def test_chunked_prefill_runs_decodes_beside_a_new_prompt():
    rows, _ = timeline(ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64))
    # [1,2] holds A's decode and C's prefill together.
    assert rows == [(0, 1.0, 3.0), (1, 1.0, 1.0), (2, 2.0, 2.0)]


def test_chunked_prefill_splits_a_prompt_longer_than_the_budget():
    df, log, _ = run_engine(ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=4),
                            [RequestSpec(0, 0.0, 10, 2)])
    # 10 prompt tokens in chunks of 4, 4, 2 -> first token at 3, the second at 4.
    assert [it.prefill_tokens for it in log.iterations] == [4, 4, 2, 0]
    assert (df.first_token_s[0], df.finish_s[0]) == (3.0, 4.0)


def test_batch_timeout_waits_for_the_static_batch_to_fill():
    specs = [RequestSpec(0, 0.0, 4, 1, 1), RequestSpec(1, 0.3, 4, 1, 1), RequestSpec(2, 5.0, 4, 1, 1)]
    df, _, _ = run_engine(Static(max_num_seqs=2, batch_timeout_s=1.0), specs)
    # The batch fills at 0.3 (two requests) and runs [0.3, 1.3]; C waits its full timeout: [6, 7].
    assert list(df.finish_s) == [1.3, 1.3, 7.0]


def test_recompute_preemption_evicts_the_newest_and_reprefills_it():
    # 2 blocks of 4 tokens: A (prompt 3, out 3) and B (prompt 3, out 3) both fit for prefill, but when A
    # grows to a 5th token it needs a second block held by nobody... B holds one: B (newest) is preempted.
    specs = [RequestSpec(0, 0.0, 3, 3), RequestSpec(1, 0.0, 3, 3)]
    df, log, _ = run_engine(ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64), specs,
                            num_gpu_blocks=3, block_size=4)
    assert df.num_preemptions.tolist() == [0, 1]
    assert log.preemptions[0].request_id == 1
    assert (df.status == "finished").all()
    # Both prefill in [0,1] and decode in [1,2]; at 2 A's 5th token needs a block B holds: B is preempted;
    # A ends at 3; B recomputes its 5 tokens in [3,4] and samples its last token. Every change, in order:
    expected = [
        E(0.0, 0, "arrived"), E(0.0, 1, "arrived"), E(0.0, 0, "admitted"), E(0.0, 1, "admitted"),
        E(1.0, 0, "first_token"), E(1.0, 1, "first_token"), E(2.0, 1, "preempted"), E(3.0, 0, "finished"),
        E(3.0, 1, "admitted"), E(4.0, 1, "finished")]
    assert log.events == expected
    # the fast engine, asked to keep its events, logs the same timeline
    from simcore.costmodel import ConstantCost
    from simcore.engine import EngineLimits
    from simcore.fast.engine import FastEngine
    fast = FastEngine(ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64), ConstantCost(1.0),
                      EngineLimits(3, 4, 8192), specs, record_events=True).simulate()
    assert fast.events == expected


def closed_loop(think_time_s, specs):
    import simpy
    from simcore.arrivals import ClosedLoopUsers
    from simcore.costmodel import ConstantCost
    from simcore.engine import Engine, EngineLimits
    from simcore.log import EngineLog
    from simcore.metrics import requests_frame
    env, log = simpy.Environment(), EngineLog()
    engine = Engine(env, ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64), ConstantCost(1.0),
                    EngineLimits(1000, 16, 64), log)
    users = ClosedLoopUsers(env, specs, 2, engine.submit, think_time_s)
    engine.on_done = users.on_done
    users.start()
    env.run()
    return requests_frame(log)


def test_closed_loop_users_send_the_next_request_when_the_previous_ends():
    specs = [RequestSpec(i, 0.0, 4, 2) for i in range(4)]
    df = closed_loop(0.0, specs)
    # [0,1] prefill A,B; [1,2] decode -> both finish at 2; C, D sent at 2; finish at 4
    assert list(zip(df.arrival_s, df.finish_s)) == [(0.0, 2.0), (0.0, 2.0), (2.0, 4.0), (2.0, 4.0)]
    df = closed_loop(0.5, specs)
    assert list(zip(df.arrival_s, df.finish_s)) == [(0.0, 2.0), (0.0, 2.0), (2.5, 4.5), (2.5, 4.5)]


def test_a_rejected_request_frees_its_user_at_once():
    specs = [RequestSpec(0, 0.0, 100, 2), RequestSpec(1, 0.0, 4, 2), RequestSpec(2, 0.0, 4, 2)]
    df = closed_loop(0.0, specs)  # request 0 exceeds max_model_len 64: user 0 sends request 2 at t=0
    assert df.status.tolist() == ["rejected", "finished", "finished"]
    assert df.reject_reason[0] == "exceeds_max_model_len"
    assert list(df.finish_s[1:]) == [2.0, 2.0]


def test_request_that_can_never_fit_the_kv_pool_is_rejected():
    df, _, _ = run_engine(ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64),
                          [RequestSpec(0, 0.0, 100, 100), RequestSpec(1, 0.0, 10, 5)], num_gpu_blocks=10)
    assert df.status.tolist() == ["rejected", "finished"]
    assert df.reject_reason[0] == "exceeds_kv_capacity"


def test_swap_preemption_keeps_progress_and_pays_the_transfer():
    from simcore.costmodel import ConstantCost
    specs = [RequestSpec(0, 0.0, 3, 3), RequestSpec(1, 0.0, 3, 3)]
    policy = Continuous(max_num_seqs=8, max_num_batched_tokens=64, watermark=0.0)
    swap, log_s, eng = run_engine(policy, specs, num_gpu_blocks=3, block_size=4, preemption_mode="swap")
    rec, log_r, _ = run_engine(policy, specs, num_gpu_blocks=3, block_size=4, preemption_mode="recompute")
    assert swap.num_preemptions.tolist() == rec.num_preemptions.tolist() == [0, 1]
    # recompute re-prefills B's prompt + generated tokens; swap never prefills B again
    assert sum(it[2] for it in log_r.iterations) > sum(it[2] for it in log_s.iterations) == 6
    # each swap moves one 4-token block of 1000 B/token over 1 GB/s: 4 us out, 4 us back in
    extra = sorted(round(it[1] - 1.0, 9) for it in log_s.iterations if it[1] != 1.0)
    assert extra == [4e-06, 4e-06]

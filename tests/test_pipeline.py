"""The pipelined engine (simcore/pipeline.py): exact timelines with a constant per-stage cost, worked out by
hand; one stage reproduces the plain engine bitwise; microbatches in flight raise throughput; KV invariants
hold under preemption."""
import numpy as np
import pytest
import simpy

from policies import ChunkedPrefill, Continuous
from simcore.arrivals import open_loop
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.log import EngineLog
from simcore.metrics import requests_frame
from simcore.pipeline import ConstantStageCost, PipelinedEngine
from simcore.request import RequestSpec, Status
from tests.test_properties import random_specs

CHUNKED = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=64)


def run(specs, policy=CHUNKED, cost=None, num_stages=2, num_gpu_blocks=1000, block_size=16, max_model_len=8192,
        engine_cls=PipelinedEngine, max_batches_in_flight=None):
    env, log = simpy.Environment(), EngineLog()
    limits = EngineLimits(num_gpu_blocks, block_size, max_model_len)
    cost = cost or ConstantStageCost(num_stages, 1.0)
    extra = ({"num_stages": num_stages, "max_batches_in_flight": max_batches_in_flight}
             if engine_cls is PipelinedEngine else {})
    engine = engine_cls(env, policy, cost, limits, log, **extra)
    env.process(open_loop(env, sorted(specs, key=lambda s: s.arrival_s), engine.submit))
    env.run()
    return requests_frame(log), log, engine


def test_second_request_rides_in_the_next_microbatch():
    # A (3 tokens) at 0, B (2 tokens) at 0.5; 2 stages of 1 s. Batch 0 = A's prefill: stage 0 [0,1],
    # stage 1 [1,2]. B arrives with a queue slot free: batch 1 = B's prefill, scheduled at 0.5, waits for
    # stage 0 until 1: [1,2], [2,3]. From then on each output brings its request back for the next batch:
    # A decodes in [2,4], [4,6]; B in [3,5]. Back to back (2 s a step), B would finish at 6.
    df, log, engine = run([RequestSpec(0, 0.0, 4, 3), RequestSpec(1, 0.5, 4, 2)])
    assert list(zip(df.request_id, df.first_token_s, df.finish_s)) == [(0, 2.0, 6.0), (1, 3.0, 5.0)]
    # (scheduled, until its output, prefill tokens, decode tokens) per batch, in the order they returned
    assert [it[:4] for it in log.iterations] == [(0.0, 2.0, 4, 0), (0.5, 2.5, 4, 0), (2.0, 2.0, 0, 1),
                                                 (3.0, 2.0, 0, 1), (4.0, 2.0, 0, 1)]
    # (entered stage 0, batches in flight when scheduled, idle stage-seconds while it was in the pipeline):
    # the first batch has stage 1 idle in [0,1], the last stage 0 idle in [5,6]; the others a full pipeline.
    assert engine.pipeline_rows == [(0.0, 1, 1.0), (1.0, 2, 0.0), (2.0, 2, 0.0), (3.0, 2, 0.0), (4.0, 2, 1.0)]
    assert engine.stage_busy_s == [5.0, 5.0] and engine.active_s == 6.0


def test_a_lone_request_leaves_the_pipeline_half_idle():
    # One request: every batch waits for the previous one's token, so one stage is always idle.
    df, log, engine = run([RequestSpec(0, 0.0, 4, 3)])
    assert (df.first_token_s[0], df.finish_s[0]) == (2.0, 6.0)
    assert [row[2] for row in engine.pipeline_rows] == [2.0, 2.0, 2.0]   # 2 stages x 2 s - 2 s worked
    assert sum(engine.stage_busy_s) / (2 * engine.active_s) == 0.5


def test_sends_delay_the_next_stage_and_count_as_idle():
    df, log, engine = run([RequestSpec(0, 0.0, 4, 1)], cost=ConstantStageCost(2, 1.0, 0.25))
    assert df.finish_s[0] == 2.25   # stage 0 [0,1], send [1,1.25], stage 1 [1.25,2.25]
    assert engine.pipeline_rows == [(0.0, 1, 2.5)]   # 2 x 2.25 - 2 s worked


def test_chunks_of_one_prompt_fill_the_pipeline():
    # vLLM advances num_computed_tokens when it schedules: a prompt's next chunk goes into the next batch
    # while the previous chunk is still in flight. 10 tokens in chunks of 4, 4, 2 enter stage 0 at 0, 1, 2.
    policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=4)
    df, log, engine = run([RequestSpec(0, 0.0, 10, 2)], policy=policy)
    assert [(it[0], it[2], it[3]) for it in log.iterations] == [(0.0, 4, 0), (0.0, 4, 0), (2.0, 2, 0), (4.0, 0, 1)]
    assert [row[0] for row in engine.pipeline_rows] == [0.0, 1.0, 2.0, 4.0]
    # first token when the last chunk leaves stage 1 at 4; back to back it would be 3 steps x 2 s = 6
    assert (df.first_token_s[0], df.finish_s[0]) == (4.0, 6.0)


def test_max_num_seqs_counts_requests_in_flight():
    # vLLM's max_num_seqs counts every running request: with 2 slots and both requests in flight, the third
    # waits for one of them to finish although a queue slot is free.
    policy = ChunkedPrefill(max_num_seqs=2, max_num_batched_tokens=4)
    specs = [RequestSpec(0, 0.0, 4, 2), RequestSpec(1, 0.0, 4, 2), RequestSpec(2, 0.0, 4, 1)]
    df, log, engine = run(specs, policy=policy, num_stages=3)
    admitted = dict(zip(df.request_id, df.admitted_s))
    finish = dict(zip(df.request_id, df.finish_s))
    assert admitted[0] == admitted[1] == 0.0
    assert admitted[2] == min(finish[0], finish[1]) > 0


@pytest.mark.parametrize("policy", [ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64),
                                    Continuous(max_num_seqs=6, max_num_batched_tokens=512, mix_prefill_decode=True)],
                         ids=lambda p: p.name)
def test_one_stage_is_the_plain_engine_bitwise(policy):
    class OneStage(ConstantCost):   # the engine's cost, priced as one stage
        def stage_times_s(self, prefill=(), decode=(), num_logits=None):
            return (self.step_time_s(prefill, decode, num_logits),), 0.0

    cost = OneStage(0.01, 1e-4)
    for seed in range(4):
        specs = random_specs(seed)
        plain = run(specs, policy, cost, num_gpu_blocks=40, max_model_len=512, engine_cls=Engine)
        piped = run(specs, policy, cost, num_stages=1, num_gpu_blocks=40, max_model_len=512)
        assert plain[0].equals(piped[0])
        assert plain[1].iterations == piped[1].iterations
        assert plain[1].itl_gaps_s == piped[1].itl_gaps_s
        assert plain[1].preemptions == piped[1].preemptions


@pytest.mark.parametrize("num_stages", [2, 4])
def test_every_request_ends_exactly_and_kv_stays_in_bounds(num_stages):
    policy = ChunkedPrefill(max_num_seqs=6, max_num_batched_tokens=64)
    num_preemptions = 0
    for seed in range(6):
        specs = random_specs(seed)
        df, log, engine = run(specs, policy, ConstantStageCost(num_stages, 0.005), num_stages=num_stages,
                              num_gpu_blocks=40, max_model_len=512)
        assert len(df) == len(specs) and set(df.status) <= {"finished", "rejected"}
        for r in engine.requests.values():
            if r.status is Status.FINISHED:
                assert r.num_generated_tokens == r.spec.num_output_tokens
        assert max(it[9] for it in log.iterations) <= 40
        assert engine.pool.num_used_blocks == 0 and not engine.in_flight
        assert all(n <= num_stages for _, n, _ in engine.pipeline_rows)
        num_preemptions += int(df.num_preemptions.sum())
    assert num_preemptions > 0   # the workloads do exercise preemption with batches in flight


def test_microbatches_in_flight_beat_stages_back_to_back():
    # 32 requests at once, stages priced per token: with 2 batches in flight each stage works on one while
    # the other stage works on the other; back to back (the plain engine pricing both stages in one step,
    # or one batch in flight) each GPU idles half the time.
    specs = [RequestSpec(i, 0.0, 32, 64) for i in range(32)]
    policy = ChunkedPrefill(max_num_seqs=32, max_num_batched_tokens=256)
    cost = ConstantStageCost(2, 0.002, per_token_s=0.001)
    piped, _, engine = run(specs, policy, cost)
    serial, _, _ = run(specs, policy, cost, engine_cls=Engine)
    one_in_flight = run(specs, policy, cost, max_batches_in_flight=1)[0]
    assert piped.finish_s.max() < 0.6 * serial.finish_s.max()
    assert one_in_flight.finish_s.max() == pytest.approx(serial.finish_s.max())
    assert sum(engine.stage_busy_s) / (2 * engine.active_s) > 0.9   # unequal microbatches leave a little idle


def test_bubble_fraction_falls_with_load():
    from experiments.simulate import simulate
    base = {"model": "llama-3-70b", "hardware": "h100-sxm", "pipeline_parallel_size": 4,   # catalog: no [aic] needed
            "engine": {"policy": "chunked_prefill", "max_model_len": 4096},
            "workload": {"num_requests": 60, "prompt_tokens": {"dist": "fixed", "value": 512},
                         "output_tokens": {"dist": "fixed", "value": 32}}}
    low = simulate({**base, "workload": {**base["workload"], "arrival": {"process": "closed", "concurrency": 1}}})
    high = simulate({**base, "workload": {**base["workload"], "arrival": {"process": "poisson", "rate_per_s": np.inf}}})
    assert low.summary["pipeline_bubble_fraction"] > 0.7   # one request: one stage of four works at a time
    assert high.summary["pipeline_bubble_fraction"] < low.summary["pipeline_bubble_fraction"] - 0.3
    for res in (low, high):
        it = res.iterations
        assert {"pipeline_enter_s", "num_batches_in_flight", "bubble_s"} <= set(it.columns)
        assert (it["bubble_s"] >= 0).all() and it["num_batches_in_flight"].max() <= 4
        assert 0 < res.summary["busy_fraction"] <= 1


def test_roofline_stages_add_up_to_the_back_to_back_step():
    from costmodels.catalog import get_gpu, get_model
    from costmodels.deployment import Deployment, stage_layers
    from costmodels.roofline import RooflineCostModel
    assert stage_layers(80, 3) == (27, 27, 26) and stage_layers(7, 4) == (2, 2, 2, 1)   # vLLM get_pp_indices
    model, gpu = get_model("llama-3-70b"), get_gpu("h100-sxm")   # the catalog's: runs without the [aic] extra
    one = RooflineCostModel(model, gpu)
    assert one.stage_times_s(decode=[900] * 8) == ((one.step_time_s(decode=[900] * 8),), 0.0)
    pp4 = RooflineCostModel(model, gpu, deployment=Deployment(pipeline_parallel_size=4))
    for shape in ({"decode": [1000] * 64}, {"prefill": [(2048, 0)]}, {"prefill": [(512, 512)], "decode": [300] * 4}):
        stages, send_s = pp4.stage_times_s(**shape)
        assert len(stages) == 4 and send_s > 0
        # the GPU terms dominate the CPU's here: stages plus sends are the back-to-back step
        assert sum(stages) + 3 * send_s == pytest.approx(pp4.step_time_s(**shape), rel=1e-12)
        assert stages[-1] > stages[1] and stages[0] > stages[1]   # LM head last, embedding first


def test_aic_stages_add_up_to_its_back_to_back_step():
    from costmodels import aic
    from costmodels.catalog import get_gpu, get_model
    from costmodels.deployment import Deployment
    if aic.tables_root() is None:
        pytest.skip("aiconfigurator-core ([aic] extra) not installed")
    pytest.importorskip("pyarrow")
    model, gpu = get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("h200-sxm")
    cost = aic.aic_cost_model("aic", model, gpu, Deployment(pipeline_parallel_size=2))
    for shape in ({"decode": [1000] * 64}, {"prefill": [(2048, 0)]}):
        stages, send_s = cost.stage_times_s(**shape)
        assert sum(stages) + send_s == pytest.approx(cost.step_time_s(**shape), rel=1e-12)

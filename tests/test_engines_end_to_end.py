"""Properties of every engine policy over small random workloads under KV pressure: the engine checks
its KV and state invariants after every iteration; here every request must finish (with exactly its
output tokens) or be rejected with a reason, and the same seed must give identical frames."""
import pandas as pd
import pytest
import simpy

from experiments.simulate import simulate
from policies import POLICIES
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits
from simcore.arrivals import open_loop
from simcore.request import Status
from workloads.synthetic import generate, parse_workload

MAX_MODEL_LEN = 2048
NUM_BLOCKS = 200  # 3200 tokens: a handful of requests at a time

CASES = [
    ("tgi", {}),
    ("tgi", {"prefill_chunking": False, "max_batch_prefill_tokens": 2048, "max_waiting_tokens": 5}),
    ("trtllm", {}),
    ("trtllm", {"capacity_scheduler_policy": "MAX_UTILIZATION", "enable_chunked_context": True, "max_num_tokens": 512}),
    ("trtllm", {"enable_chunked_context": True, "context_chunking_policy": "EQUAL_PROGRESS", "max_num_tokens": 512}),
    ("trtllm", {"capacity_scheduler_policy": "MAX_UTILIZATION", "max_num_tokens": 2048}),
    ("sglang", {"chunked_prefill_size": 512}),
    ("sglang", {"enable_mixed_chunk": True, "chunked_prefill_size": 256, "max_prefill_tokens": 1024}),
    ("chunked_prefill", {"scheduling_policy": "priority", "max_num_batched_tokens": 512}),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CASES)]

WORKLOAD = {"num_requests": 80, "arrival": {"process": "poisson", "rate_per_s": 40},
            "priority": {"classes": [0, 1], "weights": [0.3, 0.7]},
            "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 1.0, "max": 1500},
            "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.9, "max": 400}}


@pytest.mark.parametrize("name, knobs", CASES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_request_finishes_with_its_tokens_within_kv(name, knobs, seed):
    specs = generate(parse_workload(WORKLOAD), seed, MAX_MODEL_LEN).specs
    env = simpy.Environment()
    engine = Engine(env, POLICIES[name](**knobs), ConstantCost(0.01, 1e-5),
                    EngineLimits(NUM_BLOCKS, 16, MAX_MODEL_LEN))  # check_invariants on
    env.process(open_loop(env, specs, engine.submit))
    env.run()
    assert not engine.waiting and not engine.running and engine.pool.num_used_blocks == 0
    assert len(engine.requests) == len(specs)
    for req in engine.requests.values():
        if req.status is Status.REJECTED:
            assert req.reject_reason
        else:
            assert req.status is Status.FINISHED
            assert req.num_generated_tokens == req.spec.num_output_tokens
            assert req.first_token_s <= req.finish_s
    assert max(row[9] for row in engine.log.iterations) <= NUM_BLOCKS  # kv_blocks_used column


@pytest.mark.parametrize("name, knobs", CASES, ids=IDS)
def test_sweep_config_runs_and_same_seed_gives_identical_frames(name, knobs):
    config = {"model": "llama-3-8b", "hardware": "h100-sxm",
              "engine": {"policy": name, "num_gpu_blocks": NUM_BLOCKS, "max_model_len": MAX_MODEL_LEN, **knobs},
              "workload": WORKLOAD}
    a, b = simulate(config, seed=3), simulate(config, seed=3)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert a.summary["num_finished"] + a.summary["num_rejected"] == WORKLOAD["num_requests"]
    assert a.resolved["engine"]["policy"] == name
    assert "ttft_p99_ms_prio0" in a.summary and "ttft_p99_ms_prio1" in a.summary


def test_sglang_retracts_when_outputs_outgrow_its_estimate():
    """Every request generates its full max_tokens: the ratio-scaled estimate over-admits, so decodes
    run out of KV and SGLang retracts (recompute); everything still finishes."""
    workload = {**WORKLOAD, "output_tokens": {"dist": "fixed", "value": 300}}
    config = {"model": "llama-3-8b", "hardware": "h100-sxm",
              "engine": {"policy": "sglang", "num_gpu_blocks": NUM_BLOCKS, "max_model_len": MAX_MODEL_LEN},
              "workload": workload}
    summary = simulate(config, seed=0).summary
    assert summary["num_preemptions"] > 0
    assert summary["num_finished"] == WORKLOAD["num_requests"]


def test_engine_knobs_pass_the_strict_loader_and_bad_values_name_their_key():
    from pathlib import Path

    from experiments.config import ConfigError, expand, load_sweep_file, resolve_point
    points = expand(load_sweep_file(Path(__file__).parent.parent / "examples" / "engines.yaml"))
    assert sorted({p.config.policy.name for p in points}) == ["chunked_prefill", "sglang", "tgi", "trtllm"]
    assert len(points) == 30
    prio = expand(load_sweep_file(Path(__file__).parent.parent / "examples" / "priorities.yaml"))
    assert {p.config.policy.scheduling_policy for p in prio} == {"fcfs", "priority"}
    assert prio[0].config.workload.priority.classes == (0, 1)
    base = {"workload": WORKLOAD}
    tgi = resolve_point({**base, "engine": {"policy": "tgi", "max_batch_prefill_tokens": 8192,
                                            "prefill_chunking": False, "waiting_served_ratio": 1.2}}).policy
    assert (tgi.max_batch_prefill_tokens, tgi.prefill_chunking, tgi.waiting_served_ratio) == (8192, False, 1.2)
    for engine, key in [({"policy": "trtllm", "capacity_scheduler_policy": "NEVER"}, "capacity_scheduler_policy"),
                        ({"policy": "tgi", "max_batch_total_tokens": -5}, "max_batch_total_tokens"),
                        ({"policy": "sglang", "max_running_requests": 0}, "max_running_requests"),
                        ({"policy": "sglang", "init_new_token_ratio": "high"}, "init_new_token_ratio")]:
        with pytest.raises(ConfigError, match=key):
            resolve_point({**base, "engine": engine})

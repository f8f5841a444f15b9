"""`engine.scheduler_reserve_full_isl: false`: vLLM 0.18's admission rule (only the step's chunk must fit in
free KV), against 0.19's default (the whole prompt must). Both engines run it alike; the equality with vLLM's
own scheduler, either way, is tests/test_vllm_scheduler.py's."""
from __future__ import annotations

import pytest

from experiments.config import ConfigError, resolve_point
from experiments.simulate import simulate


def point(full_isl, fast_path="auto"):
    """Long prompts into a small KV pool: a first chunk fits long before a whole prompt does."""
    return resolve_point({
        "model": "llama-3-8b", "hardware": "l4", "profile": "roofline",
        "engine": {"policy": "chunked_prefill", "max_num_seqs": 32, "max_num_batched_tokens": 512,
                   "scheduler_reserve_full_isl": full_isl, "fast_path": fast_path, "num_gpu_blocks": 300},
        "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 2},
                     "prompt_tokens": {"dist": "lognormal", "median": 1500, "sigma": 0.5, "max": 4000},
                     "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 400}}})


def test_admitting_on_the_first_chunk_preempts_more_and_both_engines_agree():
    runs = {}
    for full in (True, False):
        fast, simpy = simulate(point(full)), simulate(point(full, "off"))
        assert fast.requests.equals(simpy.requests) and fast.iterations.equals(simpy.iterations)
        runs[full] = fast.summary
    assert runs[False]["num_preemptions"] > runs[True]["num_preemptions"]
    assert runs[False]["throughput_rps"] < runs[True]["throughput_rps"]   # the thrash PR #37307 describes


def test_the_knob_takes_true_or_false_only():
    with pytest.raises(ConfigError, match="engine.scheduler_reserve_full_isl"):
        point("no")


def test_a_livelock_stops_with_one_line_instead_of_running_forever():
    """A tiny pool, priority preemption and first-chunk admission: requests are admitted and preempted
    without end (vLLM 0.15.1's own scheduler loops forever on this workload); the engine says so."""
    from dataclasses import replace

    from fidelity.vllm_scheduler import random_case, run_ours
    from simcore.errors import SimulationError
    case = replace(random_case(772), scheduler_reserve_full_isl=False)
    with pytest.raises(SimulationError, match="livelocks") as e:
        run_ours(case)
    assert "\n" not in str(e.value) and "scheduler_reserve_full_isl: true" in str(e.value)
    run_ours(replace(case, scheduler_reserve_full_isl=True))   # 0.19's rule ends

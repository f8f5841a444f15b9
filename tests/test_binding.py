"""What binds: the per-step limit read off hand-made iteration logs, and end to end on runs whose answer is
known by construction (a sequence cap of 2 with requests queued; a KV pool of a few blocks; one request)."""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from experiments.binding import (DEMAND, KV, POLICY, SEQS, TOKENS, AdmissionLimits, admission_window,
                                 binding_sentence, step_limits)
from experiments.simulate import simulate


def steps(rows):
    cols = ["start_s", "duration_s", "prefill_tokens", "decode_tokens", "padding_tokens", "num_seqs",
            "num_preempted", "num_waiting", "num_running", "kv_blocks_used", "replica_id"]
    return pd.DataFrame(rows, columns=cols)


def served(arrivals, admitted, prompt=32, output=4, finish=None):
    n = len(arrivals)
    return pd.DataFrame({"replica_id": 0, "arrival_s": arrivals, "admitted_s": admitted,
                         "finish_s": finish if finish is not None else [np.nan] * n,
                         "prompt_tokens": prompt, "output_tokens": output,
                         "status": ["finished" if finish is not None else "unfinished"] * n})


LIMITS = AdmissionLimits(max_num_seqs=2, token_budget=64, chunks_prefill=True)


def test_each_step_names_the_first_limit_it_stood_at():
    # three requests of 32 prompt tokens wait from t=0; blocks of 16 tokens, a pool of 100
    it = steps([
        (0.0, 1.0, 64, 0, 0, 2, 0, 1, 2, 4, 0),     # 2 seqs = cap, 64 tokens = budget: the cap comes first
        (1.0, 1.0, 60, 0, 0, 1, 0, 1, 1, 4, 0),     # 1 seq, 60 of 64 tokens, 96 blocks free: the policy chose
        (2.0, 1.0, 64, 0, 0, 1, 0, 1, 1, 4, 0),     # budget spent
        (3.0, 1.0, 8, 0, 0, 1, 0, 1, 1, 99, 0),     # 1 block free, 2 needed: KV
        (4.0, 1.0, 8, 0, 0, 1, 1, 1, 1, 4, 0),      # a preemption: KV
        (5.0, 1.0, 8, 0, 0, 1, 0, 0, 1, 4, 0),      # nothing left waiting: demand
        (6.0, 1.0, 8, 0, 0, 1, 0, 1, 1, 4, 0),      # the one waiting arrived during the step: demand
    ])
    reqs = served([0.0, 0.0, 0.0, 6.5], [0.0, 0.0, 5.0, 7.0])
    assert list(step_limits(it, reqs, LIMITS, 100, 16)) == [SEQS, POLICY, TOKENS, KV, KV, DEMAND, DEMAND]


def test_blocks_freed_at_the_end_of_a_step_were_not_free_at_its_decision():
    # 99 of 100 blocks used after the step, but a finishing request (32 + 4 - 1 tokens: 3 blocks) let go of
    # 3 more at its end: the decision saw none free
    it = steps([(0.0, 1.0, 0, 1, 0, 1, 0, 1, 1, 96, 0)])
    reqs = pd.concat([served([0.0], [0.0], finish=[1.0]), served([0.0], [2.0])], ignore_index=True)
    assert list(step_limits(it, reqs, LIMITS, 99, 16)) == [KV]


def test_a_policy_that_does_not_chunk_needs_room_for_the_whole_prompt():
    it = steps([(0.0, 1.0, 40, 0, 0, 1, 0, 1, 1, 4, 0)])   # 24 of 64 tokens left, the head needs 32
    reqs = served([0.0, 0.0], [0.0, 1.0])
    whole = AdmissionLimits(max_num_seqs=8, token_budget=64, chunks_prefill=False)
    assert list(step_limits(it, reqs, whole, 100, 16)) == [TOKENS]
    assert list(step_limits(it, reqs, LIMITS, 100, 16)) == [POLICY]


def test_the_drain_after_the_last_arrival_is_left_out():
    it = steps([(0.0, 1.0, 8, 0, 0, 1, 0, 2, 1, 4, 0), (1.0, 1.0, 8, 0, 0, 1, 0, 0, 1, 4, 0),
                (2.0, 1.0, 0, 1, 0, 1, 0, 0, 1, 4, 0), (3.0, 1.0, 0, 1, 0, 1, 0, 0, 1, 4, 0)])
    assert list(admission_window(it, 0.5)) == [True, True, False, False]


# Constant cost (10 ms a step); 40 requests of 100 prompt and 20 output tokens, all at t = 0.
SATURATED = {
    "model": "llama-3-8b", "hardware": "h100-sxm", "profile": "constant:per_step_s=0.01",
    "engine": {"policy": "chunked_prefill", "max_num_seqs": 2, "max_num_batched_tokens": 4096},
    "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate_per_s": float("inf")},
                 "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 20}},
}


def run(**engine):
    cfg = copy.deepcopy(SATURATED)
    cfg["engine"].update(engine)
    return simulate(cfg, 0).summary


def test_a_sequence_cap_of_two_binds_with_a_queue():
    s = run()
    # two at a time, in lock-step: 20 pairs of 20 steps (a prefill that samples the first token, 19 decodes);
    # the first 19 pairs' 380 steps each leave a queue behind, at the cap; the last pair's first step leaves
    # nothing waiting (demand), and the 19 after it are the drain, left out
    assert s["binding"] == "max_num_seqs" and s["bind_max_num_seqs_steps"] == pytest.approx(380 / 381)
    assert "bound_weights_frac" not in s   # the constant stub prices no GPU resource
    assert binding_sentence(s).startswith("The sequence cap (max_num_seqs) binds: in 100% of steps")  # 99.7%, rounded


def test_a_small_kv_pool_binds_when_the_cap_is_lifted():
    s = run(max_num_seqs=256, num_gpu_blocks=30)   # 29 usable blocks: 3 requests of 8 blocks at a time
    assert s["binding"] == "kv" and s["bind_kv_steps"] > 0.9


def test_one_request_is_demand_bound_and_priced_by_resource():
    cfg = copy.deepcopy(SATURATED)
    cfg.pop("profile")
    cfg["workload"]["num_requests"] = 1
    s = simulate(cfg, 0).summary
    assert s["binding"] == "demand" and s["bind_demand_steps"] == 1.0
    # one sequence decoding: the weights dominate every step (Llama-3-8B reads 16 GB per step)
    assert s["step_bound"] == "memory" and s["bound_weights_frac"] > 0.5
    assert sum(s[f"bound_{k}_frac"] for k in ("compute", "weights", "kv", "activations", "links")) == pytest.approx(1)
    assert "memory-bound" in binding_sentence(s)

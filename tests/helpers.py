"""Small builders shared by the tests: hand-made requests and views, and a bare engine run."""
from __future__ import annotations

import zlib

from simcore.costmodel import ConstantCost
from simcore.engine import EngineLimits
from simcore.metrics import requests_frame
from simcore.wiring import run_replica
from simcore.request import Request, RequestSpec, Status
from simcore.view import EngineView


def req(rid, prompt, output=10, *, computed=0, generated=0, blocks=0, status=Status.WAITING, arrival=0.0,
        max_new=None):
    return Request(RequestSpec(rid, arrival, prompt, output, max_new), status=status,
                   num_computed_tokens=computed, num_generated_tokens=generated, num_blocks=blocks)


def running(rid, prompt, generated, output=100, block_size=16):
    """A decoding request: prompt + generated tokens, all but the newest computed, blocks to match."""
    computed = prompt + generated - 1
    return req(rid, prompt, output, computed=computed, generated=generated,
               blocks=-(-computed // block_size), status=Status.RUNNING)


def view(waiting=(), running_=(), free=1000, total=1000, block_size=16, max_model_len=8192, now=0.0,
         draining=()):
    return EngineView(now, list(waiting), list(running_), free, total, block_size, max_model_len, list(draining))


def run_engine(policy, specs, *, cost=None, num_gpu_blocks=1000, block_size=16, max_model_len=8192,
               preemption_mode="recompute", num_swap_blocks=1000):
    limits = EngineLimits(num_gpu_blocks, block_size, max_model_len, preemption_mode,
                          kv_bytes_per_token=1000, host_link_bytes_per_s=1e9, num_swap_blocks=num_swap_blocks)
    engine = run_replica(policy, cost or ConstantCost(1.0), limits, sorted(specs, key=lambda s: s.arrival_s))
    return requests_frame(engine.log), engine.log, engine


def policy_key(policy) -> int:
    """A number of a policy's settings that is the same in every process (hash() of its string fields is
    not, under hash randomisation): test ids and random seeds come from it."""
    return zlib.crc32(repr(policy).encode())


def policy_id(policy) -> str:
    return f"{policy.name}-{policy_key(policy) % 1000}"


def random_hybrid_case(seed: int, features: tuple[str, ...]):
    """A random scheduler-equivalence case for vLLM's hybrid KV manager (fidelity/vllm_scheduler.py): 1-2
    full-attention and 1-3 sliding-window groups, a window of 5-64 tokens, and a pool of blocks that holds
    the largest request once and up to as many again."""
    import dataclasses

    import numpy as np

    from fidelity.vllm_scheduler import random_case
    case = random_case(seed, features, num_requests=16)
    case = dataclasses.replace(case, num_full_groups=1 + seed % 2, num_sliding_groups=1 + seed % 3,
                               sliding_window=(5, 17, 32, 64)[seed])
    need = max(case.kv_groups().blocks_per_request(s.num_prompt_tokens + s.num_output_tokens)
               for s in case.requests)
    return dataclasses.replace(case, num_gpu_blocks=need + 1 + int(np.random.default_rng(seed).integers(0, need)))

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

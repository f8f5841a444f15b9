"""Synthetic traffic shapes that share prompt prefixes (for prefix caching) and mixes of request classes.

`shared_prefix: {num_groups, prefix_tokens}`: every request starts with one of `num_groups` system prompts
(chosen uniformly) of `prefix_tokens` tokens, prepended to its drawn prompt.
`sessions: {num_turns, think_time_s}`: requests come in multi-turn conversations. A session starts at each
arrival of the arrival process (so `rate_per_s` is the rate of new sessions); turn t arrives
`t * think_time_s` later (open loop: it does not wait for the previous answer) and its prompt is the whole
conversation so far (earlier prompts and answers) plus a new message drawn from `prompt_tokens`.
`mix: [{name, weight, prompt_tokens, output_tokens}, ...]`: each request belongs to one class, drawn by
weight, with that class's length distributions (e.g. chat plus long generations).
Ignored: token contents (prefix identity is all a cache needs), answers that differ between turns.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.distributions import LengthDist, parse_length_dist
from workloads.errors import WorkloadError, check_keys, finite_number

GROUP_SPACE = 2**32  # ids: system prompt g, block k -> -(g * 2**32 + k + 1); session s -> -(2**62 + ...)


@dataclass(frozen=True)
class SharedPrefix:
    num_groups: int
    prefix_tokens: int


@dataclass(frozen=True)
class Sessions:
    num_turns: int
    think_time_s: float = 0.0


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float
    prompt_tokens: LengthDist
    output_tokens: LengthDist


def _pos_int(spec: dict, k: str, key: str) -> int:
    return finite_number(f"{key}.{k}", spec.get(k), minimum=1, integer=True)


def parse_shared_prefix(spec, key: str = "workload.shared_prefix") -> SharedPrefix:
    check_keys(key, spec, {"num_groups", "prefix_tokens"})
    return SharedPrefix(_pos_int(spec, "num_groups", key), _pos_int(spec, "prefix_tokens", key))


def parse_sessions(spec, key: str = "workload.sessions") -> Sessions:
    check_keys(key, spec, {"num_turns", "think_time_s"})
    return Sessions(_pos_int(spec, "num_turns", key), finite_number(f"{key}.think_time_s", spec.get("think_time_s", 0.0)))


def parse_mix(spec, key: str = "workload.mix") -> tuple[RequestClass, ...]:
    if not isinstance(spec, list) or not spec:
        raise WorkloadError(f"{key}: expected a non-empty list of classes")
    out = []
    for i, c in enumerate(spec):
        k = f"{key}[{i}]"
        check_keys(k, c, {"name", "weight", "prompt_tokens", "output_tokens"})
        w = finite_number(f"{k}.weight", c.get("weight", 1.0), strict=True)
        for need in ("prompt_tokens", "output_tokens"):
            if need not in c:
                raise WorkloadError(f"{k}.{need}: required")
        out.append(RequestClass(str(c.get("name", f"class{i}")), float(w),
                                parse_length_dist(c["prompt_tokens"], f"{k}.prompt_tokens"),
                                parse_length_dist(c["output_tokens"], f"{k}.output_tokens")))
    return tuple(out)


def sample_mix(classes: tuple[RequestClass, ...], n: int, class_rng, prompt_rng, output_rng):
    """Class per request (by weight), then lengths from its class. Returns (class index, prompts, outputs,
    per-request max_new_tokens or -1 where the class's output distribution has no max)."""
    w = np.array([c.weight for c in classes])
    which = class_rng.choice(len(classes), size=n, p=w / w.sum())
    prompts = np.empty(n, dtype=np.int64)
    outputs = np.empty(n, dtype=np.int64)
    max_new = np.full(n, -1, dtype=np.int64)
    for j, c in enumerate(classes):
        idx = np.flatnonzero(which == j)
        prompts[idx] = c.prompt_tokens.sample(prompt_rng, len(idx))
        outputs[idx] = c.output_tokens.sample(output_rng, len(idx))
        if c.output_tokens.max_value is not None:
            max_new[idx] = c.output_tokens.max_value
    return which, prompts, outputs, max_new


def session_layout(start_s: np.ndarray, messages: np.ndarray, outputs: np.ndarray, s: Sessions):
    """Request i is turn i % num_turns of session i // num_turns. Returns (arrival_s, prompt tokens,
    session index, prompt tokens already in the conversation before this turn's message)."""
    n = len(messages)
    session = np.arange(n) // s.num_turns
    turn = np.arange(n) % s.num_turns
    arrival = start_s[session] + turn * s.think_time_s
    prompts = np.empty(n, dtype=np.int64)
    history = np.zeros(n, dtype=np.int64)
    for i in range(n):
        if turn[i] > 0:
            history[i] = prompts[i - 1] + outputs[i - 1]
        prompts[i] = history[i] + messages[i]
    return arrival, prompts, session, history


def prefix_block_ids(num_prompt_tokens: int, block_size: int, group: int | None, prefix_tokens: int,
                     session: int | None) -> tuple[int, ...] | None:
    """Ids of a prompt's full blocks: system-prompt blocks are named by (group, position), the rest of a
    session's conversation by (session, position); blocks of neither stay unnamed (request-unique)."""
    ids = []
    for k in range(num_prompt_tokens // block_size):
        if group is not None and (k + 1) * block_size <= prefix_tokens:
            ids.append(-(group * GROUP_SPACE + k + 1))
        elif session is not None:
            ids.append(-(2**62 + session * GROUP_SPACE + k + 1))
        else:
            break
    return tuple(ids) or None

"""Requests: a frozen spec from the workload (or a whole workload as compact columns, `RequestSpecs`) and
the engine's small mutable progress record.

Preemption resets progress (`num_computed_tokens`); it never rewrites the spec (nano-vllm's rule).
"""
from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What a client sends. Lengths in tokens, times in seconds from the start of the run.

    `num_output_tokens` is how many tokens the request will generate (unknown to schedulers, as EOS is);
    `max_new_tokens` is the client's `max_tokens` limit, which reservation-based schedulers (Orca, TGI,
    static batching) may read. `None` means "up to max_model_len".
    """
    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    max_new_tokens: int | None = None
    prefix_block_ids: tuple[int, ...] | None = None  # prefix-cache identity of full prompt blocks
    priority: int = 0
    user_id: int | None = None  # closed-loop user that sent it


class Status(enum.Enum):
    WAITING = "waiting"      # queued: new, or preempted (recompute) and waiting to be re-prefilled
    SWAPPED = "swapped"      # preempted with its KV copied to host memory; waiting to be swapped back
    RUNNING = "running"      # holds KV blocks and is being scheduled
    DRAINING = "draining"    # finished, but its slot and KV stay held until its static batch drains
    SENDING = "sending"      # prefilled and handed off; its KV stays held until the transfer ends
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(eq=False, slots=True)
class Request:
    """Engine-side progress of one request (vLLM's `Request`, nano-vllm's `Sequence`)."""
    spec: RequestSpec
    status: Status = Status.WAITING
    num_computed_tokens: int = 0     # tokens whose KV exists (on GPU, or on host when swapped)
    num_generated_tokens: int = 0
    num_blocks: int = 0              # KV blocks held on the GPU (or on the host when swapped)
    num_preemptions: int = 0
    admitted_s: float | None = None  # first time it was scheduled
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    reject_reason: str | None = None
    num_spec_tokens: int = 0         # draft tokens awaiting verification (speculative decoding: simcore/speculative.py)

    @property
    def request_id(self) -> int:
        return self.spec.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return self.spec.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: the sequence whose KV must be computed before the next sample."""
        return self.spec.num_prompt_tokens + self.num_generated_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """1 for a decode, the rest of the prompt (+ generated, after a recompute) for a prefill."""
        return self.spec.num_prompt_tokens + self.num_generated_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed_tokens > 1 or self.num_generated_tokens == 0


class RequestSpecs(Sequence):
    """A workload's specs as compact columns (about 21 bytes a request instead of about 250 for a tuple of
    RequestSpec objects), read as a sequence of RequestSpec: `specs[k]` builds the spec on access (the
    engine keeps it while the request lives, then drops it). The last one built is cached, since an
    arrival process reads the same next spec several times. Ids are 0..n-1 (arrival order); user ids
    None. `prefix_block_ids` stays a list of tuples (None when no request has any)."""

    def __init__(self, arrival_s, num_prompt_tokens, num_output_tokens, max_new_tokens=None,
                 priority=None, prefix_block_ids=None):
        n = len(arrival_s)
        self.arrival_s = _column("d", np.asarray(arrival_s, dtype=np.float64))
        self.num_prompt_tokens = _column("i", _int32("num_prompt_tokens", num_prompt_tokens))
        self.num_output_tokens = _column("i", _int32("num_output_tokens", num_output_tokens))
        # max_new_tokens: int32 where given, None where absent (a mask, only when some are absent)
        self.max_new_tokens = self.max_new_absent = None
        if max_new_tokens is not None:
            m = np.ma.getdata(max_new_tokens)
            absent = np.ma.getmaskarray(max_new_tokens)
            self.max_new_tokens = _column("i", _int32("max_new_tokens", np.where(absent, 0, m)))
            if absent.any():
                self.max_new_absent = _column("b", absent.astype(np.int8))
        self.priority = None if priority is None or not np.any(priority) else _column("q", np.asarray(priority, np.int64))
        self.prefix_block_ids = prefix_block_ids
        if any(len(c) != n for c in (self.num_prompt_tokens, self.num_output_tokens)) or (
                prefix_block_ids is not None and len(prefix_block_ids) != n):
            raise ValueError("RequestSpecs: columns of different lengths")
        self._last_k, self._last = None, None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, k):
        if k == self._last_k:   # the same spec asked again at once (a caller reading it field by field)
            return self._last
        if isinstance(k, slice):
            return tuple(self[i] for i in range(*k.indices(len(self))))
        if k < 0:
            k += len(self)
        arrival_s = self.arrival_s[k]   # IndexError past the end, as a tuple
        m = self.max_new_tokens
        if m is not None:
            m = None if self.max_new_absent is not None and self.max_new_absent[k] else m[k]
        spec = RequestSpec(k, arrival_s, self.num_prompt_tokens[k], self.num_output_tokens[k], m,
                           None if self.prefix_block_ids is None else self.prefix_block_ids[k],
                           0 if self.priority is None else self.priority[k])
        self._last_k, self._last = k, spec
        return spec

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __add__(self, other) -> tuple:   # as a tuple of specs would (tests append a hand-made request)
        return tuple(self) + tuple(other)

    def __radd__(self, other) -> tuple:
        return tuple(other) + tuple(self)

    def column(self, name: str) -> np.ndarray:
        """One field for every request as a numpy array (no copy): request_id, arrival_s,
        num_prompt_tokens, num_output_tokens, priority."""
        if name == "request_id":
            return np.arange(len(self), dtype=np.int64)
        if name == "priority" and self.priority is None:
            return np.zeros(len(self), dtype=np.int64)
        col = getattr(self, name)
        return np.frombuffer(col, dtype={"d": np.float64, "i": np.int32, "q": np.int64}[col.typecode])


def _column(typecode: str, values: np.ndarray) -> array:
    """A compact column whose items read back as plain Python floats and ints (numpy's would be scalars)."""
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values).tobytes())
    return out


def _int32(name: str, values) -> np.ndarray:
    v = np.asarray(values)
    if len(v) and (v.min() < -2**31 or v.max() >= 2**31):
        raise ValueError(f"RequestSpecs: {name} does not fit 32 bits")
    return v.astype(np.int32)

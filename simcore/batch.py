"""What a policy decides for one iteration: a frozen value the engine applies and a cost model prices."""
from __future__ import annotations

from dataclasses import dataclass


def split_shape(shape) -> tuple[list[tuple[int, int]], list[int]]:
    """A step's `(new_tokens, cached_tokens)` rows as a cost model prices them: a one-token row of a
    request that already holds KV is a decode (its context, the new token included), anything else a
    prefill (chunk). The one rule the engine, the real-run readers and the vLLM comparison share."""
    return ([(n, c) for n, c in shape if n > 1 or c == 0], [c + 1 for n, c in shape if n == 1 and c > 0])


@dataclass(frozen=True)
class Scheduled:
    """One request in an iteration.

    `num_new_tokens`: tokens whose KV is computed this step (1 for a decode, a chunk for a prefill).
    `num_reserved_tokens`: KV the engine must hold for it after this step, in tokens, when a policy
    reserves ahead (Orca / static batching reserve prompt + max output); 0 means just what it computes.
    """
    request_id: int
    num_new_tokens: int
    num_reserved_tokens: int = 0


@dataclass(frozen=True)
class Batch:
    """One iteration's decision.

    `preempt`: running requests to evict before the step (the engine frees or swaps their KV).
    `preempt_at`: for each victim, how many of `scheduled` get their KV before it is evicted (vLLM preempts
    in the middle of its pass over running requests; with prefix caching the order decides which cached
    blocks are evicted). Empty: every victim before any allocation.
    `padded_shape`: cost-model shape when the policy pads (static batching): one `(new_tokens,
    cached_tokens)` row per batch slot, finished slots included. None: priced from `scheduled`.
    `wake_at_s`: nothing to run now, but call the policy again at this time (a batching timeout) or at the
    next arrival, whichever comes first.
    `policy_state`: a frozen value the engine hands back unchanged as `EngineView.policy_state` on the next
    call, for schedulers whose real counterpart keeps state across iterations (SGLang's decaying
    `new_token_ratio`, TGI's steps since the last onboarding). None for stateless policies.
    """
    scheduled: tuple[Scheduled, ...] = ()
    preempt: tuple[int, ...] = ()
    preempt_at: tuple[int, ...] = ()
    padded_shape: tuple[tuple[int, int], ...] | None = None
    wake_at_s: float | None = None
    policy_state: object = None

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


@dataclass(frozen=True)
class DecodeShortcut:
    """A policy's decision in the common case the fast engine asks about (`Policy.schedule_decodes`):
    every running request is decoding, and the policy either decodes all of them one token each, in
    running order, or pauses all of them (`decode_running` False: a prefill-only step), plus `admitted`
    (waiting requests scheduled after them, as `Batch.scheduled` would list them), preempting nothing.

    An empty `admitted` with `decode_running` is a quiet step; it promises that the policy decides the same
    (a `padded_shape`'s rows one token further per step) in every following decode-only step until a
    request arrives or finishes, or the decoders' KV growth no longer fits in the free blocks. The engine
    keeps `policy_state` unchanged over such steps, so a policy answers only where its `schedule()` would
    leave its state as it is (TGI with prefill chunking; SGLang once its `new_token_ratio` sits at its
    floor) and returns None while its state moves (TGI's step counter without chunking, SGLang's decay).
    """
    admitted: tuple[Scheduled, ...] = ()
    decode_running: bool = True
    padded_shape: tuple[tuple[int, int], ...] | None = None

    @property
    def is_quiet(self) -> bool:
        return self.decode_running and not self.admitted


QUIET = DecodeShortcut()  # every running request decodes, nothing else (one shared value: asked very often)

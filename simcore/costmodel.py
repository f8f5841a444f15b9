"""The contract between the engine and a cost model: the time of one iteration from its shape alone."""
from __future__ import annotations

from typing import Callable, Protocol, Sequence, runtime_checkable


class CostModel(Protocol):
    """Prices one forward pass. Pure: it never sees requests, only token counts.

    `prefill`: one `(new_tokens, cached_tokens)` pair per sequence computing more than one token this step
    (cached = tokens whose KV already exists, e.g. earlier chunks or a prefix-cache hit).
    `decode`: one context length per sequence computing exactly one token (context includes that token).
    `num_logits`: sequences that sample a token this step (LM head + sampling); partial prefill chunks
    do not. None: every sequence samples.
    Returns seconds.
    """

    def step_time_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                    num_logits: int | None = None) -> float: ...

    def describe(self) -> dict:
        """Where the numbers come from (model kind, GPU, provenance), recorded with every result."""
        ...


@runtime_checkable
class ContextSumPricing(Protocol):
    """What a cost model offers when its decode price depends on the decode contexts only through their
    count and sum (the roofline, the measured profile: attention reads every context's KV once). The fast
    engine (simcore/fast/) then prices a step of lazy decoders without listing their contexts, and a quiet
    stretch of decode steps in bulk. Any other cost model works there through `step_time_s`, only slower.
    Each entry point must equal `step_time_s` on the same step, bitwise."""

    def step_time_sums_s(self, prefill: Sequence[tuple[int, int]], num_decode: int, decode_context_sum: int,
                         num_logits: int | None = None) -> float:
        """`step_time_s(prefill, decode, num_logits)` for any `decode` of that length and sum."""
        ...

    def decode_step_time_fn(self, num_seqs: int, num_logits: int | None = None) -> Callable[[int], float]:
        """A function of the context sum: `step_time_sums_s((), num_seqs, sum, num_logits)`."""
        ...

    def decode_steps_time_s(self, num_seqs: int, context_sums, num_logits: int | None = None):
        """Many decode-only steps at once: an array, element i `decode_step_time_fn(num_seqs,
        num_logits)(context_sums[i])`."""
        ...


class ConstantCost:
    """A stub for exact timeline tests: `per_step_s` per iteration plus `per_token_s` per new token."""

    def __init__(self, per_step_s: float = 1.0, per_token_s: float = 0.0):
        self.per_step_s, self.per_token_s = per_step_s, per_token_s

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        tokens = sum(n for n, _ in prefill) + len(decode)
        return self.per_step_s + self.per_token_s * tokens

    def describe(self) -> dict:
        return {"kind": "constant", "per_step_s": self.per_step_s, "per_token_s": self.per_token_s}

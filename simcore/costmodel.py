"""The contract between the engine and a cost model: the time of one iteration from its shape alone."""
from __future__ import annotations

from typing import Protocol, Sequence


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


class ConstantCost:
    """A stub for exact timeline tests: `per_step_s` per iteration plus `per_token_s` per new token."""

    def __init__(self, per_step_s: float = 1.0, per_token_s: float = 0.0):
        self.per_step_s, self.per_token_s = per_step_s, per_token_s

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        tokens = sum(n for n, _ in prefill) + len(decode)
        return self.per_step_s + self.per_token_s * tokens

    def describe(self) -> dict:
        return {"kind": "constant", "per_step_s": self.per_step_s, "per_token_s": self.per_token_s}

"""Requests: a frozen spec from the workload and the engine's small mutable progress record.

Preemption resets progress (`num_computed_tokens`); it never rewrites the spec (nano-vllm's rule).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


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

"""Request-level (static) batching: FasterTransformer / Hugging Face `generate` behind a Triton-style
dynamic batcher (docs/engines.md section 7).

Simplifications: outputs are streamed (TTFT = queueing + padded prefill; finish = the request's own last
token), though its slot and KV stay held until the batch drains; no token budget on the padded prefill.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.defaults import GpuLike, check_at_least
from simcore.batch import Batch, DecodeShortcut, Scheduled
from simcore.kvcache import cdiv
from simcore.request import RequestSpec
from simcore.view import EngineView, max_total_tokens


@dataclass(frozen=True)
class StaticBatchState:
    """The batch in flight, carried from step to step: every row's padded prompt length."""
    prompt_len: int


@dataclass(frozen=True)
class Static:
    """A batch of up to `max_num_seqs` requests forms, FIFO, when the engine is idle: at once, or after
    waiting up to `batch_timeout_s` from the oldest arrival for the batch to fill (Triton's
    `max_queue_delay`). Prompts are padded to the longest, KV is reserved for every row up to the padded
    prompt + the largest max_tokens in the batch, every row is computed (finished rows as padding) until
    the longest output ends, and nobody joins until the batch drains.
    """
    name: ClassVar[str] = "static"
    # what an answer says it rests on (policies.imitated)
    imitates: ClassVar[str] = "request-level batching (FasterTransformer or HF generate behind a Triton-style batcher)"
    holds_slots_until_drained: ClassVar[bool] = True
    max_num_seqs: int = 256
    batch_timeout_s: float = 0.0

    def __post_init__(self):
        check_at_least(self, 1, "max_num_seqs")
        if not self.batch_timeout_s >= 0:
            raise ValueError(f"engine.batch_timeout_s: must be >= 0, got {self.batch_timeout_s!r}")

    @classmethod
    def for_gpu(cls, gpu: GpuLike, max_model_len: int, **knobs) -> "Static":
        """Every policy's deployment constructor (what the sweep file calls); static batching has no
        GPU-dependent default, so this is `Static(**knobs)`."""
        return cls(**knobs)

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        return max_total_tokens(spec, max_model_len)

    def schedule(self, view: EngineView) -> Batch:
        if view.running:
            return self._step(view)
        waiting = view.waiting
        if not waiting:
            return Batch()
        deadline_s = waiting[0].spec.arrival_s + self.batch_timeout_s
        if len(waiting) < self.max_num_seqs and view.now_s < deadline_s:
            return Batch(wake_at_s=deadline_s)
        members, prompt_len, max_new = [], 0, 0
        for req in waiting:
            if len(members) == self.max_num_seqs:
                break
            p = max(prompt_len, req.num_prompt_tokens)
            m = max(max_new, max_total_tokens(req.spec, view.max_model_len) - req.num_prompt_tokens)
            if (len(members) + 1) * cdiv(p + m, view.block_size) > view.num_free_blocks:
                break
            members.append(req)
            prompt_len, max_new = p, m
        total_len = prompt_len + max_new
        # Every row reserves the padded prompt + the batch's max output; every row prefills `prompt_len`.
        scheduled = tuple(Scheduled(r.request_id, r.num_prompt_tokens, total_len) for r in members)
        return Batch(scheduled, padded_shape=((prompt_len, 0),) * len(members),
                     policy_state=StaticBatchState(prompt_len))

    def _step(self, view: EngineView) -> Batch:
        """One decode step of the batch in flight: unfinished rows decode, finished rows are padding."""
        scheduled = tuple(Scheduled(r.request_id, 1) for r in view.running)
        return Batch(scheduled, padded_shape=self._decode_shape(view), policy_state=view.policy_state)

    def schedule_decodes(self, view: EngineView) -> DecodeShortcut | None:
        """A batch in flight decodes in lock-step until it drains (the fast engine's quiet stretch)."""
        if not view.running:
            return None
        return DecodeShortcut(padded_shape=self._decode_shape(view))

    @staticmethod
    def _decode_shape(view: EngineView) -> tuple[tuple[int, int], ...]:
        state = view.policy_state
        if isinstance(state, StaticBatchState):   # (the fast path asks at every finish: no pass over the rows)
            prompt_len = state.prompt_len
        else:
            prompt_len = max(r.num_prompt_tokens for r in (*view.running, *view.draining))
        num_generated = view.num_generated_tokens(view.running[0])  # all unfinished rows are in lock-step
        num_rows = len(view.running) + len(view.draining)
        return ((1, prompt_len + num_generated - 1),) * num_rows

"""Hugging Face TGI router v3 (`backends/v3/src/{backend,queue}.rs` at HEAD db931fcf; server chunk sizing
in `server/text_generation_server/models/flash_causal_lm.py`): docs/engines.md section 2.

Speculative decoding (engine.speculative, n-gram only: policies/speculation_counting.py): the reservation
counts `speculate` more tokens; a forward carries each decode's k drafts unless a request is still
prefilling or new requests join it (the server drops the batch's drafts then).

Simplifications: no prefix cache (radix allocator), no Medusa/MLP-speculator heads, no padding path (models without a
block allocator), no 1024-token `max_new_tokens` segments with re-queueing (the whole max output is
reserved at once), no `max_concurrent_requests` 429s; the server's next-chunk lengths are recomputed
from the current batch each step rather than fixed at the end of the previous forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from policies.defaults import GpuLike, check_at_least
from policies.speculation_counting import tgi_batch_has_drafts, verification_tokens
from simcore.batch import QUIET, Batch, DecodeShortcut, Scheduled
from simcore.engine import SimulationError
from simcore.kvcache import cdiv
from simcore.request import Request, RequestSpec
from simcore.view import EngineView, max_total_tokens


@dataclass(frozen=True)
class TgiState:
    """The batching task's loop variables: `waiting_tokens` (decode steps since the last onboarding,
    reset to 1 by a prefill) and `decode_next` (a prefill that joined a running batch is always
    followed by a decode of everything, without looking at the queue).

    Only `waiting_tokens < max_waiting_tokens` is ever read, and only without prefill chunking, so the
    counter stops at `max_waiting_tokens` there and is carried unchanged with chunking: a decode-only step
    then leaves the state as it was, which lets the fast engine's quiet stretches skip it (DecodeShortcut)."""
    waiting_tokens: int = 1
    decode_next: bool = False


@dataclass(frozen=True)
class Tgi:
    """TGI's `batching_task` + `Queue::next_batch`.

    Admission is FIFO with head-of-line blocking and reserves KV for `input + max_new_tokens - 1` tokens
    at once, so nothing is ever preempted. A prefill takes whole prompts up to `max_batch_prefill_tokens`
    (rounded up to the block size). With an empty running batch the queue is served at once
    (`max_batch_size` caps it). Then, after every decode:
    - `prefill_chunking: false`: new requests are onboarded only if the queue holds at least
      `floor(running * waiting_served_ratio)` requests, or `max_waiting_tokens` decode steps passed since
      the last onboarding (then any number); the running batch pauses for that prefill-only forward.
    - `prefill_chunking: true` (TGI's default with flashinfer/flashdecoding): the ratio and size caps are
      ignored; new prompts (the last one cut to fit) ride in one forward with the running batch's next
      tokens, within `max_batch_prefill_tokens` minus the tokens that forward already carries.
    A forward that onboarded requests into a running batch is followed by a decode of everything. Decodes
    also carry the next chunk of unfinished prompts: the oldest first, from a budget of
    `max_batch_prefill_tokens - (batch size - 1)`.
    `max_batch_total_tokens` (default: the KV pool) caps the reserved tokens.
    """
    name: ClassVar[str] = "tgi"
    # what an answer says it rests on (policies.imitated)
    imitates: ClassVar[str] = "Hugging Face TGI's v3 router (repository HEAD db931fcf)"
    holds_slots_until_drained: ClassVar[bool] = False
    max_batch_prefill_tokens: int = 4096
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    prefill_chunking: bool = True

    def __post_init__(self):
        check_at_least(self, 1, "max_batch_prefill_tokens", "max_batch_total_tokens", "max_batch_size",
                       "max_waiting_tokens")

    @classmethod
    def for_gpu(cls, gpu: GpuLike, max_model_len: int, **knobs) -> "Tgi":
        """Every policy's deployment constructor (what the sweep file calls). TGI's launcher sizes
        max_batch_prefill_tokens and max_batch_total_tokens at warmup; we keep its 4096 fallback and the KV
        pool (None), so this is `Tgi(**knobs)`."""
        return cls(**knobs)

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        return self.reserved_tokens(spec, max_model_len)

    @staticmethod
    def reserved_tokens(spec: RequestSpec, max_model_len: int, speculate: int = 0) -> int:
        # queue.rs: `input_length + max_new_tokens + speculate - 1` (the last token's KV is never written;
        # the last verification's `speculate` drafts are)
        return max_total_tokens(spec, max_model_len) + speculate - 1

    def schedule(self, view: EngineView) -> Batch:
        free = self._free_blocks(view)
        if not view.running:  # outer loop: a fresh batch straight from the queue
            new = self._next_batch(view, free, None, self.max_batch_size, self.max_batch_prefill_tokens)
            return Batch(tuple(new), policy_state=TgiState(1, False))
        state = view.policy_state if isinstance(view.policy_state, TgiState) else TgiState()
        current = self._next_forward(view)
        if not state.decode_next:
            if self.prefill_chunking:
                budget = self.max_batch_prefill_tokens - sum(s.num_new_tokens for s in current)
                new = self._next_batch(view, free, None, None, budget)
                if new:  # prefill(new, cached): one forward with the running batch's next tokens
                    return Batch(tuple(current + new), policy_state=TgiState(1, True))
            else:
                min_size = None
                if state.waiting_tokens < self.max_waiting_tokens:
                    min_size = math.floor(len(view.running) * self.waiting_served_ratio)
                max_size = None if self.max_batch_size is None else max(0, self.max_batch_size - len(view.running))
                new = self._next_batch(view, free, min_size, max_size, self.max_batch_prefill_tokens)
                if new:  # the running batch waits for this prefill-only forward
                    return Batch(tuple(new), policy_state=TgiState(1, True))
        if tgi_batch_has_drafts(view):   # speculative decoding: every decode verifies its drafts
            reqs = {r.request_id: r for r in view.running}
            current = [Scheduled(s.request_id, verification_tokens(reqs[s.request_id])) for s in current]
        return Batch(tuple(current), policy_state=TgiState(self._counted(state.waiting_tokens), False))

    def _counted(self, waiting_tokens: int) -> int:
        """The counter after one more decode step (see TgiState: unread with chunking, capped without)."""
        if self.prefill_chunking or waiting_tokens >= self.max_waiting_tokens:
            return waiting_tokens
        return waiting_tokens + 1

    @property
    def schedule_decodes(self):
        """The fast engine's shortcut (simcore.view.Policy), offered with prefill chunking only. Without it,
        the counter moves for `max_waiting_tokens` steps after every onboarding while the queue is held back
        by `waiting_served_ratio`, so the shortcut would decline most steps, and a declined answer costs the
        fast engine more than not asking (measured: 20k requests 31% slower than without it)."""
        return self._schedule_decodes if self.prefill_chunking else None

    def _schedule_decodes(self, view: EngineView) -> DecodeShortcut | None:
        """`schedule` when every running request decodes and the state is steady (no decode owed after an
        onboarding; without chunking, `max_waiting_tokens` decode steps since the last one): quiet when the
        queue onboards nothing, else None (an onboarding resets the state, which a shortcut cannot carry).
        Quiet holds until an arrival or a finish: reservations are whole (free blocks do not move while
        the batch decodes) and the batch size and queue do not change."""
        state, running = view.policy_state, view.running
        if not running or type(state) is not TgiState or state.decode_next or \
                self._counted(state.waiting_tokens) != state.waiting_tokens:
            return None
        if not view.waiting:
            return QUIET
        free = self._free_blocks(view)
        if self.prefill_chunking:   # the forward already carries one token per running request
            new = self._next_batch(view, free, None, None, self.max_batch_prefill_tokens - len(running))
        else:   # counter at max_waiting_tokens: no min size
            max_size = None if self.max_batch_size is None else max(0, self.max_batch_size - len(running))
            new = self._next_batch(view, free, None, max_size, self.max_batch_prefill_tokens)
        return None if new else QUIET

    def _free_blocks(self, view: EngineView) -> int:
        """Blocks of TGI's allocator (`max_batch_total_tokens / block_size`) not yet reserved."""
        total = self.max_batch_total_tokens
        capacity = view.num_total_blocks * view.block_size
        if total is None:
            return view.num_free_blocks
        if total > capacity:
            raise SimulationError(f"tgi: max_batch_total_tokens {total} exceeds the KV pool ({capacity} tokens); "
                                  "TGI would fail at warmup")
        return view.num_free_blocks - (view.num_total_blocks - total // view.block_size)

    def _next_forward(self, view: EngineView) -> list[Scheduled]:
        """The cached batch's next forward: one token per decode, the next chunk of each unfinished prompt
        (server side: oldest first, budget `max_batch_prefill_tokens - (len(batch) - 1)`, at least 1)."""
        budget = self.max_batch_prefill_tokens - (len(view.running) - 1)
        out = []
        for req in view.running:
            n = req.num_uncomputed_tokens
            if n > 1 or req.num_generated_tokens == 0:
                n = max(min(n, budget), 1)
                budget -= n
            out.append(Scheduled(req.request_id, n))
        return out

    def _next_batch(self, view: EngineView, free: int, min_size: int | None, max_size: int | None,
                    prefill_budget: int) -> list[Scheduled]:
        """`Queue::next_batch`: FIFO, stop at the first request whose reservation or prompt does not fit."""
        waiting = view.waiting
        if not waiting or (min_size is not None and len(waiting) < min_size) or max_size == 0:
            return []
        prefill_budget = cdiv(max(prefill_budget, 0), view.block_size) * view.block_size
        batch: list[Scheduled] = []
        num_prefill = 0
        for req in waiting:
            # TGI's reservation adds `speculate` (k) when speculating
            reserved = self.reserved_tokens(req.spec, view.max_model_len, view.num_speculative_tokens)
            need = cdiv(reserved, view.block_size)
            self._check_fits(view, req, reserved)
            if need > free:
                break
            suffix = req.num_uncomputed_tokens
            if num_prefill + suffix > prefill_budget:
                if self.prefill_chunking and prefill_budget - num_prefill > 0:
                    batch.append(Scheduled(req.request_id, prefill_budget - num_prefill, reserved))
                break
            batch.append(Scheduled(req.request_id, suffix, reserved))
            free -= need
            num_prefill += suffix
            if max_size is not None and len(batch) == max_size:
                break
        if min_size is not None and len(batch) < min_size:
            return []
        return batch

    def _check_fits(self, view: EngineView, req: Request, reserved: int) -> None:
        """What TGI refuses at startup or validation would stall the queue here: fail loudly instead."""
        if not self.prefill_chunking and req.num_prompt_tokens > self.max_batch_prefill_tokens:
            raise SimulationError(
                f"tgi: request {req.request_id} has a {req.num_prompt_tokens}-token prompt > "
                f"max_batch_prefill_tokens {self.max_batch_prefill_tokens} with prefill_chunking off; TGI refuses "
                "to start unless max_batch_prefill_tokens >= max_input_tokens")
        k = view.num_speculative_tokens
        if k and cdiv(reserved - k, view.block_size) <= view.num_total_blocks < cdiv(reserved, view.block_size):
            raise SimulationError(
                f"tgi: request {req.request_id} reserves {reserved} tokens with speculate "
                f"{view.num_speculative_tokens} > the KV pool ({view.num_total_blocks * view.block_size} tokens); "
                "TGI rejects it at validation (max_total_tokens must be <= max_batch_total_tokens)")
        total = self.max_batch_total_tokens
        if total is not None and cdiv(reserved, view.block_size) > total // view.block_size:
            raise SimulationError(
                f"tgi: request {req.request_id} reserves {reserved} tokens > max_batch_total_tokens {total}; "
                "TGI rejects it at validation (max_total_tokens must be <= max_batch_total_tokens)")

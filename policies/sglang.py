"""SGLang 0.5.10 scheduler (`sglang/srt/managers/{scheduler,schedule_policy,schedule_batch}.py`,
`server_args.py`, `environ.py`): ../shared/docs/engines.md section 4.

Simplifications: no radix prefix cache (so no evictable tokens and `fcfs` order only), no overlap
scheduling, no priority preemption; the page size is the engine's KV block size (SGLang's default is 1).
The new_token_ratio returns to its initial value when a step finds nothing running (SGLang: when the
scheduler goes idle). The last request that cannot grow is not aborted (the engine never admits one
that cannot fit alone).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import ClassVar

from simcore.batch import Batch, Scheduled
from simcore.engine import SimulationError
from simcore.kvcache import cdiv
from simcore.request import Request, RequestSpec
from simcore.view import EngineView, max_total_tokens

CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20              # SGLANG_RETRACT_DECODE_STEPS


@dataclass(frozen=True)
class SglangState:
    """What SGLang's Scheduler keeps across steps: `new_token_ratio`; `full_ids`, the running requests
    when `batch_is_full` was set (no prefill is tried again until one of them leaves); `requeued`,
    (request id, time it re-entered the queue) of retracted requests, which SGLang appends at the back."""
    new_token_ratio: float
    full_ids: frozenset[int] | None = None
    requeued: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Sglang:
    """`get_next_batch_to_run`: a prefill batch if one can be formed, else a decode of every running request.

    Prefill (`PrefillAdder`): the one chunked request continues first (`min(chunked_prefill_size, KV
    left)` tokens). Then waiting requests in queue order, while fewer than `max_running_requests` run:
    each is charged its prompt (+ generated, after a retraction) + min(max_new - generated, 4096) output
    tokens against free KV minus `new_token_ratio` x every running request's remaining output (clipped
    at 4096); the first that does not fit stops admission and marks the batch full (no prefill is tried
    again until a running request leaves). `max_prefill_tokens` stops admission except for the first
    request; a prompt longer than what is left of `chunked_prefill_size` is cut to a page multiple and
    becomes the only chunked request. Decodes do not run in a prefill step unless `enable_mixed_chunk`.
    Decode: if the next token of every running request does not fit, retract the one with the fewest
    generated tokens (ties: the longest prompt, then the latest admitted) until it does, and set
    new_token_ratio = min(1, (generated + 20 x running) / (max_new + 1)) over those left; otherwise the
    ratio decays by (init - min) / `new_token_ratio_decay_steps` down to init x `min_new_token_ratio_factor`.
    `chunked_prefill_size: 0` disables chunking (SGLang spells it -1).
    """
    name: ClassVar[str] = "sglang"
    holds_slots_until_drained: ClassVar[bool] = False
    chunked_prefill_size: int = 8192     # H100/H200 default; 2048-4096 on smaller GPUs
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None  # None: clamp(kv_tokens / max_model_len * 512, 2048, 4096)
    schedule_conservativeness: float = 1.0
    init_new_token_ratio: float = 0.7    # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600    # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    enable_mixed_chunk: bool = False

    def __post_init__(self):
        if self.max_running_requests is not None and (not isinstance(self.max_running_requests, int)
                                                      or self.max_running_requests < 1):
            raise ValueError(f"engine.max_running_requests: must be a positive integer, got {self.max_running_requests!r}")
        if self.max_prefill_tokens < 1 or self.new_token_ratio_decay_steps < 1:
            raise ValueError("engine.max_prefill_tokens and engine.new_token_ratio_decay_steps must be at least 1")

    @property
    def init_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)

    @property
    def min_ratio(self) -> float:
        return min(self.init_ratio * self.min_new_token_ratio_factor, 1.0)

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        # Admission needs prompt + estimated output strictly below the free KV, even when alone.
        est = min(max_total_tokens(spec, max_model_len) - spec.num_prompt_tokens, CLIP_MAX_NEW_TOKENS_ESTIMATION)
        return max(spec.num_prompt_tokens + spec.num_output_tokens, spec.num_prompt_tokens + est + 1)

    def _max_new(self, req: Request, max_model_len: int) -> int:
        return max_total_tokens(req.spec, max_model_len) - req.num_prompt_tokens

    def _max_running(self, view: EngineView) -> int:
        if self.max_running_requests is not None:
            return self.max_running_requests
        kv_tokens = view.num_total_blocks * view.block_size
        return min(max(2048, min(4096, kv_tokens * 512 // view.max_model_len)), max(1, kv_tokens // 2))

    def schedule(self, view: EngineView) -> Batch:
        st = view.policy_state if isinstance(view.policy_state, SglangState) else SglangState(self.init_ratio)
        if not view.running:
            st = SglangState(self.init_ratio, None, st.requeued)
        running_ids = {r.request_id for r in view.running}
        if st.full_ids is not None and not st.full_ids <= running_ids:
            st = SglangState(st.new_token_ratio, None, st.requeued)  # someone left: batch no longer full
        chunked = next((r for r in view.running if r.is_prefilling), None)
        decoding = [r for r in view.running if not r.is_prefilling]
        prefill, full = self._prefill(view, st, chunked, decoding)
        full_ids = frozenset(running_ids) if full else st.full_ids
        if prefill:
            admitted = {s.request_id for s in prefill}
            requeued = tuple(p for p in st.requeued if p[0] not in admitted)
            state = SglangState(st.new_token_ratio, full_ids, requeued)
            if self.enable_mixed_chunk and decoding:
                prefill = [Scheduled(r.request_id, 1) for r in decoding] + prefill
            return Batch(tuple(prefill), policy_state=state)
        return self._decode(view, SglangState(st.new_token_ratio, full_ids, st.requeued), decoding)

    # ---- prefill ----
    def _queue(self, view: EngineView, st: SglangState):
        """Waiting requests in queue-entry order: retracted ones re-entered at the back when retracted."""
        waiting = view.waiting
        entry = dict(st.requeued)
        num_front = sum(1 for _ in itertools.takewhile(lambda r: r.num_preemptions > 0, waiting))
        retracted = sorted(itertools.islice(waiting, num_front),
                           key=lambda r: (entry.get(r.request_id, r.spec.arrival_s), r.request_id))
        fresh = itertools.islice(waiting, num_front, None)
        return heapq.merge(retracted, fresh, key=lambda r: entry.get(r.request_id, r.spec.arrival_s))

    def _prefill(self, view: EngineView, st: SglangState, chunked: Request | None, decoding: list[Request]):
        """Returns (scheduled chunks, whether batch_is_full was set)."""
        max_running = self._max_running(view)
        if (st.full_ids is not None or not view.waiting) and chunked is None:
            return [], False
        if len(decoding) >= max_running and chunked is None:
            return [], True
        page = view.block_size
        free_blocks = view.num_free_blocks
        rem_input, rem_chunk = self.max_prefill_tokens, self.chunked_prefill_size or None
        if self.enable_mixed_chunk and decoding:
            free_blocks -= sum(view.blocks_to_hold(r, r.num_computed_tokens + 1) for r in decoding)
            if free_blocks < 0:
                return [], False  # the decodes alone do not fit: decode (and retract) instead
            rem_input -= len(decoding)
            rem_chunk = None if rem_chunk is None else rem_chunk - len(decoding)
        avail = free_blocks * page
        offset = sum(min(self._max_new(r, view.max_model_len) - r.num_generated_tokens,
                         CLIP_MAX_NEW_TOKENS_ESTIMATION) * st.new_token_ratio for r in decoding)
        cur_offset = 0
        out: list[Scheduled] = []

        def charge(extend: int, max_new: int) -> None:
            nonlocal offset, cur_offset, rem_input, rem_chunk
            extend = cdiv(extend, page) * page
            offset += extend + max_new
            cur_offset += extend
            rem_input -= extend
            if rem_chunk is not None:
                rem_chunk -= extend

        if chunked is not None:  # add_chunked_req
            n = min(chunked.num_uncomputed_tokens, rem_chunk if rem_chunk is not None else chunked.num_uncomputed_tokens,
                    int(avail - offset))
            if n > 0:
                done = n == chunked.num_uncomputed_tokens
                out.append(Scheduled(chunked.request_id, n))
                charge(n, min(self._max_new(chunked, view.max_model_len), CLIP_MAX_NEW_TOKENS_ESTIMATION) if done else 0)
        num_allocatable = max_running - len(decoding)
        for req in self._queue(view, st):
            if len(out) >= num_allocatable:
                return out, True
            extend = req.num_uncomputed_tokens
            max_new = min(self._max_new(req, view.max_model_len) - req.num_generated_tokens,
                          CLIP_MAX_NEW_TOKENS_ESTIMATION)
            if extend + max_new >= avail - offset:
                return out, True  # NO_TOKEN
            paged = cdiv(extend, page) * page
            if paged >= rem_input and out:
                break
            if rem_chunk is None or paged <= rem_chunk:
                out.append(Scheduled(req.request_id, extend))
                charge(extend, max_new)
            else:
                trunc = rem_chunk // page * page
                if trunc <= 0:
                    break
                out.append(Scheduled(req.request_id, trunc))
                charge(trunc, 0)
                break  # rem_chunk is now below one page
            if avail - offset <= 0 or avail - cur_offset <= 0:
                return out, True
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
        return out, False

    # ---- decode ----
    def _decode(self, view: EngineView, st: SglangState, decoding: list[Request]) -> Batch:
        if not decoding:
            return Batch(policy_state=st)
        free = view.num_free_blocks

        def need(reqs):
            return sum(view.blocks_to_hold(r, r.num_computed_tokens + 1) for r in reqs)

        if need(decoding) <= free:
            ratio = max(st.new_token_ratio - (self.init_ratio - self.min_ratio) / self.new_token_ratio_decay_steps,
                        self.min_ratio)
            return Batch(tuple(Scheduled(r.request_id, 1) for r in decoding),
                         policy_state=SglangState(ratio, st.full_ids, st.requeued))
        # retract_decode: stable sort, descending (generated, -prompt); pop from the end
        keep = sorted(decoding, key=lambda r: (r.num_generated_tokens, -r.num_prompt_tokens), reverse=True)
        retracted = []
        while need(keep) > free + sum(r.num_blocks for r in retracted):
            if len(keep) == 1:
                raise SimulationError(f"sglang: request {keep[0].request_id} cannot grow by one token even alone "
                                      "(SGLang aborts it with an out-of-memory error)")
            retracted.append(keep.pop())
        keep_ids = {r.request_id for r in keep}
        kept = [r for r in decoding if r.request_id in keep_ids]
        generated = sum(r.num_generated_tokens for r in kept)
        max_new = sum(self._max_new(r, view.max_model_len) for r in kept)
        ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(kept)) / (max_new + 1))
        requeued = st.requeued + tuple((r.request_id, view.now_s) for r in retracted)
        return Batch(tuple(Scheduled(r.request_id, 1) for r in kept), tuple(r.request_id for r in retracted),
                     policy_state=SglangState(ratio, None, requeued))

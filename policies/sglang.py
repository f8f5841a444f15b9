"""SGLang 0.5.10 scheduler (`sglang/srt/managers/{scheduler,schedule_policy,schedule_batch}.py`,
`server_args.py`, `environ.py`): docs/engines.md section 4.

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

from policies.defaults import GpuLike, check_at_least, sglang_chunked_prefill_size
from policies.speculation_counting import sglang_decode_room
from policies.sglang_swa_budget import swa_budget
from simcore.batch import QUIET, Batch, DecodeShortcut, Scheduled
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
    # what an answer says it rests on (policies.imitated)
    imitates: ClassVar[str] = "SGLang 0.5.10's scheduler"
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
        check_at_least(self, 1, "max_running_requests", "max_prefill_tokens", "new_token_ratio_decay_steps")
        check_at_least(self, 0, "chunked_prefill_size")

    @classmethod
    def for_gpu(cls, gpu: GpuLike, max_model_len: int, **knobs) -> "Sglang":
        """The policy as SGLang's server sets it up on `gpu` (what the sweep file calls): an unset
        chunked_prefill_size follows the GPU's memory (2048 on an L4, 4096 on an A100-40GB or L40S, 8192 on an
        H100 or H200, 16384 on a B200: policies/defaults.py). The field default is the H100's."""
        knobs.setdefault("chunked_prefill_size", sglang_chunked_prefill_size(gpu))
        return cls(**knobs)

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
        # (the batch marked full holds this step's admissions too: any of them leaving clears the mark)
        full_ids = frozenset(running_ids.union(s.request_id for s in prefill)) if full else st.full_ids
        if prefill:
            admitted = {s.request_id for s in prefill}
            requeued = tuple(p for p in st.requeued if p[0] not in admitted)
            state = SglangState(st.new_token_ratio, full_ids, requeued)
            if self.enable_mixed_chunk and decoding:
                prefill = [Scheduled(r.request_id, 1) for r in decoding] + prefill
            return Batch(tuple(prefill), policy_state=state)
        return self._decode(view, SglangState(st.new_token_ratio, full_ids, st.requeued), decoding)

    def schedule_decodes(self, view: EngineView) -> DecodeShortcut | None:
        """`schedule` when every running request decodes and the decision leaves the state as it is:
        a prefill that marks the batch neither full nor takes a retracted request (prefill steps do not
        move the ratio), or a decode of every request that provably repeats until an arrival, a finish or
        KV growth that does not fit: the ratio at its floor (it no longer decays), their next tokens fit,
        and no prefill tried (nothing waits, or the batch is full and marked so for these requests). Else
        None: while the ratio decays, or when the queue is tried and admits nothing, the state or the
        admission budget (free KV and the running requests' estimates both move every step) may change."""
        st, running = view.policy_state, view.running
        if not running or type(st) is not SglangState:
            return None
        if st.full_ids is None and view.waiting:
            prefill, full = self._prefill(view, st, None, running)
            admitted = {s.request_id for s in prefill}
            if full or not prefill or any(rid in admitted for rid, _ in st.requeued):
                return None   # the state changes: batch marked full, or a retracted request leaves the queue
            return DecodeShortcut(tuple(prefill), decode_running=self.enable_mixed_chunk)
        if st.new_token_ratio != self.min_ratio or view.num_decode_growth_blocks() > view.num_free_blocks:
            return None   # the ratio decays, or a retraction
        if st.full_ids is None or st.full_ids <= self._ids(running):   # (full: kept while none of them leaves)
            return QUIET
        return None

    @staticmethod
    def _ids(running) -> frozenset[int]:
        return frozenset(r.request_id for r in running)

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
        """`get_new_batch_prefill`. Returns (scheduled chunks, whether batch_is_full was set)."""
        max_running = self._max_running(view)
        if (st.full_ids is not None or not view.waiting) and chunked is None:
            return [], False
        if len(decoding) >= max_running and chunked is None:
            return [], True
        swa = swa_budget(view)   # SGLang's hybrid SWA memory: a second budget, the sliding pool's
        free_blocks = view.num_free_blocks if swa is None else swa.full_free_blocks
        num_mixed = len(decoding) if self.enable_mixed_chunk else 0
        if num_mixed:
            free_blocks -= view.num_decode_growth_blocks() if chunked is None else \
                sum(view.blocks_to_hold(r, r.num_computed_tokens + 1) for r in decoding)
            if free_blocks < 0:
                return [], False  # the decodes alone do not fit: decode (and retract) instead
        running_estimate = sum(self._remaining_estimate(view, r) * st.new_token_ratio for r in decoding)
        adder = _PrefillAdder(view.block_size, free_blocks * view.block_size, running_estimate,
                              self.max_prefill_tokens - num_mixed,
                              self.chunked_prefill_size - num_mixed if self.chunked_prefill_size else None, swa)
        if chunked is not None:
            adder.add_chunked(chunked, self._remaining_estimate(view, chunked))
        num_allocatable = max_running - len(decoding)
        for req in self._queue(view, st):
            if len(adder.out) >= num_allocatable:
                return adder.out, True
            result = adder.add_one(req, self._remaining_estimate(view, req))
            if result != _CONTINUE:
                return adder.out, result == _NO_TOKEN
        return adder.out, False

    def _remaining_estimate(self, view: EngineView, req: Request) -> int:
        # (through the view: a running request may be a lazy decoder of the fast engine)
        return min(self._max_new(req, view.max_model_len) - view.num_generated_tokens(req),
                   CLIP_MAX_NEW_TOKENS_ESTIMATION)

    # ---- decode ----
    def _decode(self, view: EngineView, st: SglangState, decoding: list[Request]) -> Batch:
        if not decoding:
            return Batch(policy_state=st)
        free = view.num_free_blocks
        # speculative decoding (policies/speculation_counting.py): room for the verification and the draft tree
        room = sglang_decode_room(view)

        def need(reqs):
            return sum(view.blocks_to_hold(r, r.num_computed_tokens + room) for r in reqs)

        if need(decoding) <= free:
            ratio = max(st.new_token_ratio - (self.init_ratio - self.min_ratio) / self.new_token_ratio_decay_steps,
                        self.min_ratio)
            return Batch(tuple(Scheduled(r.request_id, 1 + r.num_spec_tokens) for r in decoding),
                         policy_state=SglangState(ratio, st.full_ids, st.requeued))
        # retract_decode: stable sort, descending (generated, -prompt); pop from the end (speculating: the
        # batch order, unsorted: SGLang can only filter a speculative batch from the back)
        keep = list(decoding) if view.num_speculative_tokens else \
            sorted(decoding, key=lambda r: (r.num_generated_tokens, -r.num_prompt_tokens), reverse=True)
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
        return Batch(tuple(Scheduled(r.request_id, 1 + r.num_spec_tokens) for r in kept),
                     tuple(r.request_id for r in retracted),
                     policy_state=SglangState(ratio, None, requeued))


_CONTINUE, _NO_TOKEN, _OTHER = "continue", "no_token", "other"  # schedule_policy.AddReqResult


class _PrefillAdder:
    """SGLang's `PrefillAdder` budgets for one prefill batch, in tokens (extends rounded up to pages):
    `rem_total` = free KV - the running requests' ratio-scaled output estimate - what was added
    (extend + output estimate); `rem_input` (max_prefill_tokens); `rem_chunk` (chunked_prefill_size)."""

    def __init__(self, page: int, avail: int, running_estimate: float, rem_input: int, rem_chunk: int | None,
                 swa=None):
        self.page, self.avail = page, avail
        self.swa = swa   # policies/sglang_swa_budget.SwaBudget under hybrid SWA memory, else None
        self.offset, self.cur_offset = running_estimate, 0
        self.rem_input, self.rem_chunk = rem_input, rem_chunk
        self.out: list[Scheduled] = []

    @property
    def rem_total(self) -> float:
        return self.avail - self.offset

    def _paged(self, n: int) -> int:
        return cdiv(n, self.page) * self.page

    def _charge(self, extend: int, output_estimate: int) -> None:
        extend = self._paged(extend)
        if self.swa is not None:
            self.swa.charge(extend, self.rem_chunk)
        self.offset += extend + output_estimate
        self.cur_offset += extend
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend

    def add_chunked(self, req: Request, output_estimate: int) -> None:
        """The chunked request's next chunk: as much as the chunk budget and KV allow (no ratio check)."""
        left = req.num_uncomputed_tokens
        n = min(left, self.rem_chunk if self.rem_chunk is not None else left, int(self.rem_total))
        if self.swa is not None:   # (the sliding pool must hold the chunk too)
            n = min(n, self.swa.rem)
        if n > 0:
            self.out.append(Scheduled(req.request_id, n))
            self._charge(n, output_estimate if n == left else 0)

    def add_one(self, req: Request, output_estimate: int) -> str:
        extend = req.num_uncomputed_tokens
        if extend + output_estimate >= self.rem_total:
            return _NO_TOKEN
        if self.swa is not None and not self.swa.fits(extend, self.rem_chunk):
            return _NO_TOKEN
        if self._paged(extend) >= self.rem_input and self.out:
            return _OTHER
        if self.rem_chunk is None or self._paged(extend) <= self.rem_chunk:
            self.out.append(Scheduled(req.request_id, extend))
            self._charge(extend, output_estimate)
        else:  # becomes the one chunked request; its output is charged with its last chunk
            trunc = self.rem_chunk // self.page * self.page
            if trunc <= 0:
                return _OTHER
            self.out.append(Scheduled(req.request_id, trunc))
            self._charge(trunc, 0)
        if self.rem_total <= 0 or self.avail - self.cur_offset <= 0 or (self.swa is not None and self.swa.exhausted):
            return _NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return _OTHER
        return _CONTINUE

"""TensorRT-LLM in-flight batching (`cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`,
`microBatchScheduler.cpp`, `trtGptModelInflightBatching.cpp`; knobs from `tensorrt_llm/llmapi/llm_args.py`):
docs/engines.md section 3.

Speculative decoding (engine.speculative, policies/speculation_counting.py): a generation request takes 1 +
its drafts of `max_num_tokens` and KV for them plus the one-model drafter's `num_extra_kv_tokens`; the
rejected drafts' KV is rewound after the step (MAX_UTILIZATION; GUARANTEED_NO_EVICT's reservation covers it).

Simplifications: no KV block reuse (so no `beneficialToSkip`), beam width 1, no pipeline or overlap
micro-batches, one attention window; the context chunk unit is the engine's KV block size
(TRT-LLM's `tokens_per_block`, 32 by default there); `max_context_length` = `max_num_tokens` (context FMHA
on). GUARANTEED_NO_EVICT reserves prompt + max output in the pool on admission, where TRT-LLM counts the
blocks still to come: the decisions are the same, the KV usage looks fuller. STATIC_BATCH and PREFILL_FIRST
capacity policies are not modelled.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

from policies.defaults import GpuLike, check_at_least
from policies.speculation_counting import trtllm_held_tokens, trtllm_reservation_slack, verification_tokens
from simcore.batch import QUIET, Batch, DecodeShortcut, Scheduled
from simcore.engine import SimulationError
from simcore.request import Request, RequestSpec, Status
from simcore.view import EngineView, max_total_tokens

CAPACITY_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")
CHUNKING_POLICIES = ("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS")


@dataclass(frozen=True)
class TrtLlm:
    """Capacity scheduler, then micro-batch scheduler, over the active requests in arrival order.

    Capacity (`capacity_scheduler_policy`):
    - GUARANTEED_NO_EVICT (default): every generating request is kept; then contexts in arrival order are
      admitted while their remaining blocks to completion (prompt + max output) fit, stopping at the first
      that does not (head-of-line). Nothing is ever paused.
    - MAX_UTILIZATION: requests in arrival order are kept while the blocks for their next step fit (the
      whole prompt for a context that has not started, one token for a generating one); when one does not,
      the most recently started request not yet kept is paused (KV freed, recomputed later from prompt +
      generated tokens) and the check repeats; with nothing left to pause, scheduling stops there.
    Both stop at `max_batch_size` requests.
    Micro-batch: in the same order, generation steps take 1 token and, without `enable_chunked_context`,
    contexts their whole prompt, until `max_num_tokens` would be exceeded (then stop). With chunking,
    contexts get the tokens left after all generation steps: FIRST_COME_FIRST_SERVED gives each in turn
    as much as fits, EQUAL_PROGRESS grows every context by one chunk unit per round; a chunk shorter than
    the remaining prompt is a multiple of the block size.
    """
    name: ClassVar[str] = "trtllm"
    # what an answer says it rests on (policies.imitated)
    imitates: ClassVar[str] = "TensorRT-LLM's in-flight batching (its C++ batch manager, main-branch sources)"
    holds_slots_until_drained: ClassVar[bool] = False
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"
    enable_chunked_context: bool = False
    context_chunking_policy: str = "FIRST_COME_FIRST_SERVED"

    def __post_init__(self):
        if self.capacity_scheduler_policy not in CAPACITY_POLICIES:
            raise ValueError(f"engine.capacity_scheduler_policy must be one of {', '.join(CAPACITY_POLICIES)}, "
                             f"not {self.capacity_scheduler_policy!r}")
        if self.context_chunking_policy not in CHUNKING_POLICIES:
            raise ValueError(f"engine.context_chunking_policy must be one of {', '.join(CHUNKING_POLICIES)}, "
                             f"not {self.context_chunking_policy!r}")
        check_at_least(self, 1, "max_batch_size", "max_num_tokens")

    @classmethod
    def for_gpu(cls, gpu: GpuLike, max_model_len: int, **knobs) -> "TrtLlm":
        """Every policy's deployment constructor (what the sweep file calls). TensorRT-LLM's defaults
        (max_batch_size 2048, max_num_tokens 8192, tensorrt_llm/llmapi/llm_args.py) do not depend on the
        GPU, so this is `TrtLlm(**knobs)`."""
        return cls(**knobs)

    @property
    def guaranteed_no_evict(self) -> bool:
        return self.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        if self.guaranteed_no_evict:
            return max_total_tokens(spec, max_model_len)
        return spec.num_prompt_tokens + spec.num_output_tokens

    def speculation_reserve_tokens(self, speculation) -> int:
        """KV tokens a speculating request reserves past `kv_tokens_needed` (GUARANTEED_NO_EVICT: the drafter's
        slots and the last verification's drafts, policies/speculation_counting.py); `speculation`: the run's
        Speculation or the engine's view (both carry the counts). The admission's reservation and the
        refusal on arrival (simcore/rules.py) both take it from here."""
        return trtllm_reservation_slack(speculation) if self.guaranteed_no_evict else 0

    def schedule(self, view: EngineView) -> Batch:
        if self.guaranteed_no_evict:
            fitting, paused = self._guaranteed_no_evict(view), []
        else:
            fitting, paused = self._max_utilization(view)
        return Batch(tuple(self._micro_batch(view, fitting)), tuple(r.request_id for r in paused))

    def schedule_decodes(self, view: EngineView) -> DecodeShortcut | None:
        """`schedule` when every running request is generating, none is paused, and they are in arrival order
        (the order `schedule` lists them), every one gets its token (batch size, token budget and, with
        MAX_UTILIZATION, its KV growth allow) and, with chunked context, no context starts (contexts are
        listed first there); else None. The head contexts that fit start after the decodes; with none,
        the answer is quiet, which holds until an arrival or a finish: the blocks left for the head only
        shrink while the batch decodes (GUARANTEED_NO_EVICT reserves whole sequences), the rest is fixed."""
        running, waiting = view.running, view.waiting
        num_running = len(running)
        if not num_running or num_running > min(self.max_batch_size, self.max_num_tokens):
            return None
        if waiting and waiting[0].num_preemptions > 0:
            return None   # a paused request resumes in arrival order among the running ones
        avail = view.num_free_blocks
        if not self.guaranteed_no_evict:
            avail -= view.num_decode_growth_blocks()
            if avail < 0:
                return None   # someone is paused
        keys = [(r.spec.arrival_s, r.request_id) for r in running]
        if not all(a < b for a, b in zip(keys, keys[1:])):
            return None
        contexts = self._fresh_contexts(view, avail, num_running)
        if contexts is None or (contexts and self.enable_chunked_context):
            return None
        return DecodeShortcut(tuple(contexts)) if contexts else QUIET

    def _fresh_contexts(self, view: EngineView, avail: int, num_running: int) -> list[Scheduled] | None:
        """New contexts, whole, after `num_running` generation steps: both capacity policies admit queued
        requests in order while their blocks fit (no pausing among them), then the micro-batch token budget.
        None where `schedule` fails (a context over `max_num_tokens`)."""
        out: list[Scheduled] = []
        num_tokens = num_running
        for req in view.waiting:
            if num_running + len(out) >= self.max_batch_size:
                break
            reserve = self._reservation(view, req)
            need = view.blocks_to_hold(req, reserve)
            if need > avail:
                break
            n = req.num_uncomputed_tokens
            if self.enable_chunked_context:
                return [Scheduled(req.request_id, n, reserve)]   # (only whether one starts matters)
            if n > self.max_num_tokens:
                return None   # `schedule` fails loudly on it
            if num_tokens + n > self.max_num_tokens:
                break
            out.append(Scheduled(req.request_id, n, reserve))
            avail -= need
            num_tokens += n
        return out

    # ---- capacity scheduler ----
    @staticmethod
    def _active(view: EngineView):
        """Active requests in arrival order. Running ones and paused ones (front of `waiting`) are sorted;
        fresh arrivals follow in queue order, since FCFS admission never lets one pass an earlier one."""
        waiting = view.waiting
        num_paused = sum(1 for _ in itertools.takewhile(lambda r: r.num_preemptions > 0, waiting))
        head = sorted([*view.running, *itertools.islice(waiting, num_paused)],
                      key=lambda r: (r.spec.arrival_s, r.request_id))
        return head, itertools.islice(waiting, num_paused, None)

    def _reservation(self, view: EngineView, req: Request) -> int:
        if self.guaranteed_no_evict:
            return max_total_tokens(req.spec, view.max_model_len) + (
                self.speculation_reserve_tokens(view) if view.num_speculative_tokens else 0)
        return req.num_tokens + view.num_lookahead_tokens  # the whole context is allocated at its first chunk

    def _guaranteed_no_evict(self, view: EngineView) -> list[Request]:
        head, fresh = self._active(view)
        avail = view.num_free_blocks
        fit = [r for r in head if r.status is Status.RUNNING and not r.is_prefilling][:self.max_batch_size]
        for req in itertools.chain((r for r in head if r.status is not Status.RUNNING or r.is_prefilling), fresh):
            if len(fit) >= self.max_batch_size:
                break
            need = view.blocks_to_hold(req, self._reservation(view, req))  # 0 for a started context
            if need > avail:
                break
            fit.append(req)
            avail -= need
        return fit

    def _max_utilization(self, view: EngineView) -> tuple[list[Request], list[Request]]:
        head, fresh = self._active(view)
        active = head  # fresh arrivals are appended lazily: none of them has started, so none is paused
        avail = view.num_free_blocks
        fit: list[Request] = []
        paused: list[Request] = []
        i, end = 0, len(active)
        while True:
            if i == end:
                if end < len(active) or (nxt := next(fresh, None)) is None:
                    break
                active.append(nxt)
                end += 1
            req = active[i]
            if req.status is not Status.RUNNING:
                need = view.blocks_to_hold(req, self._reservation(view, req))
            else:
                need = view.blocks_to_hold(req, trtllm_held_tokens(view, req, verification_tokens(req))) \
                    if not req.is_prefilling else 0
            if len(fit) < self.max_batch_size and need <= avail:
                fit.append(req)
                avail -= need
                i += 1
                continue
            started = [j for j in range(i, end) if active[j].status is Status.RUNNING]
            if not started:
                break
            victim = active[started[-1]]
            paused.append(victim)
            avail += victim.num_blocks
            end = started[-1]
        return fit, paused

    # ---- micro-batch scheduler ----
    def _micro_batch(self, view: EngineView, fitting: list[Request]) -> list[Scheduled]:
        out: list[Scheduled] = []
        to_chunk: list[Request] = []
        num_tokens = 0
        for count, req in enumerate(fitting, 1):
            context = req.status is not Status.RUNNING or req.is_prefilling
            if context and self.enable_chunked_context:
                to_chunk.append(req)
            else:
                need = req.num_uncomputed_tokens if context else verification_tokens(req)
                if context and need > self.max_num_tokens:
                    raise SimulationError(
                        f"trtllm: request {req.request_id} needs a {need}-token context > max_num_tokens "
                        f"{self.max_num_tokens} without enable_chunked_context (TensorRT-LLM fails its check "
                        "'number of context tokens exceeds the limit')")
                if num_tokens + need > self.max_num_tokens:
                    break
                out.append(self._scheduled(view, req, need))
                num_tokens += need
            if count >= self.max_batch_size:
                break
        if to_chunk:
            chunks = self._chunk_sizes(view, to_chunk, self.max_num_tokens - num_tokens)
            contexts = [self._scheduled(view, r, c) for r, c in zip(to_chunk, chunks) if c > 0]
            out = contexts + out  # order within a forward does not matter to the cost model
        return out

    def _scheduled(self, view: EngineView, req: Request, n: int) -> Scheduled:
        if req.status is not Status.RUNNING:
            reserve = self._reservation(view, req)
        else:   # (speculating: the drafter's extra slots past the step's tokens)
            reserve = trtllm_held_tokens(view, req, n) if view.num_lookahead_tokens else 0
        return Scheduled(req.request_id, n, reserve)

    def _chunk_sizes(self, view: EngineView, reqs: list[Request], capacity: int) -> list[int]:
        remaining = [r.num_uncomputed_tokens for r in reqs]
        max_ctx = self.max_num_tokens
        if sum(min(n, max_ctx) for n in remaining) <= capacity and all(n <= max_ctx for n in remaining):
            return remaining  # everything fits whole
        unit = view.block_size
        chunks = [0] * len(reqs)
        if self.context_chunking_policy == "FIRST_COME_FIRST_SERVED":
            for k, n in enumerate(remaining):
                c = min(n, capacity, max_ctx)
                if c < n:
                    c = c // unit * unit
                chunks[k] = c
                capacity -= c
            return chunks
        used, grew = 0, True
        while used < capacity and grew:  # EQUAL_PROGRESS: one unit per context per round
            grew = False
            for k, n in enumerate(remaining):
                c = min(chunks[k] + unit, n)
                if used + c - chunks[k] > capacity or c > max_ctx or c == chunks[k]:
                    continue
                used += c - chunks[k]
                chunks[k] = c
                grew = True
        return chunks

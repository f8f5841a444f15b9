"""Iteration-level (continuous) batching with whole-prompt prefills: Orca (OSDI'22) and vLLM V0's
default scheduler (docs/engines.md sections 1.8, 5 and 10).

Prefix caching (engine.enable_prefix_caching, vLLM V0's APC): a prompt's cached prefix is not recomputed.

Simplifications: no `delay_factor`, one sequence per request (no beam search).

Against vLLM V1 with chunked prefill off (`enable_chunked_prefill=False`: prompts scheduled whole), the
closest V1 setting: V1 runs every step as running requests first, then new whole prompts, with no
watermark by default, i.e. `continuous` with `mix_prefill_decode: true, watermark: 0`, which makes the same
decisions as vLLM 0.32's Scheduler step by step (fidelity/vllm_scheduler.py). At its defaults
(`mix_prefill_decode: false`, `watermark: 0.01`) it is vLLM V0: a step that admits a prompt runs no
decodes, and 1% of the blocks stay free at admission; V1 has neither.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.chunked_prefill import spec_row
from policies.defaults import GpuLike, check_at_least, check_vllm_budget, vllm_batch_knobs
from simcore.batch import QUIET, Batch, DecodeShortcut, Scheduled
from simcore.request import RequestSpec, Status
from simcore.view import EngineView, max_total_tokens

KV_RESERVATIONS = ("paged", "max")


@dataclass(frozen=True)
class Continuous:
    """vLLM V0 `_schedule_default` (prefill-first) or Orca.

    Prefill pass: waiting requests FCFS, whole prompts (prompt + generated after a recompute) while the
    token budget `max_num_batched_tokens`, `max_num_seqs` and free KV allow, stopping at the first that
    does not fit (head-of-line). vLLM V0 keeps `watermark` (1%) of the blocks free at admission; no
    prefills while swapped requests wait. A step with admissions is prefill-only unless
    `mix_prefill_decode` (Orca's selective batching puts decodes and new prompts in one step).
    Decode pass: every running request one token; with `kv_reservation: paged` a request that needs a
    new block and finds none preempts the tail of `running` (vLLM); with `max` KV for prompt + max
    output is reserved on admission and nothing is ever preempted (Orca). Swapped requests come back
    (swap-in) after the decodes, in a step that preempted nothing.
    """
    name: ClassVar[str] = "continuous"
    # what an answer says it rests on (policies.imitated)
    imitates: ClassVar[str] = ("vLLM V0 0.8.5's scheduler and Orca (with mix_prefill_decode: true, watermark: 0, "
                               "vLLM 0.32.0's V1 without chunked prefill, step for step)")
    holds_slots_until_drained: ClassVar[bool] = False
    supports_prefix_caching: ClassVar[bool] = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_reservation: str = "paged"
    mix_prefill_decode: bool = False
    watermark: float = 0.01

    def __post_init__(self):
        if self.kv_reservation not in KV_RESERVATIONS:
            raise ValueError(f"engine.kv_reservation must be one of {KV_RESERVATIONS}, not {self.kv_reservation!r}")
        check_at_least(self, 1, "max_num_seqs", "max_num_batched_tokens")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"engine.watermark: must be in [0, 1), got {self.watermark!r}")

    @classmethod
    def for_gpu(cls, gpu: GpuLike, max_model_len: int, **knobs) -> "Continuous":
        """The policy as vLLM V0 (0.8.5, chunked prefill off) sets it up, whatever the GPU: max_num_seqs 256
        and a budget of max(max_model_len, 2048) tokens when unset (vllm/config.py SchedulerConfig; vLLM 0.32
        keeps the max(max_model_len, ...) rule without chunked prefill, vllm/engine/arg_utils.py). A budget
        below max_num_seqs or below max_model_len is refused, as vLLM does (no prompt could be scheduled).
        `gpu` is unused: the signature is every policy's."""
        policy = cls(**vllm_batch_knobs(knobs, 256, max(max_model_len, 2048), None))
        check_vllm_budget(policy, max_model_len)
        return policy

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        if self.kv_reservation == "max":
            return max_total_tokens(spec, max_model_len)
        return spec.num_prompt_tokens + spec.num_output_tokens

    def schedule(self, view: EngineView) -> Batch:
        free = view.num_free_blocks
        budget = self.max_num_batched_tokens
        running = list(view.running)
        decodes: list[Scheduled] = []
        preempted: list[int] = []
        order = [] if view.prefix_cache is not None else None  # decodes before each victim (Batch.preempt_at)
        if self.mix_prefill_decode:  # Orca: running requests first, then new prompts in the same step
            free, budget = self._decode_pass(view, running, decodes, preempted, free, budget, order)
            if preempted:
                return Batch(tuple(decodes), tuple(preempted), preempt_at=tuple(order or ()))
            swapped_in, free = self._swap_in_pass(view, len(running), free)
            prefills, free = self._prefill_pass(view, len(running) + len(swapped_in), free, budget,
                                                bool(decodes))
            return Batch(tuple(decodes + swapped_in + prefills))
        prefills, free = self._prefill_pass(view, len(running), free, budget)
        if prefills:
            return Batch(tuple(prefills))
        free, budget = self._decode_pass(view, running, decodes, preempted, free, budget, order)
        if not preempted:
            decodes += self._swap_in_pass(view, len(running), free)[0]
        return Batch(tuple(decodes), tuple(preempted), preempt_at=tuple(order or ()))

    def schedule_decodes(self, view: EngineView) -> DecodeShortcut | None:
        """`schedule` when every running request decodes: the prefill pass alone, then (if it admitted
        nothing, or when mixing) every decode when the budget and the KV growth allow (else None)."""
        if view.prefix_cache is not None or (view.waiting and view.waiting[0].status is Status.SWAPPED):
            return None
        num_running, budget = len(view.running), self.max_num_batched_tokens
        if not self.mix_prefill_decode and view.waiting:
            prefills, _ = self._prefill_pass(view, num_running, view.num_free_blocks, budget)
            if prefills:
                return DecodeShortcut(tuple(prefills), decode_running=False)
        if num_running > budget:
            return None
        free = view.num_free_blocks - view.num_decode_growth_blocks()
        if free < 0:
            return None  # the decode pass would preempt
        if not self.mix_prefill_decode:
            return QUIET
        prefills = self._prefill_pass(view, num_running, free, budget - num_running)[0]
        return DecodeShortcut(tuple(prefills)) if prefills else QUIET

    def _prefill_pass(self, view: EngineView, num_seqs: int, free: int, budget: int, ran: bool = False):
        out: list[Scheduled] = []
        waiting = view.waiting
        if not waiting or waiting[0].status is Status.SWAPPED:
            return out, free  # vLLM V0: no new prefills while anything is swapped out
        reserve_max = self.kv_reservation == "max"
        watermark_blocks = 0 if reserve_max else int(self.watermark * view.num_total_blocks)
        caching = view.prefix_cache is not None   # (the fast path asks often: skip no-op calls)
        for req in waiting:
            num_tokens = req.num_tokens
            hit = view.num_cached_prefix_tokens(req) if caching else 0
            n = num_tokens - req.num_computed_tokens - hit
            pad = view.num_speculative_tokens if self.mix_prefill_decode else 0
            if pad and n == 1 and (ran or req.num_computed_tokens + hit) and \
                    req.num_computed_tokens + hit + pad + 2 <= view.max_model_len:   # (vLLM counts the hit)
                n = 1 + pad   # vLLM V1 pads a one-token admission to a 1 + k verification (chunked_prefill's)
            if n > budget or num_seqs >= self.max_num_seqs:
                break
            reserve = max_total_tokens(req.spec, view.max_model_len) if reserve_max else 0
            if view.num_lookahead_tokens:   # speculative decoding: the drafts' KV slots too (vLLM V1)
                reserve = max(reserve, min(num_tokens - 1 + n + view.num_lookahead_tokens
                                           if n > num_tokens - req.num_computed_tokens - hit else
                                           num_tokens + view.num_lookahead_tokens, view.max_model_len))
            need = view.blocks_to_hold(req, max(num_tokens, reserve))
            if free - need < watermark_blocks:
                break
            out.append(Scheduled(req.request_id, n, reserve))
            if caching:
                view.take(req, max(num_tokens, reserve))
            free -= need
            budget -= n
            num_seqs += 1
        return out, free

    def _decode_pass(self, view, running, out, preempted, free, budget, order=None):
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n, held = 1, 0
            if req.num_spec_tokens or view.num_lookahead_tokens:   # speculative decoding (vLLM V1's counting)
                n, held = spec_row(req, min(1 + req.num_spec_tokens, budget), view.num_lookahead_tokens,
                                   view.max_model_len)
                need = view.blocks_to_hold(req, held)
            else:
                need = view.blocks_to_hold(req, req.num_computed_tokens + 1)
            while need > free:
                victim = running.pop()
                preempted.append(victim.request_id)
                if order is not None:
                    order.append(len(out))
                free += view.blocks_freed(victim)
                if victim is req:
                    break
            if preempted and preempted[-1] == req.request_id:
                break
            out.append(Scheduled(req.request_id, n, held))
            view.take(req, held or req.num_computed_tokens + n)
            free -= need
            budget -= n
            i += 1
        return free, budget

    def _swap_in_pass(self, view: EngineView, num_seqs: int, free: int):
        out = []
        for req in view.waiting:
            if req.status is not Status.SWAPPED or num_seqs >= self.max_num_seqs:
                break
            need = view.blocks_to_hold(req, req.num_tokens)
            if need > free:
                break
            out.append(Scheduled(req.request_id, req.num_uncomputed_tokens))
            free -= need
            num_seqs += 1
        return out, free

"""vLLM V1 / Sarathi-Serve chunked prefill: running requests first, then waiting ones FCFS,
all under one token budget per step (docs/engines.md sections 1.2 and 6).

Checked step by step against vLLM 0.32's own Scheduler (vllm/v1/core/sched/scheduler.py) on random
workloads: same tokens per request, admissions, preemptions, finishes and KV blocks in every step
(fidelity/vllm_scheduler.py, tests/test_vllm_scheduler.py, benchmarks/scheduler_equivalence.py), and
against vLLM 0.15.1's to 0.31.0's with `vllm_version` set to theirs (policies/vllm_versions.py: the rules
that changed between releases; docs/how-it-works.md, "Older vLLM versions").

`scheduling_policy: priority` (vLLM's `--scheduling-policy priority`) orders waiting requests by
(priority, arrival, id), lower value first, and preempts the running request with the largest (priority,
arrival) instead of the newest (vllm/v1/core/sched/scheduler.py, request_queue.py).

Prefix caching (engine.enable_prefix_caching): a new or preempted request's prefill skips its cached
prefix, as vLLM's Phase B does after `get_computed_blocks`, including blocks that requests scheduled
earlier in the same step register or evict (`EngineView.take`).

Speculative decoding (engine.speculative, docs/speculative.md): a decoding request asks for 1 + its drafts,
KV for them plus the drafter's lookahead, as vLLM V1 (`spec_row`); checked against vLLM's Scheduler too.

Simplifications: no multimodal encoder budget, LoRA slots, KV connectors or
`watermark` (vLLM's default 0). Async scheduling (vLLM's `async_scheduling`, the batch queue of
vllm/v1/engine/core.py) is not followed: vLLM then schedules step k+1 before it has processed step k's
output, so a finished request's slot and KV are reused one step later; ours frees them at once. Measured
on random workloads priced with the Llama-3-8B H100 profile, it makes our TTFT a few percent lower under
KV or max_num_seqs pressure (docs: calibration/README.md, "Scheduler equivalence with vLLM").
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import ClassVar

from policies.defaults import (GpuLike, check_at_least, check_vllm_budget, vllm_batch_knobs,
                               vllm_server_batch_defaults)
from policies.vllm_versions import MODELLED, vllm_rules
from simcore.batch import QUIET, Batch, DecodeShortcut, Scheduled
from simcore.request import Request, RequestSpec
from simcore.view import EngineView


SCHEDULING_POLICIES = ("fcfs", "priority")


def _priority_key(req: Request) -> tuple:
    return (req.spec.priority, req.spec.arrival_s, req.request_id)  # vLLM Request.__lt__


def _cap(n: int, budget: int, threshold: int) -> int:
    """Tokens a request with `n` left to compute gets: at most `threshold` (when > 0), at most the budget."""
    return min(threshold if 0 < threshold < n else n, budget)


def spec_row(req: Request, n: int, lookahead: int, max_model_len: int) -> tuple[int, int]:
    """A running request's tokens and KV under speculative decoding, as vLLM V1 schedules them: its
    uncomputed tokens plus its drafts (`n`, already capped by the budget), at most up to max_model_len - 1
    (room for the sampled token), and KV held for them plus `lookahead` slots (at most max_model_len).
    Returns (tokens, KV tokens to hold)."""
    n = min(n, max_model_len - req.num_computed_tokens - 1)
    return n, min(req.num_computed_tokens + n + lookahead, max_model_len)


def _in_priority_order(waiting):
    """Waiting requests lowest (priority, arrival, id) first, popped lazily from a heap."""
    heap = [(_priority_key(r), i) for i, r in enumerate(waiting)]
    heapq.heapify(heap)
    while heap:
        yield waiting[heapq.heappop(heap)[1]]


@dataclass(frozen=True)
class ChunkedPrefill:
    """vLLM V1 `Scheduler.schedule`.

    Phase A walks `running` in admission order, giving each request min(its uncomputed tokens,
    `long_prefill_token_threshold` when > 0, remaining budget) tokens: decodes take 1, a partial prefill
    its next chunk. When KV blocks run out it preempts the tail of `running` (most recently admitted)
    until the request fits or it preempted itself (with `priority`: the largest (priority, arrival) among
    running, handing back its tokens and blocks if it was already scheduled this step). Phase B, only if
    nothing was preempted: admits waiting requests FCFS (or by priority) with strict head-of-line
    blocking, while `max_num_seqs` and the budget allow and the
    whole current sequence fits in free KV (`scheduler_reserve_full_isl`, vLLM PR #37307, on by default since
    0.19; with it off, as in vLLM 0.18 and before, only the step's chunk must fit, so a long prompt is admitted
    into a nearly full pool and preempted part way, benchmarks.scheduler_equivalence against vLLM 0.15.1).
    `long_prefill_token_threshold` applies only when more than one request is running or waiting
    (alone, a request takes the whole budget, as since vLLM 0.31); `long_prefill_token_threshold_adaptive`
    (vLLM 0.31+) floors it at max_num_batched_tokens // (running + waiting requests).

    `vllm_version` (default the newest modelled) picks the rules that changed between releases
    (policies/vllm_versions.py): an unset `scheduler_reserve_full_isl` takes that release's default, the
    threshold caps a lone request before 0.31, `for_gpu` applies that release's per-GPU batch defaults, and
    `vllm_rules` tells experiments.simulate the rest (the KV free queue's order, async scheduling's default,
    the hybrid KV cache manager beside a KV connector).
    """
    name: ClassVar[str] = "chunked_prefill"
    # what an answer says it rests on (policies.imitated)
    imitates: ClassVar[str] = ("vLLM V1's scheduler, step for step as vLLM {vllm_version}'s "
                               "(benchmarks.scheduler_equivalence; engine.vllm_version)")
    holds_slots_until_drained: ClassVar[bool] = False
    supports_prefix_caching: ClassVar[bool] = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    scheduler_reserve_full_isl: bool | None = None   # None: vllm_version's default (on since 0.19)
    vllm_version: str | None = None                  # None: policies.vllm_versions.MODELLED
    # vLLM 0.31+: the threshold floored at max_num_batched_tokens // (running + waiting requests)
    long_prefill_token_threshold_adaptive: bool = False

    def __post_init__(self):
        rules = vllm_rules(MODELLED if self.vllm_version is None else self.vllm_version)
        object.__setattr__(self, "vllm_version", rules.version)
        object.__setattr__(self, "vllm_rules", rules)   # not a field: derived (policies.vllm_versions.rules_of)
        if self.scheduler_reserve_full_isl is None:
            object.__setattr__(self, "scheduler_reserve_full_isl", rules.reserve_full_isl)
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"engine.scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"not {self.scheduling_policy!r}")
        check_at_least(self, 1, "max_num_seqs", "max_num_batched_tokens")
        check_at_least(self, 0, "long_prefill_token_threshold")
        for knob in ("scheduler_reserve_full_isl", "long_prefill_token_threshold_adaptive"):
            if not isinstance(getattr(self, knob), bool):
                raise ValueError(f"engine.{knob}: expected true or false, got {getattr(self, knob)!r}")
        if self.long_prefill_token_threshold_adaptive and not rules.adaptive_threshold_knob:
            raise ValueError(f"engine.long_prefill_token_threshold_adaptive: a knob of vLLM 0.31 and later, and "
                             f"engine.vllm_version is {rules.version}")

    @classmethod
    def for_gpu(cls, gpu: GpuLike, max_model_len: int, **knobs) -> "ChunkedPrefill":
        """The policy as vLLM 0.32's server sets it up on `gpu` (what a sweep's `engine: {policy:
        chunked_prefill}` builds): unset max_num_seqs / max_num_batched_tokens take the per-GPU defaults
        (1024 / 8192 on an H100, 256 / 2048 under 70 GiB: policies/defaults.py), and a budget below
        max_num_seqs is refused, as vLLM does. The field defaults are those of a GPU under 70 GiB."""
        version = knobs.get("vllm_version")
        seqs, tokens = vllm_server_batch_defaults(gpu, vllm_rules(MODELLED if version is None else version))
        policy = cls(**vllm_batch_knobs(knobs, seqs, tokens, max_model_len))
        check_vllm_budget(policy)
        return policy

    def kv_tokens_needed(self, spec: RequestSpec, max_model_len: int) -> int:
        return spec.num_prompt_tokens + spec.num_output_tokens

    def schedule(self, view: EngineView) -> Batch:
        budget = self.max_num_batched_tokens
        threshold = self._threshold(view)
        free = view.num_free_blocks
        running = list(view.running)
        scheduled: dict[int, Scheduled] = {}   # in scheduling order
        preempted: list[int] = []
        preempt_at: list[int] = []  # scheduled before each victim (the order matters with prefix caching)
        budget, free = self._schedule_running(view, running, scheduled, preempted, preempt_at, budget, free,
                                               threshold)
        # Phase B: waiting requests FCFS (or by priority), only in a step that preempted nothing.
        if not preempted:
            pad = 0   # speculative decoding: vLLM pads a 1-token admission to 1 + k rows (spec_pad, below)
            if view.num_speculative_tokens and not any(r.is_prefilling for r in running if r.request_id in scheduled):
                pad = view.num_speculative_tokens
            for s in self._schedule_waiting(view, budget, free, len(running), threshold, pad, len(scheduled)):
                scheduled[s.request_id] = s
        return Batch(tuple(scheduled.values()), tuple(preempted),
                     preempt_at=tuple(preempt_at) if view.prefix_cache is not None else ())

    def schedule_decodes(self, view: EngineView) -> DecodeShortcut | None:
        """`schedule` when every running request decodes and phase A can give each its token without
        preempting (fewer running requests than the budget, their KV growth fits): phase B alone."""
        num_running = len(view.running)
        if view.prefix_cache is not None or num_running > self.max_num_batched_tokens:
            return None  # with prefix caching phase A's `take`s shape phase B's hits
        free = view.num_free_blocks - view.num_decode_growth_blocks()
        if free < 0:
            return None  # phase A would preempt
        if not view.waiting:
            return QUIET
        admitted = self._schedule_waiting(view, self.max_num_batched_tokens - num_running, free, num_running,
                                          self._threshold(view))
        return DecodeShortcut(tuple(admitted)) if admitted else QUIET

    def _threshold(self, view: EngineView) -> int:
        # Since vLLM 0.31 long_prefill_token_threshold applies only when another request (running or waiting)
        # could be starved by a long prefill: alone, a request gets the whole budget. Before, it always did.
        # Adaptive (0.31+), it is never below the budget's fair share over those requests.
        num_eligible = len(view.running) + len(view.waiting)
        if num_eligible <= 1 and self.vllm_rules.threshold_spares_lone_request:
            return 0
        threshold = self.long_prefill_token_threshold
        if threshold > 0 and self.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, self.max_num_batched_tokens // num_eligible)
        return threshold

    def _schedule_running(self, view, running, scheduled, preempted, preempt_at, budget, free, threshold):
        """Phase A: running requests, in list order (preempting as the class docstring says). Fills
        `scheduled`, `preempted`, `preempt_at` and pops victims off `running`; returns (budget, free)."""
        blocks_taken: dict[int, int] = {}
        by_priority = self.scheduling_policy == "priority"
        i = 0
        slots = view.num_draft_slots
        while i < len(running) and budget > 0:
            req = running[i]
            room = budget - (len(scheduled) + 1) * slots if slots else budget   # vLLM's input_budget - draft_slots
            if room <= 0:
                break
            n = _cap(req.num_uncomputed_tokens + req.num_spec_tokens, room, threshold)
            lookahead = view.num_lookahead_tokens
            if lookahead or req.num_spec_tokens:   # speculative decoding (simcore/speculative.py)
                n, held = spec_row(req, n, lookahead, view.max_model_len)
                need = view.blocks_to_hold(req, held)
            else:
                need = view.blocks_to_hold(req, req.num_computed_tokens + n)
            while need > free:  # preempt until it fits
                if by_priority:  # the lowest priority, latest arrival (first such in list order on ties)
                    victim = max(running, key=lambda r: (r.spec.priority, r.spec.arrival_s))
                    j = running.index(victim)
                    running.pop(j)
                    if victim.request_id in scheduled:  # give back what it was given this step
                        k = list(scheduled).index(victim.request_id)   # earlier victims came after it: they
                        preempt_at[:] = [at - 1 if at > k else at for at in preempt_at]   # now precede one less
                        budget += scheduled.pop(victim.request_id).num_new_tokens
                        free += blocks_taken.pop(victim.request_id)
                    if j < i:
                        i -= 1
                else:  # the most recently admitted
                    victim = running.pop()
                preempted.append(victim.request_id)
                preempt_at.append(len(scheduled))
                free += view.blocks_freed(victim)
                if victim is req:
                    break
            if preempted and preempted[-1] == req.request_id:
                break
            scheduled[req.request_id] = (Scheduled(req.request_id, n, held) if lookahead or req.num_spec_tokens
                                         else Scheduled(req.request_id, n))
            blocks_taken[req.request_id] = need
            view.take(req, held if lookahead or req.num_spec_tokens else req.num_computed_tokens + n)
            free -= need
            budget -= n
            i += 1
        return budget, free

    def _schedule_waiting(self, view, budget, free, num_seqs, threshold, pad=0, num_ran=0) -> list[Scheduled]:
        """Phase B: admit waiting requests FCFS (or by priority) with head-of-line blocking."""
        out = []
        waiting = _in_priority_order(view.waiting) if self.scheduling_policy == "priority" else view.waiting
        caching = view.prefix_cache is not None   # (the fast path asks often: skip no-op calls)
        full_isl = self.scheduler_reserve_full_isl
        for req in waiting:
            room = budget - (num_ran + len(out) + 1) * view.num_draft_slots if view.num_draft_slots else budget
            if room <= 0 or num_seqs >= self.max_num_seqs:
                break
            hit = view.num_cached_prefix_tokens(req) if caching else 0
            num_tokens = req.num_tokens
            left = num_tokens - req.num_computed_tokens - hit   # its uncomputed tokens, less the hit
            if pad and left == 1 and (num_ran or req.num_computed_tokens + hit) and \
                    req.num_computed_tokens + hit + pad + 2 <= view.max_model_len:   # (vLLM counts the hit)
                # vLLM pads a one-token admission to a uniform 1 + k verification (placeholder drafts,
                # always rejected) when no prefill chunk runs, to keep the step's CUDA graph; too big: stop
                if 1 + pad > room:
                    break
                left = 1 + pad
            n = min(threshold if 0 < threshold < left else left, room)   # _cap, inlined (the fast path's hot loop)
            need = view.blocks_to_hold(req, num_tokens) if full_isl else 0
            if need > free:
                break  # head-of-line blocking: nobody behind it is admitted
            lookahead = view.num_lookahead_tokens
            if lookahead:   # speculative decoding: the chunk's KV plus the drafts' slots must fit too
                held = min(req.num_computed_tokens + hit + n + lookahead, view.max_model_len)
                need = view.blocks_to_hold(req, held)
                if need > free:
                    break
                out.append(Scheduled(req.request_id, n, held))
            elif n < left or view.hybrid_kv is not None or not full_isl:   # a chunk: KV only for what it computes
                # this step (vLLM checks that too; under the hybrid manager a hit may outrun the admission cap)
                need = view.blocks_to_allocate(req, req.num_computed_tokens + hit + n)
                if need > free:
                    break
                out.append(Scheduled(req.request_id, n))
            else:
                out.append(Scheduled(req.request_id, n))
            free -= need
            if caching:
                view.take(req, held if lookahead else req.num_computed_tokens + hit + n)
            budget -= n
            num_seqs += 1
        return out

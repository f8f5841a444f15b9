"""Applying a policy's decision to one replica: preemption (recompute or swap), admission, KV allocation,
prefix-cache hits, and releasing the requests that finished. One implementation, inherited by both engines
(simcore/engine.py, simcore/fast/engine.py); what happens when a step ends (sampling, finishing) is each
engine's own, through simcore.rules."""
from __future__ import annotations

from collections import deque

from simcore.errors import SimulationError
from simcore.hybridkv import gpu_block_pool
from simcore.hybridprefix import HybridPrefixCachingBlockPool
from simcore.kvcache import HostSwapSpace, PrefixCachingBlockPool
from simcore.kvoffload import host_loads
from simcore.rules import without_admitted
from simcore import speculative
from simcore.request import Request, Status


RUNNING, WAITING, SWAPPED = Status.RUNNING, Status.WAITING, Status.SWAPPED


# A request preempted this many times in a row without a new token is in a livelock: every admission's KV is
# taken back before its prefill completes, the state repeats and the run would never end. vLLM before 0.19
# does this (its scheduler admits a prompt whose first chunk fits, benchmarks.scheduler_equivalence: vLLM
# 0.15.1's own scheduler loops forever on such workloads); the simulator stops and says so instead.
LIVELOCK_PREEMPTIONS = 1000


class DecisionApplier:
    """Mixed into an engine that has `policy`, `limits`, `pool`, `prefix_cache` (or None), `swap_space`,
    `waiting` (deque), `running`, `draining`, `receiving` (lists), `requests` (id -> record), `holds_slots`
    (the policy's holds_slots_until_drained) and `log` (`event`, `preemption`)."""
    _num_pad_drafts = 0   # speculative decoding: placeholder drafts a one-token row may carry (k)

    def _make_pools(self, limits) -> None:
        """The replica's KV pools from its limits, for both engines: the prefix-caching pool (block
        identities) or the plain counting pool (vLLM's hybrid groups when the model has them), the host swap
        space and the KV offload tier's loads."""
        self.prefix_cache: PrefixCachingBlockPool | None = None
        if limits.enable_prefix_caching:
            # the hybrid pool frees (and retains sliding blocks) as vLLM 0.32 does for every release
            # (experiments/config_warnings.py says so); the plain one in the release's free-queue order
            self.prefix_cache = (PrefixCachingBlockPool(limits.num_gpu_blocks, limits.block_size,
                                                        limits.hashless_blocks_first) if limits.kv_groups is None
                                 else HybridPrefixCachingBlockPool(limits.num_gpu_blocks, limits.kv_groups))
            spec = limits.speculative   # EAGLE/MTP: a hit recomputes its last block (simcore/speculative.py)
            drop = bool(spec and spec.drops_last_hit_block)
            if limits.kv_groups is not None and (drop or limits.kv_offload is not None):
                raise ValueError(f"engine.{'speculative' if drop else 'kv_offload'}: not modelled with prefix caching "
                                 "under vLLM's hybrid KV cache manager")
            self.prefix_cache.drop_last_hit_block = drop
        self.pool = self.prefix_cache or gpu_block_pool(limits.num_gpu_blocks, limits.block_size, limits.kv_groups)
        self.hybrid_kv = self.pool if limits.kv_groups is not None else None   # what views ask block needs of
        self.swap_space = HostSwapSpace(limits.num_swap_blocks)
        self.host_loads = host_loads(limits, self.prefix_cache)   # KV offload (simcore/kvoffload.py)

    def _set_up_speculation(self, limits, policy) -> None:
        """Speculative decoding's per-replica state, for both engines (simcore/speculative.py): each request's
        accepted-length draws, the counters, whether rejected drafts give their KV back, and the view's draft
        counts (fixed for the run, so computed once, not per step)."""
        self.speculation = spec = limits.speculative
        self.spec_view_args = {}
        if spec is None:
            return
        self.draws = speculative.AcceptanceDraws(spec)
        self._num_pad_drafts = spec.num_speculative_tokens
        self.spec_counters = spec.counters or speculative.SpecCounters()
        # SGLang, TensorRT-LLM: rejected drafts' KV given back (not under a reservation to completion)
        self._rewind_drafts = spec.frees_rejected_kv and not getattr(policy, "guaranteed_no_evict", False)
        self.spec_view_args = {"num_lookahead_tokens": spec.num_lookahead_tokens,
                               "num_speculative_tokens": spec.num_speculative_tokens,
                               "num_draft_slots": spec.num_draft_slots}

    def _remove_ended(self, req: Request) -> None:
        """Take `req`, ended by the gateway between steps, out of the replica: a running request frees its KV
        (and a drained batch's slots with the last one); a queued one leaves the waiting queue (or the
        arrivals held by async scheduling), a swapped one its host blocks."""
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self.pool.free(req)
            self._release_finished(())
        elif self.late is None or not self.late.remove(req):
            self.waiting.remove(req)
            if req.status is Status.SWAPPED:
                self.swap_space.num_used_blocks -= req.num_blocks
                req.num_blocks = 0

    def can_receive(self, num_tokens: int) -> bool:
        """Whether KV for `num_tokens` tokens fits in free blocks now."""
        return self.pool.blocks_for(num_tokens) <= self.pool.num_free_blocks

    def receive(self, req: Request) -> None:
        """Allocate blocks for the KV of `req` (a fresh progress record with `num_computed_tokens` and
        `num_generated_tokens` already set, holding no blocks here) before its transfer; it joins the batch
        at `received` (disaggregation: simcore/disagg.py). The caller checks `can_receive` first."""
        if req.request_id in self.requests:
            raise SimulationError(f"duplicate request id {req.request_id}")
        if req.num_blocks or not 0 <= req.num_computed_tokens < req.num_tokens:
            raise SimulationError(f"request {req.request_id} cannot be received with {req.num_blocks} blocks "
                                  f"and {req.num_computed_tokens} of {req.num_tokens} tokens computed")
        self.requests[req.request_id] = req
        self.pool.grow(req, req.num_computed_tokens)
        req.status = WAITING
        self.receiving.append(req)

    def _preempt(self, victims, now_s: float) -> float:
        """Evict running `victims` (ids): swap their KV to the host (swap mode, while it has room) or drop it
        (recompute); each goes back to the front of the queue. Returns the swap-out transfer time."""
        transfer_s = 0.0
        for rid in victims:
            req = self.requests[rid]
            if req.status is not Status.RUNNING:
                raise SimulationError(f"{self.policy.name} preempted request {rid}, which is {req.status.value}")
            self.running.remove(req)
            req.num_preemptions += 1
            req.num_spec_tokens = 0   # vLLM drops a preempted request's drafts
            if self.limits.preemption_mode == "swap" and self.swap_space.can_hold(req.num_blocks):
                # vLLM V0 swap: KV copied to host; progress kept.
                self.swap_space.num_used_blocks += req.num_blocks
                transfer_s += self._transfer_s(req.num_blocks)
                self.pool.num_used_blocks -= req.num_blocks
                req.status = Status.SWAPPED
            else:
                # Recompute (vLLM default, and V0's fallback when swap space is full): KV dropped.
                self._count_fruitless_preemption(req)
                self.pool.free(req)
                req.num_computed_tokens = 0
                req.status = Status.WAITING
            self.waiting.appendleft(req)  # vLLM: waiting.prepend_request
            self.log.preemption(req, now_s)
        return transfer_s

    def _count_fruitless_preemption(self, req: Request) -> None:
        """Count `req`'s preemptions since it last gained a token; SimulationError at LIVELOCK_PREEMPTIONS."""
        stalls = getattr(self, "_stalls", None)
        if stalls is None:
            stalls = self._stalls = {}   # request id -> (its generated tokens, preemptions at that count)
        gen, count = stalls.get(req.request_id, (-1, 0))
        count = count + 1 if gen == req.num_generated_tokens else 1
        if count >= LIVELOCK_PREEMPTIONS:
            raise SimulationError(
                f"{self.policy.name}: request {req.request_id} was preempted {count} times in a row without a new "
                "token: the scheduler livelocks (each admission's KV is taken back before its prefill ends). "
                "vLLM before 0.19 does this when a prompt's first chunk fits the free KV but the whole prompt "
                "does not: set engine.scheduler_reserve_full_isl: true, or give the engine more KV")
        stalls[req.request_id] = (req.num_generated_tokens, count)

    def _num_waiting_blocks(self) -> int:
        """Blocks held by waiting requests that are not swapped out: those whose host load ended
        (simcore/kvoffload.py); none without KV offload."""
        if self.host_loads is None:
            return 0
        return sum(r.num_blocks for r in self.waiting if r.status is WAITING)

    def _release_loaded(self) -> bool:
        """A policy that scheduled nothing, with nothing running, may be blocked by waiting requests that hold
        loaded blocks (simcore/kvoffload.py) behind one it puts first (priority scheduling): they give their
        blocks back (cached now, so they hit them again), as a preemption would. True if any did."""
        if self.host_loads is None or self.running:
            return False
        held = [r for r in self.waiting if r.status is WAITING and r.num_blocks]
        for req in held:
            self.pool.free(req)
            req.num_computed_tokens = 0
        return bool(held)

    def _wake_at_s(self, wake_at_s: float | None) -> float | None:
        """When an engine that scheduled nothing (the policy asked to wake at `wake_at_s`) goes on: with host
        loads in flight (simcore/kvoffload.py) at the first load's end, if that comes first."""
        if self.loading and (wake_at_s is None or self.host_loads.next_done_s < wake_at_s):
            return self.host_loads.next_done_s
        return wake_at_s

    def _transfer_s(self, num_blocks: int) -> float:
        num_bytes = num_blocks * self.limits.block_size * self.limits.kv_bytes_per_token
        return num_bytes / self.limits.host_link_bytes_per_s

    def _admit_and_allocate(self, scheduled, preempt, preempt_at, now_s: float) -> tuple[float, list]:
        """Give every scheduled request its KV (admitting waiting ones, swapping swapped ones back in,
        applying prefix-cache hits), with `preempt_at`'s victims evicted in between. Returns the swap
        transfer time and the requests admitted (appended to `running`, in batch order)."""
        transfer_s = 0.0
        admitted = []
        cache, pool, requests, log = self.prefix_cache, self.pool, self.requests, self.log
        # victims interleaved with the allocations, as vLLM (only with prefix caching: Batch.preempt_at)
        victims = deque(zip(preempt_at, preempt)) if preempt_at else None
        # under the hybrid manager, the request vLLM preempts for frees its out-of-window blocks first
        free_skipped = getattr(cache, "free_skipped", None) if victims else None
        for i, s in enumerate(scheduled):  # in order, as vLLM allocates (it may evict a later hit)
            if free_skipped and victims and victims[0][0] <= i:
                free_skipped(requests[s.request_id])
            while victims and victims[0][0] <= i:
                transfer_s += self._preempt((victims.popleft()[1],), now_s)
            req = requests.get(s.request_id)
            status = req.status if req is not None else None
            if status is not RUNNING and status is not WAITING and status is not SWAPPED:
                raise SimulationError(f"{self.policy.name} scheduled request {s.request_id}, which cannot run")
            n = s.num_new_tokens
            # req.num_uncomputed_tokens, inlined (once per scheduled request: the fast path's admissions)
            left = req.spec.num_prompt_tokens + req.num_generated_tokens - req.num_computed_tokens
            if not 0 < n <= left + (req.num_spec_tokens or (self._num_pad_drafts if left == 1 else 0)):
                # (speculative decoding: drafts to verify, or a one-token row padded with placeholders)
                raise SimulationError(f"{self.policy.name} gave request {s.request_id} {n} "
                                      f"tokens; it has {req.num_uncomputed_tokens} left to compute")
            if status is not RUNNING:
                if cache is not None and status is WAITING and req.num_computed_tokens == 0:
                    self._apply_prefix_hit(req, n)
                if status is SWAPPED:
                    self.swap_space.num_used_blocks -= req.num_blocks
                    pool.num_used_blocks += req.num_blocks  # swapped back in; checked below
                    transfer_s += self._transfer_s(req.num_blocks)
                admitted.append(req)
                req.status = RUNNING
                if req.admitted_s is None:
                    req.admitted_s = now_s
                log.event(now_s, req, "admitted")
            num_held_tokens = req.num_computed_tokens + n
            reserved = s.num_reserved_tokens
            pool.grow(req, reserved if reserved > num_held_tokens else num_held_tokens)
            if cache is not None:  # vLLM registers full blocks when it schedules their computation, only
                # of tokens already sampled: never a block holding drafts that may be rejected
                cache.cache_full_blocks(req, min(num_held_tokens, req.num_tokens))
        if free_skipped and victims:   # (the request it preempted for was the last one it preempted)
            free_skipped(requests[victims[-1][1]])
        while victims:
            transfer_s += self._preempt((victims.popleft()[1],), now_s)
        if pool.num_used_blocks > pool.num_blocks:
            raise SimulationError(f"{self.policy.name} swapped in more KV than fits")
        if admitted:
            self.waiting = without_admitted(self.waiting, len(admitted))
            self.running.extend(admitted)
        return transfer_s, admitted

    def _apply_prefix_hit(self, req: Request, num_new_tokens: int) -> None:
        """Prefix caching (vLLM `get_computed_blocks` at admission, only when nothing is computed yet): the
        request shares its cached prefix blocks and starts with those tokens computed. The policy must have
        sized the prefill with `EngineView.num_cached_prefix_tokens`."""
        hit = self.prefix_cache.num_cached_tokens(req)
        left = req.num_tokens - hit
        if num_new_tokens > left + (self._num_pad_drafts if left == 1 else 0):   # (a padded 1 + k verification)
            raise SimulationError(f"{self.policy.name} gave request {req.request_id} {num_new_tokens} tokens, "
                                  f"ignoring its {hit}-token prefix-cache hit")
        req.num_computed_tokens = self.prefix_cache.admit(req)

    def _release_finished(self, done: list) -> None:
        """Requests that just finished (already out of `running`) give their KV back, in order; under a
        policy that holds slots until the batch drains (static batching) they keep it until the last
        running request finishes, then all drained requests free theirs."""
        if self.holds_slots:
            for req in done:
                req.status = Status.DRAINING
            self.draining.extend(done)
        else:
            free = self.pool.free
            for req in done:
                req.status = Status.FINISHED
                free(req)
        if self.draining and not self.running:
            for req in self.draining:
                self.pool.free(req)
                req.status = Status.FINISHED
            self.draining.clear()

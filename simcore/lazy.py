"""Lazy decoders of the fast engine (simcore/fastpath.py): running requests that decode one token in every
decode step, kept as `base + D` (D: the engine's decode-step count) instead of being updated one by one.

They are indexed by finish step (a heap), by block phase (KV growth: tight paged KV needs a block every
block_size tokens; a request holding KV to its last token never grows), by the time of their last token
(ITL) and by their context sum (pricing), so a decode step costs O(1) plus the requests that finish in it.
"""
from __future__ import annotations

import heapq
from bisect import insort
from operator import attrgetter

from simcore.mechanics import SimulationError
from simcore.request import Request, RequestSpec

BY_ORDER = attrgetter("order")


class FastRequest(Request):
    """A request record plus the fast engine's lazy-decoder bookkeeping. While `lazy`, its progress fields
    are stale: the truth is `base_comp + D` computed, `base_gen + D` generated (D: the engine's decode-step
    count), and its last token came at the engine's last decode step if it joined before it."""
    __slots__ = ("lazy", "base_comp", "base_gen", "join_d", "order", "phase")

    def __init__(self, spec: RequestSpec):
        super().__init__(spec)
        self.lazy, self.order, self.phase = False, 0, None


class LazyDecoders:
    """Mixed into FastEngine (its `running`, `pref`, `D`, `heap`, `phase`, `groups`, `base_sum`, `num_lazy`,
    `explicit_mode`, `t_last_d`, `itl_*`, `bs`)."""

    def decode_growth(self) -> int:
        """Blocks the lazy decoders need for their next token (tight paged KV: one each per block_size)."""
        return self.phase[(-self.D) % self.bs]

    def num_generated_tokens(self, req: FastRequest) -> int:
        return req.base_gen + self.D if req.lazy else req.num_generated_tokens

    def all_running_decoding(self) -> bool:
        return not self.pref

    def _lazify(self, req: FastRequest) -> None:
        D, bs = self.D, self.bs
        c, spec = req.num_computed_tokens, req.spec
        bc = c - D
        req.base_comp, req.base_gen, req.join_d = bc, req.num_generated_tokens - D, D
        req.lazy = True
        self.num_lazy += 1
        self.base_sum += bc
        if req.num_blocks * bs >= spec.num_prompt_tokens + spec.num_output_tokens - 1:
            req.phase = None   # holds KV to its last token (a reservation): never grows
        elif req.num_blocks == -(-c // bs):
            req.phase = bc % bs
            self.phase[req.phase] += 1
        else:
            raise SimulationError(f"fast path: request {req.request_id} holds {req.num_blocks} blocks for "
                                  f"{c} tokens, neither tight nor to its end")
        if self.members is not None:   # every lazy decoder fills blocks, growing or not
            insort(self.members[bc % bs], req, key=BY_ORDER)
        heapq.heappush(self.heap, (spec.num_output_tokens - req.base_gen, req.order, req))
        lt = req.last_token_s
        self.groups[lt] = self.groups.get(lt, 0) + 1

    def _explicit(self, req: FastRequest) -> None:
        """Write a lazy decoder's progress back into its record."""
        D = self.D
        c = req.base_comp + D
        req.num_computed_tokens, req.num_generated_tokens = c, req.base_gen + D
        b = -(-c // self.bs)
        if b > req.num_blocks:
            req.num_blocks = b
        if req.join_d < D:
            req.last_token_s = self.t_last_d
        req.lazy = False

    def materialize(self) -> None:
        """Make every running request explicit (the policy's `schedule` reads them one by one)."""
        if self.num_lazy:
            for req in self.running:
                if req.lazy:
                    self._explicit(req)
            self.heap, self.phase, self.groups = [], [0] * self.bs, {}
            self.base_sum = self.num_lazy = 0
            if self.members is not None:
                self.members = [[] for _ in range(self.bs)]
        self.explicit_mode = True

    def cache_steps(self, m: int) -> None:
        """Prefix caching: the pool's work for the next `m` decode steps of the lazy decoders, done now (at
        the start of those steps), as the SimPy engine does it step by step (simcore/apply.py): a block for
        each decode whose token starts one, in batch order (which block each gets decides later
        evictions; one holding KV to its end needs none), and the registration of each block its token
        fills (a hash unique to the request, so their order does not matter)."""
        cache, members, bs, D = self.prefix_cache, self.members, self.bs, self.D
        for j in range(m):
            d = D + j
            for req in members[(-d) % bs]:
                cache.grow(req, req.base_comp + d + 1)
            for req in members[(-d - 1) % bs]:
                cache.cache_full_blocks(req, req.base_comp + d + 1)

    def _lazy_step_done(self, now: float) -> list:
        """Every lazy decoder took a token at `now`: log the gaps, return those that finished."""
        self.D += 1
        D = self.D
        for lt, count in self.groups.items():
            self.itl_v.append(now - lt)
            self.itl_c.append(count)
            self.itl_e.append(now)
        self.t_last_d = now
        done, heap = [], self.heap
        while heap and heap[0][0] <= D:
            req = heapq.heappop(heap)[2]
            self._explicit(req)
            self.num_lazy -= 1
            self.base_sum -= req.base_comp
            if req.phase is not None:
                self.phase[req.phase] -= 1
            if self.members is not None:
                self.members[req.base_comp % self.bs].remove(req)
            done.append(req)
        self.groups = {now: self.num_lazy} if self.num_lazy else {}
        return done

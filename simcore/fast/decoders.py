"""Lazy decoders of the fast engine (simcore/fast/engine.py): running requests that decode one token in every
decode step, kept as `base + step` (step: how many decode steps the lazy decoders have taken) instead of
being updated one by one.

They are indexed by finish step (a heap), by block phase (KV growth: tight paged KV needs a block every
block_size tokens; a request holding KV to its last token never grows), by the time of their last token
(ITL) and by their context sum (pricing), so a decode step costs O(1) plus the requests that finish in it.
"""
from __future__ import annotations

import heapq
from bisect import insort
from operator import attrgetter

from simcore.errors import SimulationError
from simcore.fast.request import FastRequest

BY_ORDER = attrgetter("order")


class LazyDecoders:
    """The engine's lazy decoders and their indexes. Implements simcore.view.LazyProgress, what a policy's
    `schedule_decodes` reads through its view."""

    def __init__(self, block_size: int, prefix_cache=None):
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.step = 0                # decode steps taken by lazy decoders so far
        self.last_step_s = 0.0       # when the last of them ended
        self.count = 0
        self.base_context_sum = 0    # sum of base_computed: their context sum is this + count * step
        self.by_finish: list = []    # heap of (step at which it finishes, order, request)
        self.growth_by_phase = [0] * block_size   # growing decoders by base_computed % block_size
        self.by_last_token: dict = {}   # decoders by the time of their last token: count
        # Prefix caching: every lazy decoder by block phase, in batch order, for the pool's per-step work
        # (a block allocated when a decode starts one, registered when it fills: `cache_steps`).
        self.by_block_phase = [[] for _ in range(block_size)] if prefix_cache is not None else None

    # ---- simcore.view.LazyProgress ----
    def growth(self) -> int:
        """Blocks the lazy decoders need for their next token (tight paged KV: one each per block_size)."""
        return self.growth_by_phase[(-self.step) % self.block_size]

    def num_generated_tokens(self, req: FastRequest) -> int:
        return req.base_generated + self.step if req.lazy else req.num_generated_tokens

    # ---- joining and leaving ----
    def add(self, req: FastRequest) -> None:
        """`req` (running, explicit, decoding) becomes a lazy decoder."""
        step, bs = self.step, self.block_size
        c, spec = req.num_computed_tokens, req.spec
        bc = c - step
        req.base_computed, req.base_generated, req.joined_step = bc, req.num_generated_tokens - step, step
        req.lazy = True
        self.count += 1
        self.base_context_sum += bc
        if req.num_blocks * bs >= spec.num_prompt_tokens + spec.num_output_tokens - 1:
            req.phase = None   # holds KV to its last token (a reservation): never grows
        elif req.num_blocks == -(-c // bs):
            req.phase = bc % bs
            self.growth_by_phase[req.phase] += 1
        else:
            raise SimulationError(f"fast path: request {req.request_id} holds {req.num_blocks} blocks for "
                                  f"{c} tokens, neither tight nor to its end")
        if self.by_block_phase is not None:   # every lazy decoder fills blocks, growing or not
            insort(self.by_block_phase[bc % bs], req, key=BY_ORDER)
        heapq.heappush(self.by_finish, (spec.num_output_tokens - req.base_generated, req.order, req))
        lt = req.last_token_s
        self.by_last_token[lt] = self.by_last_token.get(lt, 0) + 1

    def write_back(self, req: FastRequest) -> None:
        """Write a lazy decoder's progress back into its record (it is then explicit)."""
        step = self.step
        c = req.base_computed + step
        req.num_computed_tokens, req.num_generated_tokens = c, req.base_generated + step
        b = -(-c // self.block_size)
        if b > req.num_blocks:
            req.num_blocks = b
        if req.joined_step < step:
            req.last_token_s = self.last_step_s
        req.lazy = False

    def clear(self, running) -> None:
        """Make every running request explicit (the policy's general `schedule` reads them one by one)."""
        if self.count:
            for req in running:
                if req.lazy:
                    self.write_back(req)
            bs = self.block_size
            self.by_finish, self.growth_by_phase, self.by_last_token = [], [0] * bs, {}
            self.base_context_sum = self.count = 0
            if self.by_block_phase is not None:
                self.by_block_phase = [[] for _ in range(bs)]

    # ---- decode steps ----
    def advance(self, now: float) -> list:
        """Every lazy decoder took a token at `now` (the caller logged their gaps from `by_last_token`):
        those that finished leave, explicit again, and are returned."""
        self.step += 1
        step = self.step
        self.last_step_s = now
        done, by_finish = [], self.by_finish
        while by_finish and by_finish[0][0] <= step:
            req = heapq.heappop(by_finish)[2]
            self.write_back(req)
            self.count -= 1
            self.base_context_sum -= req.base_computed
            if req.phase is not None:
                self.growth_by_phase[req.phase] -= 1
            if self.by_block_phase is not None:
                self.by_block_phase[req.base_computed % self.block_size].remove(req)
            done.append(req)
        self.by_last_token = {now: self.count} if self.count else {}
        return done

    def skip(self, num_steps: int, last_step_s: float) -> None:
        """`num_steps` decode steps in which none finished, the last ending at `last_step_s` (a quiet
        stretch, applied at once; its ITL samples are the caller's)."""
        self.step += num_steps
        self.last_step_s = last_step_s
        self.by_last_token = {last_step_s: self.count}

    def cache_steps(self, m: int) -> None:
        """Prefix caching: the pool's work for the next `m` decode steps of the lazy decoders, done now (at
        the start of those steps), as the SimPy engine does it step by step (simcore/decisions.py): a block
        for each decode whose token starts one, in batch order (which block each gets decides later
        evictions; one holding KV to its end needs none), and the registration of each block its token
        fills (a hash unique to the request, so their order does not matter)."""
        cache, members, bs, step = self.prefix_cache, self.by_block_phase, self.block_size, self.step
        for j in range(m):
            d = step + j
            for req in members[(-d) % bs]:
                cache.grow(req, req.base_computed + d + 1)
            for req in members[(-d - 1) % bs]:
                cache.cache_full_blocks(req, req.base_computed + d + 1)

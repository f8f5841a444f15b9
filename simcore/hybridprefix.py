"""Prefix caching under vLLM's hybrid KV cache manager: full-attention and sliding-window groups sharing one
block pool, each group caching its own blocks, a hit being a length every group can serve. Counted as vLLM
0.32 counts it (vllm/v1/core/: kv_cache_coordinator.py HybridKVCacheCoordinator, single_type_kv_cache_manager.py
FullAttentionManager / SlidingWindowManager, block_pool.py BlockPool, kv_cache_manager.py allocate_slots).

Identities: a block is cached under (chained block hash, group), so each group hits its own copy of a prefix
block (vLLM's BlockHashWithGroupId); `simcore.kvcache.chain_hashes` gives the hashes, as for one group.

The hit (`find_longest_cache_hit`, at most num_tokens - 1 tokens): the full-attention groups take the longest
run of cached blocks from the start (every full group must have each block). The sliding groups then search
right to left below that length for `cdiv(window - 1, block_size)` contiguous cached blocks (every sliding
group must have each); the hit ends at the run's end, and the blocks before the run are null (a sliding
layer never reads them). Without such a run, only a run that starts at block 0 is a hit. The full groups are
cut to the sliding groups' length. When the full groups hit further than the sliding ones, that longer length
is the request's *junction* (`shared_prefix_boundary`): vLLM keeps the sliding blocks ending there cached, so
the next request sharing that prefix hits all of it.

Which blocks a sliding group caches (`SlidingWindowManager.reachable_block_mask` with vLLM's default
`prefix_cache_retention_interval: 0`, vllm/config/cache.py): only the `cdiv(window - 1, block_size)` blocks
ending at a block boundary a later request can resume at: the prompt's replay boundary (num_prompt - 1, a
resend of the same prompt) and the junction. A full group caches every full block, as with one group.

Admission and allocation (`allocate_slots`): a new request touches its hit blocks (a sliding group only those
inside the window of the hit's end: the others are null), then every group grows its table to cdiv(tokens,
block_size); a running request first frees its sliding groups' blocks that left the window
(`remove_skipped_blocks`: cached ones go to the free queue's tail, others to its head, as vLLM's
free_blocks). The free queue is vLLM's: blocks freed without a hash are reused first, cached ones in LRU
order, a cached block leaves the cache when it is reallocated. A request's blocks are freed group by group,
each group tail first.

Within one scheduling step, a policy's view applies each decision to the pool for real (`HybridStepPlan`),
keeping an undo log, so a request admitted later in the step sees exactly what vLLM's scheduler sees; the pool
undoes the plan before the engine applies the same decisions (any engine call settles it first).
"""
from __future__ import annotations

from collections import deque

from simcore.hybridkv import KVCacheGroups
from simcore.kvcache import RequestBlockHashes, cdiv, num_usable_blocks, prefix_cache_stats
from simcore.request import Request, RequestSpec
from simcore.request import Status as RequestStatus


class _Block:
    """One physical block of the shared pool. `key`: (block hash, group) once cached; `ref_count`: the
    requests holding it."""
    __slots__ = ("key", "ref_count")

    def __init__(self):
        self.key: tuple[int, int] | None = None
        self.ref_count = 0


class _Tables:
    """One request's block tables, one per group (None: a null block), all of one length; how many
    leading entries each sliding table has nulled (the same in each), how many are registered (vLLM's
    num_cached_block, the same in every group) and its junction."""
    __slots__ = ("groups", "num_null", "num_registered", "junction")

    def __init__(self, num_groups: int):
        self.groups: list[list[_Block | None]] = [[] for _ in range(num_groups)]
        self.num_null = 0
        self.num_registered = 0
        self.junction = 0


class HybridPrefixCachingBlockPool(RequestBlockHashes):
    """The shared pool of vLLM's HybridKVCacheCoordinator with prefix caching on (module docstring). Groups
    0 .. F-1 are full attention, F .. F+S-1 sliding window, as vLLM orders them for gpt-oss.

    Counting, as simcore.kvcache.PrefixCachingBlockPool: `num_used_blocks` = physical blocks held by at
    least one request; `num_block_refs` = non-null table entries over all requests (= sum of
    `Request.num_blocks`)."""

    def __init__(self, num_gpu_blocks: int, groups: KVCacheGroups):
        self.groups = groups
        self.num_blocks, self.block_size = num_usable_blocks(num_gpu_blocks), groups.block_size
        self._full = tuple(range(groups.num_full_groups))
        self._sliding = tuple(range(groups.num_full_groups, groups.num_groups))
        self._num_groups = groups.num_groups
        self._window = groups.sliding_window
        self._cap = groups.sliding_admission_blocks
        self._need = cdiv(groups.sliding_window - 1, groups.block_size)   # contiguous blocks of a sliding hit
        # the free queue, head first: _front (freed without a hash), _num_fresh never-used blocks (counted, not
        # made), then the cached blocks in LRU order (_lru: (block, seq) in append order, valid while
        # _lru_seq[block] == seq, so a block taken from the middle is dropped lazily and an undo restores it)
        self._front: deque[_Block] = deque()
        self._num_fresh = self.num_blocks
        self._lru: deque[tuple[_Block, int]] = deque()
        self._lru_seq: dict[_Block, int] = {}
        self._seq = 0
        self._cached: dict[tuple[int, int], list[_Block]] = {}   # (hash, group) -> blocks, first registered first
        self._tables: dict[int, _Tables] = {}
        self._hashes: dict[int, list[int]] = {}
        self._used = self._refs = 0
        self._epoch = 0                  # bumped whenever the cache's contents change (memo of hits)
        self._memo: dict[int, tuple] = {}
        self._undo: list | None = None   # the plan in force: its undo log (None: none)
        self._saved_counts = (0, 0, 0)
        # counters (vLLM's prefix_cache_queries / _hits), as simcore.kvcache.PrefixCachingBlockPool
        self.num_queried_tokens = self.num_hit_tokens = 0
        self.num_queried_blocks = self.num_hit_blocks = 0
        self.num_evicted_blocks = 0
        self.cached_tokens_by_request: dict[int, int] = {}
        self.host = None                  # no host tier (refused with hybrid groups)
        self.drop_last_hit_block = False  # EAGLE/MTP's dropped block is refused with hybrid groups

    # ---- counts an engine reads (each settles a plan left in force) ----
    @property
    def num_used_blocks(self) -> int:
        self._settle()
        return self._used

    @property
    def num_free_blocks(self) -> int:
        self._settle()
        return self.num_blocks - self._used

    @property
    def num_block_refs(self) -> int:
        self._settle()
        return self._refs

    def blocks_for(self, num_tokens: int) -> int:
        """The fewest blocks a request with `num_tokens` computed tokens holds (an engine invariant)."""
        n = cdiv(num_tokens, self.block_size)
        skipped = max(0, num_tokens - self._window + 1) // self.block_size
        return len(self._full) * n + len(self._sliding) * max(0, n - skipped)

    def can_grow(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_to_hold(req, num_tokens) <= self.num_free_blocks

    # ---- the undo log of a plan ----
    def _settle(self) -> None:
        """Undo the plan in force, if any: the pool is as the engine left it."""
        undo = self._undo
        if undo is None:
            return
        for fn in reversed(undo):
            fn()
        self._undo = None
        self._used, self._refs, self._num_fresh = self._saved_counts
        if undo:
            self._epoch += 1
        self._compact()

    def plan(self) -> "HybridStepPlan":
        self._settle()
        self._undo = []
        self._saved_counts = (self._used, self._refs, self._num_fresh)
        return HybridStepPlan(self)

    def _own(self, rid: int) -> _Tables:
        """The request's tables, made if it has none (under a plan, undone)."""
        t = self._tables.get(rid)
        if t is None:
            t = self._tables[rid] = _Tables(self._num_groups)
            if self._undo is not None:
                self._undo.append(lambda: self._tables.pop(rid))
        return t

    def _compact(self) -> None:
        if len(self._lru) > 2 * len(self._lru_seq) + 64:
            seq = self._lru_seq
            self._lru = deque((b, s) for b, s in self._lru if seq.get(b) == s)

    # ---- the free queue (vLLM's FreeKVCacheBlockQueue) ----
    def _pop_free(self) -> _Block:
        """The free queue's head, out of the cache if it was cached (lazy eviction), held once."""
        undo = self._undo
        if self._front:
            blk = self._front.popleft()
            if undo is not None:
                undo.append(lambda b=blk: self._front.appendleft(b))
        elif self._num_fresh:
            self._num_fresh -= 1   # (the plan's undo restores the count, and drops the block)
            blk = _Block()
            blk.ref_count = 1
            return blk
        else:
            popped, seq = [], self._lru_seq
            while True:
                blk, s = self._lru.popleft()
                popped.append((blk, s))
                if seq.get(blk) == s:
                    del seq[blk]
                    break
            if undo is not None:
                undo.append(lambda p=popped, b=blk, s=s: (self._lru.extendleft(reversed(p)), seq.__setitem__(b, s)))
        if blk.key is not None:
            self._uncache(blk)
        blk.ref_count = 1
        if undo is not None:
            undo.append(lambda b=blk: setattr(b, "ref_count", 0))
        return blk

    def _uncache(self, blk: _Block) -> None:
        key = blk.key
        same = self._cached[key]
        i = same.index(blk)
        del same[i]
        if not same:
            del self._cached[key]
        blk.key = None
        self._epoch += 1
        if self._undo is not None:
            self._undo.append(lambda: (setattr(blk, "key", key), self._cached.setdefault(key, []).insert(i, blk)))
        else:
            self.num_evicted_blocks += 1

    def _touch(self, blk: _Block) -> None:
        """A hit block taken by one more request (out of the free queue if nobody held it)."""
        if blk.ref_count == 0:
            s = self._lru_seq.pop(blk)
            self._used += 1
            if self._undo is not None:
                self._undo.append(lambda: self._lru_seq.__setitem__(blk, s))
        blk.ref_count += 1
        self._refs += 1
        if self._undo is not None:
            self._undo.append(lambda: setattr(blk, "ref_count", blk.ref_count - 1))

    def _free_blocks(self, ordered) -> int:
        """vLLM BlockPool.free_blocks: release one hold of each block (eviction order: first evicted first);
        those nobody holds go to the queue's head (no hash) or tail (cached). Returns how many did."""
        undo, first, n = self._undo, [], 0
        for blk in ordered:
            blk.ref_count -= 1
            self._refs -= 1
            if undo is not None:
                undo.append(lambda b=blk: setattr(b, "ref_count", b.ref_count + 1))
            if blk.ref_count == 0:
                n += 1
                if blk.key is None:
                    first.append(blk)
                else:
                    self._seq += 1
                    self._lru.append((blk, self._seq))
                    self._lru_seq[blk] = self._seq
                    if undo is not None:
                        undo.append(lambda b=blk: (self._lru.pop(), self._lru_seq.pop(b)))
        if first:
            self._front.extendleft(reversed(first))
            if undo is not None:
                undo.append(lambda k=len(first): [self._front.popleft() for _ in range(k)])
        self._used -= n
        return n

    # ---- hits ----

    def _get(self, h: int, group_ids) -> list[_Block] | None:
        """vLLM BlockPool.get_cached_block: the first cached block of hash `h` in every group, or None."""
        out, cached = [], self._cached
        for g in group_ids:
            same = cached.get((h, g))
            if same is None:
                return None
            out.append(same[0])
        return out

    def _find(self, hashes: list[int], max_length: int) -> tuple[int, list, int]:
        """HybridKVCacheCoordinator.find_longest_cache_hit over hashes (one attention type after the other):
        (hit blocks, per-group hit lists (None: null), the junction in tokens or 0)."""
        bs = self.block_size
        per_group: list[list] = [[] for _ in range(self._num_groups)]
        num_blocks = max_length // bs
        full_hit = None
        if self._full:
            for k in range(num_blocks):
                got = self._get(hashes[k], self._full)
                if got is None:
                    break
                for g, b in zip(self._full, got):
                    per_group[g].append(b)
            full_hit = num_blocks = len(per_group[0])
        hit = num_blocks
        if self._sliding:
            found: dict[int, list[_Block]] = {}
            run, need, matched = 0, self._need, False
            for i in range(num_blocks - 1, -1, -1):
                got = self._get(hashes[i], self._sliding)
                if got is None:
                    run = 0
                    continue
                found[i] = got
                run += 1
                if run >= need:
                    hit, matched = i + run, True
                    break
            if not matched:
                hit = run   # a run from block 0 shorter than the window's blocks is a hit too
            for j, g in enumerate(self._sliding):
                per_group[g] = [found[i][j] if i in found and (not matched or i >= hit - run) else None
                                for i in range(hit)]
            for g in self._full:
                del per_group[g][hit:]
        junction = full_hit * bs if self._full and self._sliding and full_hit > hit else 0
        return hit, per_group, junction

    def _lookup(self, spec: RequestSpec, num_tokens: int) -> tuple[int, list, int]:
        """The hit of a request holding nothing (memoised until the cache changes)."""
        rid = spec.request_id
        memo = self._memo.get(rid)
        if memo is not None and memo[0] == self._epoch and memo[1] == num_tokens:
            return memo[2]
        max_length = num_tokens - 1
        out = self._find(self._hashes_upto(spec, max_length // self.block_size), max_length)
        self._memo[rid] = (self._epoch, num_tokens, out)
        return out

    def num_cached_tokens_for(self, hashes: list[int], num_tokens: int) -> int:
        """Cached prefix of a request that is not in this pool (a router's question); no side effects."""
        self._settle()
        n = (num_tokens - 1) // self.block_size
        return self._find(list(hashes[:n]), min(num_tokens - 1, len(hashes) * self.block_size))[0] * self.block_size

    def num_cached_tokens(self, req: Request) -> int:
        self._settle()
        return self._lookup(req.spec, req.num_tokens)[0] * self.block_size

    # ---- what a step takes (vLLM get_num_blocks_to_allocate) ----
    def _skipped(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self._window + 1) // self.block_size

    def _blocks_to_hold(self, req: Request, num_tokens: int, admission: bool) -> int:
        """Free blocks `req` takes to hold `num_tokens` tokens, net of what its sliding groups free first;
        for a request holding nothing, its hit shared (`admission`: vLLM's full-sequence check, each sliding
        group capped at its admission blocks)."""
        n = cdiv(num_tokens, self.block_size)
        t = self._tables.get(req.request_id)
        if t is None:
            hit, per_group, _ = self._lookup(req.spec, req.num_tokens)
            skipped = self._skipped(hit * self.block_size)
            out = 0
            for g, blocks in enumerate(per_group):
                sliding = g >= len(self._full)
                need = min(n, self._cap) if sliding and admission else n
                out += max(need - hit, 0)
                out += sum(1 for b in blocks[skipped if sliding else 0:] if b is not None and b.ref_count == 0)
            return out
        length = len(t.groups[0])
        grow = self._num_groups * (n - length) if n > length else 0
        skip = min(max(0, req.num_computed_tokens - self._window + 1) // self.block_size, length)
        if skip <= t.num_null:
            return grow
        first = t.num_null
        return grow - sum(1 for g in self._sliding for b in t.groups[g][first:skip] if b.ref_count == 1)

    def blocks_to_hold(self, req: Request, num_tokens: int) -> int:
        self._settle()
        return self._blocks_to_hold(req, num_tokens, True)

    # ---- applying a step (the engine, or a plan) ----
    def _admit(self, rid: int, spec: RequestSpec, num_tokens: int) -> int:
        """vLLM add_local_computed_blocks: share the hit (sliding groups: inside the window only). Returns
        the hit in blocks."""
        hit, per_group, junction = self._lookup(spec, num_tokens)
        t = self._own(rid)   # new: undoing it undoes the tables' contents too
        skipped = self._skipped(hit * self.block_size)
        for g, blocks in enumerate(per_group):
            table = t.groups[g]
            if g >= len(self._full) and skipped:
                table.extend([None] * skipped)
                blocks = blocks[skipped:]
            for b in blocks:
                self._touch(b)
            table.extend(blocks)
        if self._sliding:
            t.num_null = skipped
        t.num_registered = hit
        t.junction = junction
        return hit

    def _remove_skipped(self, rid: int, num_computed_tokens: int) -> tuple[int, int]:
        """vLLM remove_skipped_blocks: each sliding group frees its blocks that left the window (tail first,
        down to the first null), keeping their places as nulls. Returns (table entries freed, blocks that
        became free)."""
        t = self._tables.get(rid)
        if t is None:
            return 0, 0
        skip = min(max(0, num_computed_tokens - self._window + 1) // self.block_size, len(t.groups[0]))
        first = t.num_null
        if skip <= first:
            return 0, 0
        num_free = 0
        undo = self._undo
        for g in self._sliding:
            table = t.groups[g]
            freed = table[first:skip]
            table[first:skip] = [None] * (skip - first)
            if undo is not None:
                undo.append(lambda tb=table, f=freed: tb.__setitem__(slice(first, skip), f))
            num_free += self._free_blocks(freed[::-1])   # vLLM frees the window's blocks tail first
        if undo is not None:
            undo.append(lambda: setattr(t, "num_null", first))
        t.num_null = skip
        return (skip - first) * len(self._sliding), num_free

    def _grow(self, rid: int, num_computed_tokens: int, num_tokens: int) -> int:
        """vLLM allocate_slots for a scheduled request: free the sliding groups' blocks that left the window
        (`remove_skipped_blocks`), then grow every group's table. Returns the change in blocks it holds."""
        delta = -self._remove_skipped(rid, num_computed_tokens)[0]
        t = self._own(rid)
        n = cdiv(num_tokens, self.block_size)
        undo = self._undo
        for table in t.groups:
            k = n - len(table)
            if k <= 0:
                continue
            if undo is not None:
                undo.append(lambda tb=table, m=len(table): tb.__delitem__(slice(m, None)))
            for _ in range(k):
                table.append(self._pop_free())
            self._used += k
            self._refs += k
            delta += k
        return delta

    def _register(self, rid: int, spec: RequestSpec, num_tokens: int) -> None:
        """vLLM cache_blocks: register the blocks full once `num_tokens` tokens have KV; sliding groups only
        those ending at a boundary a later request can resume at (module docstring)."""
        t = self._tables[rid]
        start, end = t.num_registered, num_tokens // self.block_size
        if end <= start:
            return
        hashes = self._hashes_upto(spec, end)
        need = self._need
        ends = [(spec.num_prompt_tokens - 1) // self.block_size]
        if t.junction:
            ends.append(t.junction // self.block_size)
        undo = self._undo
        for g, table in enumerate(t.groups):
            sliding = g >= len(self._full)
            for i in range(start, end):
                blk = table[i]
                if blk is None or (sliding and not any(e - need <= i < e for e in ends)):
                    continue
                key = (hashes[i], g)
                blk.key = key
                self._cached.setdefault(key, []).append(blk)
                if undo is not None:
                    undo.append(lambda b=blk, k=key: (setattr(b, "key", None), self._cached[k].pop(),
                                                      self._cached.pop(k) if not self._cached[k] else None))
        if undo is not None:
            undo.append(lambda: setattr(t, "num_registered", start))
        t.num_registered = end
        self._epoch += 1

    def _release(self, rid: int) -> int:
        """Free every block the request holds, group by group, each tail first; returns how many became free."""
        t = self._tables.pop(rid, None)
        if t is None:
            return 0
        if self._undo is not None:
            self._undo.append(lambda: self._tables.__setitem__(rid, t))
        return sum(self._free_blocks([b for b in reversed(table) if b is not None]) for table in t.groups)

    # ---- the engine's calls ----
    def admit(self, req: Request) -> int:
        self._settle()
        rid = req.request_id
        refs = self._refs
        hit = self._admit(rid, req.spec, req.num_tokens) * self.block_size
        req.num_blocks = self._refs - refs
        self.cached_tokens_by_request[rid] = self.cached_tokens_by_request.get(rid, 0) + hit
        self.num_queried_tokens += req.num_tokens
        self.num_hit_tokens += hit
        self.num_queried_blocks += req.num_prompt_tokens // self.block_size
        self.num_hit_blocks += hit // self.block_size
        return hit

    def grow(self, req: Request, num_tokens: int) -> None:
        self._settle()
        need = self._blocks_to_hold(req, num_tokens, False) if req.request_id in self._tables else None
        if need is not None and need > self.num_blocks - self._used:
            raise RuntimeError(f"KV pool over capacity: request {req.request_id} needs {need} blocks, "
                               f"{self.num_blocks - self._used} free (a policy scheduled more than fits)")
        if need is None:
            self._tables[req.request_id] = _Tables(self._num_groups)
            if cdiv(num_tokens, self.block_size) * self._num_groups > self.num_blocks - self._used:
                raise RuntimeError(f"KV pool over capacity: request {req.request_id} does not fit")
        req.num_blocks += self._grow(req.request_id, req.num_computed_tokens, num_tokens)

    def free_skipped(self, req: Request) -> None:
        """Free the running request's out-of-window blocks now: vLLM does so at its first allocation attempt
        in a step, before it preempts other requests to make room for it (the order of the free queue)."""
        self._settle()
        req.num_blocks -= self._remove_skipped(req.request_id, req.num_computed_tokens)[0]

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        self._settle()
        if req.request_id in self._tables:
            self._register(req.request_id, req.spec, req.num_computed_tokens if num_tokens is None else num_tokens)

    def free(self, req: Request) -> int:
        self._settle()
        self._release(req.request_id)
        self._memo.pop(req.request_id, None)
        if req.status in (RequestStatus.FINISHED, RequestStatus.DRAINING):
            self._hashes.pop(req.request_id, None)
        n, req.num_blocks = req.num_blocks, 0
        self._compact()
        return n

    def stats(self) -> dict:
        return prefix_cache_stats([self])


class HybridStepPlan:
    """What vLLM's scheduler sees within one step, for a policy's view: each decision applied to the pool
    for real under an undo log (the pool settles it before the engine applies the step)."""

    def __init__(self, pool: HybridPrefixCachingBlockPool):
        self.pool = pool
        self._freed: dict[int, int] = {}   # request id -> blocks its window freed this step

    def _window_freed(self, req: Request) -> int:
        """vLLM frees a running request's out-of-window blocks when it first tries to allocate for it, even if
        it then preempts others (or the request) instead: done here at the policy's first question."""
        rid = req.request_id
        n = self._freed.get(rid)
        if n is None:
            n = self._freed[rid] = self.pool._remove_skipped(rid, req.num_computed_tokens)[1]
        return n

    def hit_blocks(self, req: Request) -> range:
        """The hit a new (or recompute-preempted) request would share if admitted next (its length counts)."""
        return range(self.pool._lookup(req.spec, req.num_tokens)[0])

    def blocks_to_hold(self, req: Request, num_tokens: int, admission: bool = True) -> int:
        if req.request_id in self.pool._tables:   # running: net of its window's blocks, freed first
            freed = self._window_freed(req)
            return self.pool._blocks_to_hold(req, num_tokens, admission) - freed
        return self.pool._blocks_to_hold(req, num_tokens, admission)

    def release(self, req: Request) -> int:
        """Blocks preempting `req` frees: those whose last holder it is."""
        return self.pool._release(req.request_id)

    def take(self, req: Request, num_tokens: int, is_new: bool) -> None:
        """`req` is scheduled to hold KV for `num_tokens` tokens after this step."""
        pool, rid = self.pool, req.request_id
        computed = req.num_computed_tokens
        if is_new:
            computed += pool._admit(rid, req.spec, req.num_tokens) * pool.block_size
        pool._grow(rid, computed, num_tokens)
        pool._register(rid, req.spec, min(num_tokens, req.num_tokens))

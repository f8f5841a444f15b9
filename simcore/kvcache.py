"""Paged KV-cache pool (vLLM's BlockPool, counted rather than addressed), its prefix-caching variant, and
host swap space.

Without prefix caching blocks are fungible and the pool only counts them (the fast path); with it, blocks
carry identities (see PrefixCachingBlockPool). Memory sizing follows vLLM's profile run:
blocks = (GPU memory x gpu_memory_utilization - weights - activation reserve) / bytes per block.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import chain, islice, repeat

from simcore.kvoffload import offload_stats
from simcore.request import Request, RequestSpec
from simcore.request import Status as RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Tokens per KV block when none is given: vLLM's default (vllm/config/cache.py, CacheConfig.DEFAULT_BLOCK_SIZE,
# 16 on CUDA). Every default block size in the project is this one.
DEFAULT_BLOCK_SIZE = 16

# vLLM's BlockPool takes one block of the pool as its null block (a placeholder for skipped positions, never
# allocated; vllm/v1/core/block_pool.py), so of `num_gpu_blocks` (given or derived) one fewer hold KV.
NUM_NULL_BLOCKS = 1


def num_usable_blocks(num_gpu_blocks: int) -> int:
    """KV blocks requests can hold in a pool of `num_gpu_blocks` (vLLM's meaning of num_gpu_blocks)."""
    return max(0, num_gpu_blocks - NUM_NULL_BLOCKS)


@dataclass(frozen=True)
class MemoryPlan:
    """How the KV pool was sized; recorded with results so a user can see where the blocks went."""
    num_gpu_blocks: int
    block_size: int
    kv_bytes_per_token: int
    gpu_memory_bytes: float
    gpu_memory_utilization: float
    weight_bytes: float
    activation_reserve_bytes: float
    kv_groups: object = None   # vLLM's hybrid KV cache groups (simcore.hybridkv.KVCacheGroups), or None

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens as vLLM logs them ("GPU KV cache size"); under the hybrid manager its group-aware
        figure (simcore.hybridkv.KVCacheGroups.capacity_tokens)."""
        if self.kv_groups is not None:
            return self.kv_groups.capacity_tokens(self.num_gpu_blocks)
        return self.num_gpu_blocks * self.block_size


def plan_memory(*, gpu_memory_bytes: float, gpu_memory_utilization: float, weight_bytes: float,
                kv_bytes_per_token: int, block_size: int, activation_reserve_bytes: float,
                num_gpu_blocks: int | None = None, kv_groups=None, bytes_per_block: int | None = None) -> MemoryPlan:
    """Derive the KV block count, or take `num_gpu_blocks` as given (vLLM's `num_gpu_blocks_override`).
    `bytes_per_block`: one block's bytes when it is not every layer's KV of `block_size` tokens (vLLM's
    hybrid groups, `kv_groups`: one group's layers)."""
    if num_gpu_blocks is None:
        free = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes
        num_gpu_blocks = int(free // (bytes_per_block or kv_bytes_per_token * block_size))
        if num_gpu_blocks <= 0:
            raise ValueError(
                f"no memory left for the KV cache: {gpu_memory_bytes / 1e9:.0f} GB x {gpu_memory_utilization} "
                f"< weights {weight_bytes / 1e9:.1f} GB + activations {activation_reserve_bytes / 1e9:.1f} GB; "
                "use more tensor parallelism, a bigger GPU or engine.num_gpu_blocks")
    return MemoryPlan(num_gpu_blocks, block_size, kv_bytes_per_token, gpu_memory_bytes,
                      gpu_memory_utilization, weight_bytes, activation_reserve_bytes, kv_groups)


class BlockPool:
    """GPU KV blocks. `num_blocks` = usable blocks, `num_gpu_blocks` less the null block. Invariant:
    0 <= num_used_blocks <= num_blocks, and it equals the sum of what the requests holding blocks have
    (checked by the engine)."""

    def __init__(self, num_gpu_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_usable_blocks(num_gpu_blocks), block_size
        self.num_used_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def can_grow(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - req.num_blocks <= self.num_free_blocks

    def grow(self, req: Request, num_tokens: int) -> None:
        """Make `req` hold blocks for `num_tokens` tokens (never shrinks)."""
        extra = -(-num_tokens // self.block_size) - req.num_blocks   # blocks_for, inlined (once per admission)
        if extra <= 0:
            return
        if extra > self.num_blocks - self.num_used_blocks:
            raise RuntimeError(f"KV pool over capacity: request {req.request_id} needs {extra} blocks, "
                               f"{self.num_free_blocks} free (a policy scheduled more than fits)")
        self.num_used_blocks += extra
        req.num_blocks += extra

    def free(self, req: Request) -> int:
        n = req.num_blocks
        self.num_used_blocks -= n
        req.num_blocks = 0
        return n

    def shrink(self, req: Request, num_tokens: int) -> None:
        """Give back `req`'s blocks past its first `num_tokens` tokens (speculative decoding under SGLang and
        TensorRT-LLM: rejected drafts' slots freed; simcore/speculative.py `rewind`)."""
        extra = req.num_blocks + (num_tokens // -self.block_size)
        if extra > 0:
            self.num_used_blocks -= extra
            req.num_blocks -= extra


class HostSwapSpace:
    """Host (CPU) memory for swapped-out KV (vLLM V0 `swap_space`, 4 GiB per GPU by default)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_used_blocks = 0

    def can_hold(self, num_blocks: int) -> bool:
        return self.num_used_blocks + num_blocks <= self.num_blocks


class _Block:
    """One physical KV block of the prefix-caching pool. `block_hash` is set once the block is full and
    registered; `ref_count` counts the running requests that hold it."""
    __slots__ = ("block_hash", "ref_count")

    def __init__(self):
        self.block_hash: int | None = None
        self.ref_count = 0


_NONE_HASH = 0x5BD1E995  # the first block's parent (vLLM's seeded NONE_HASH)
_UNNAMED = 0x2545F491  # salt: a block with no id is unique to its request


def chain_hashes(spec: RequestSpec, block_size: int, num_blocks: int | None = None,
                 hashes: list[int] | None = None) -> list[int]:
    """Hashes of the first `num_blocks` full blocks of `spec`'s sequence (default: its full prompt blocks),
    each chained over its parent's (vLLM `hash_block_tokens`), extending `hashes` (its first ones) in
    place when given. Blocks past the prompt hold generated tokens, unique to the request, as vLLM hashes
    them too (a preempted request re-hits its own output)."""
    ids = spec.prefix_block_ids or ()
    num_named = min(len(ids), spec.num_prompt_tokens // block_size)
    if num_blocks is None:
        num_blocks = spec.num_prompt_tokens // block_size
    if hashes is None:
        hashes = []
    h = hashes[-1] if hashes else _NONE_HASH
    for k in range(len(hashes), num_blocks):
        # 64-bit chained hash as nano-vllm's xxhash64; blocks beyond the named ones are request-unique.
        # (ids[k] == -1) because CPython's hash(-1) == hash(-2).
        h = hash((h, ids[k], ids[k] == -1)) if k < num_named else hash((h, spec.request_id, k, _UNNAMED))
        hashes.append(h)
    return hashes


class RequestBlockHashes:
    """A pool's memo of each request's chained block hashes (`self._hashes`: request id -> hashes, over
    `self.block_size`-token blocks); one rule for the single-group and the hybrid prefix caches."""
    _hashes: dict[int, list[int]]
    block_size: int

    def block_hashes(self, spec: RequestSpec, num_blocks: int | None = None) -> list[int]:
        """Chained hashes of the first `num_blocks` full blocks of `spec` (default: its full prompt blocks)."""
        if num_blocks is None:
            num_blocks = spec.num_prompt_tokens // self.block_size
        return self._hashes_upto(spec, num_blocks)[:num_blocks]

    def _hashes_upto(self, spec: RequestSpec, num_blocks: int) -> list[int]:
        """The request's memoised hash list, extended to at least `num_blocks` blocks (maybe longer)."""
        hashes = self._hashes.get(spec.request_id)
        if hashes is None:
            hashes = self._hashes[spec.request_id] = []
        if len(hashes) < num_blocks:
            chain_hashes(spec, self.block_size, num_blocks, hashes)
        return hashes


class PrefixCachingBlockPool(BlockPool, RequestBlockHashes):
    """vLLM V1's BlockPool with automatic prefix caching (vllm/v1/core/block_pool.py, kv_cache_manager.py).

    Full blocks are cached under a hash chained over the parent block's hash and the block's identity
    (`RequestSpec.prefix_block_ids[k]`, standing for its tokens; a block without an id, including every
    block of generated tokens, gets one unique to its request, so a preempted request re-hits its own
    blocks). A block is registered when a step that computes its last token is scheduled (vLLM caches at
    `allocate_slots`, so a request admitted later in the same step can hit it). Identical blocks computed
    by different requests are all kept (vLLM does not deduplicate); a lookup takes the first registered.
    Free blocks wait in one queue; allocation pops the head. A request's blocks are freed in reverse order
    (deepest first): cached ones are appended at the tail (LRU eviction; shared prefixes go last), blocks
    without a hash are put back at the head (vLLM 0.24 and later reuse them first; before, every freed block
    went to the tail: `hashless_blocks_first`, policies/vllm_versions.py). A cached block leaves the hash
    table only when it is reallocated (lazy eviction). Never-used blocks sit between the two ends, as in
    vLLM's initial free list (counted, not made, until used: a pool may hold millions).

    Counting: `num_used_blocks` = physical blocks held by at least one request (what vLLM reports as usage;
    cached idle blocks count as free); `num_block_refs` = sum of the blocks each request holds (shared
    blocks counted once per holder), which equals the sum of `Request.num_blocks`.
    """

    def __init__(self, num_gpu_blocks: int, block_size: int, hashless_blocks_first: bool = True):
        super().__init__(num_gpu_blocks, block_size)
        self.hashless_blocks_first = hashless_blocks_first   # vLLM's free-queue order since 0.24
        self.num_block_refs = 0
        # The free queue, head first: _front (blocks without a hash, put back at the head), then
        # _num_fresh never-used blocks, then _free (cached blocks, least recently freed first).
        self._front: deque[_Block] = deque()
        self._num_fresh = self.num_blocks
        self._free: OrderedDict[_Block, None] = OrderedDict()
        self._cached: dict[int, list[_Block]] = {}              # block hash -> blocks (held or free)
        self._held: dict[int, list[_Block]] = {}                # request id -> its blocks, front first
        self._num_registered: dict[int, int] = {}               # request id -> leading blocks already hashed
        self._hashes: dict[int, list[int]] = {}                 # request id -> chained hashes of its blocks
        self._memo: dict[int, tuple[int, list[_Block]]] = {}    # request id -> (epoch, longest cached chain)
        self._epoch = 0                                         # bumped whenever the cache changes
        # counters (vLLM's prefix_cache_queries / _hits, prompt_tokens_cached / _recomputed)
        self.num_queried_tokens = self.num_hit_tokens = 0
        self.num_queried_blocks = self.num_hit_blocks = 0
        self.num_evicted_blocks = 0
        self.cached_tokens_by_request: dict[int, int] = {}  # request id -> hit tokens, over its admissions
        self.host = None   # simcore.kvoffload.HostKVPool: the host tier, stored into as blocks are computed
        # EAGLE/MTP drafting: a hit gives back its last block, recomputed for the hidden states the drafter
        # reads (vLLM's drop_eagle_block, single_type_kv_cache_manager.py); simcore.speculative sets it
        self.drop_last_hit_block = False

    def num_cached_tokens_for(self, hashes: list[int], num_tokens: int) -> int:
        """Cached prefix of a request that is not in this pool (a router's question); no side effects."""
        n = 0
        for h in hashes[:(num_tokens - 1) // self.block_size]:
            if h not in self._cached:
                break
            n += 1
        if n and self.drop_last_hit_block:
            n -= 1
        return n * self.block_size

    def match(self, spec: RequestSpec, num_tokens: int) -> list[_Block]:
        """The longest chain of cached blocks that prefixes the request's `num_tokens` tokens, leaving at
        least its last token to compute (vLLM `get_computed_blocks`)."""
        memo = self._memo.get(spec.request_id)
        if memo is not None and memo[0] == self._epoch:
            return memo[1]
        out = []
        cached = self._cached
        n = (num_tokens - 1) // self.block_size
        for h in islice(self._hashes_upto(spec, n), n):
            blocks = cached.get(h)
            if blocks is None:
                break
            out.append(blocks[0])
        if out and self.drop_last_hit_block:
            out.pop()
        self._memo[spec.request_id] = (self._epoch, out)
        return out

    def num_cached_tokens(self, req: Request) -> int:
        return len(self.match(req.spec, req.num_tokens)) * self.block_size

    def num_held_hit_blocks(self, req: Request) -> int:
        """Hit blocks that other requests hold: sharing them takes no free block. (Cached idle hit blocks
        leave the free queue when touched, so they count against free capacity, as in vLLM.)"""
        return sum(1 for b in self.match(req.spec, req.num_tokens) if b.ref_count > 0)

    def plan(self) -> "StepPlan":
        return StepPlan(self)

    # ---- allocation ----
    def admit(self, req: Request) -> int:
        """Share the request's cached prefix (it holds no blocks yet); returns the hit in tokens."""
        blocks = self.match(req.spec, req.num_tokens)
        for b in blocks:
            if b.ref_count == 0:
                del self._free[b]
                self.num_used_blocks += 1
            b.ref_count += 1
        rid = req.request_id
        self._held[rid] = list(blocks)
        self._num_registered[rid] = len(blocks)
        req.num_blocks = len(blocks)
        self.num_block_refs += len(blocks)
        hit = len(blocks) * self.block_size
        self.cached_tokens_by_request[rid] = self.cached_tokens_by_request.get(rid, 0) + hit
        self.num_queried_tokens += req.num_tokens
        self.num_hit_tokens += hit
        self.num_queried_blocks += req.num_prompt_tokens // self.block_size
        self.num_hit_blocks += len(blocks)
        self._epoch += 1
        return hit

    def grow(self, req: Request, num_tokens: int) -> None:
        extra = -(-num_tokens // self.block_size) - req.num_blocks
        if extra <= 0:
            return
        if extra > self.num_free_blocks:
            raise RuntimeError(f"KV pool over capacity: request {req.request_id} needs {extra} blocks, "
                               f"{self.num_free_blocks} free (a policy scheduled more than fits)")
        held = self._held.setdefault(req.request_id, [])
        for _ in range(extra):
            if self._front:
                blk = self._front.popleft()
            elif self._num_fresh:
                self._num_fresh -= 1
                blk = _Block()
            else:
                blk, _ = self._free.popitem(last=False)
            if blk.block_hash is not None:  # lazy eviction: the least recently freed cached block
                same = self._cached[blk.block_hash]
                same.remove(blk)
                if not same:
                    del self._cached[blk.block_hash]
                blk.block_hash = None
                self.num_evicted_blocks += 1
                self._epoch += 1
            blk.ref_count = 1
            held.append(blk)
        self.num_used_blocks += extra
        self.num_block_refs += extra
        req.num_blocks += extra

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Register the request's blocks that are full once its first `num_tokens` tokens (default: those
        computed) have KV; the engine calls it when it schedules the step that computes them."""
        rid = req.request_id
        start = self._num_registered.get(rid, 0)
        end = min((req.num_computed_tokens if num_tokens is None else num_tokens) // self.block_size,
                  req.num_blocks)
        if self.host is not None:   # vLLM's offloading connector stores prompt blocks as they are computed
            self.host.offer(rid, self._hashes_upto(req.spec, end), end, req.spec.num_prompt_tokens)
        if start >= end:
            return
        held, hashes = self._held[rid], self._hashes_upto(req.spec, end)
        for i in range(start, end):
            blk = held[i]
            if blk.block_hash is None:
                blk.block_hash = hashes[i]
                self._cached.setdefault(hashes[i], []).append(blk)
        self._num_registered[rid] = end
        self._epoch += 1

    def free(self, req: Request) -> int:
        rid = req.request_id
        blocks = self._held.pop(rid, [])
        first = []
        hashless_first = self.hashless_blocks_first
        for b in reversed(blocks):  # tail first: shared prefixes are evicted last
            b.ref_count -= 1
            if b.ref_count == 0:
                self.num_used_blocks -= 1
                if b.block_hash is None and hashless_first:
                    first.append(b)
                else:
                    self._free[b] = None
        self._front.extendleft(reversed(first))  # vLLM BlockPool.free_blocks: prepend_n, in order
        self._num_registered.pop(rid, None)
        self._memo.pop(rid, None)
        if req.status in (RequestStatus.FINISHED, RequestStatus.DRAINING):
            if self.host is not None:
                self.host.request_finished(rid, self._hashes.get(rid))
            self._hashes.pop(rid, None)
        self.num_block_refs -= len(blocks)
        n, req.num_blocks = req.num_blocks, 0
        self._epoch += 1
        return n

    def stats(self) -> dict:
        return prefix_cache_stats([self])


_PLANNED = _Block()  # stands for a block that a request scheduled earlier in this step registers


class StepPlan:
    """A policy's scratch copy of what vLLM's scheduler sees within one step: each request it schedules
    touches its hit blocks, allocates new blocks from the LRU head (evicting cached ones) and registers
    the full blocks it will compute, before the next request looks up its hit. Nothing in the pool
    changes; the engine then applies the same sequence for real."""

    def __init__(self, pool: PrefixCachingBlockPool):
        self.pool = pool
        self._queue = chain(pool._front, repeat(None, pool._num_fresh), pool._free)  # popped lazily, head first
        self._touched: set[_Block] = set()
        self._evicted: set[_Block] = set()
        self._planned: set[int] = set()  # hashes registered this step
        self._released: dict[_Block, int] = {}  # block -> holders preempted this step
        self._version = 0
        self._memo: dict[int, tuple[int, list[_Block]]] = {}

    def hit_blocks(self, req: Request) -> list[_Block]:
        """The cached chain a new (or recompute-preempted) request would share if admitted next."""
        memo = self._memo.get(req.request_id)
        if memo is not None and memo[0] == self._version:
            return memo[1]
        pool, out, cached, evicted = self.pool, [], self.pool._cached, self._evicted
        n = (req.num_tokens - 1) // pool.block_size
        for h in islice(pool._hashes_upto(req.spec, n), n):
            blocks = cached.get(h)
            if blocks is None:
                blk = None
            elif not evicted:
                blk = blocks[0]
            else:
                blk = next((b for b in blocks if b not in evicted), None)
            if blk is None:
                if h not in self._planned:
                    break
                blk = _PLANNED
            out.append(blk)
        if out and pool.drop_last_hit_block:
            out.pop()
        self._memo[req.request_id] = (self._version, out)
        return out

    def num_held_hit_blocks(self, req: Request) -> int:
        return sum(1 for b in self.hit_blocks(req) if b is _PLANNED or b.ref_count > 0 or b in self._touched)

    def release(self, req: Request) -> int:
        """Blocks preempting `req` frees: those whose last holder it is (vLLM frees by ref count)."""
        n = 0
        for b in self.pool._held.get(req.request_id, ()):
            k = self._released[b] = self._released.get(b, 0) + 1
            n += k == b.ref_count
        return n

    def take(self, req: Request, num_tokens: int, is_new: bool) -> None:
        """Record that `req` is scheduled to hold KV for `num_tokens` tokens after this step."""
        bs = self.pool.block_size
        if is_new:
            hits = self.hit_blocks(req)
            self._touched.update(b for b in hits if b is not _PLANNED and b.ref_count == 0)
            num_have = num_registered = len(hits)
        else:
            num_have, num_registered = req.num_blocks, self.pool._num_registered.get(req.request_id, 0)
        for _ in range(cdiv(num_tokens, bs) - num_have):
            for blk in self._queue:  # None: a never-used block
                if blk is None or blk not in self._touched:
                    if blk is not None and blk.block_hash is not None:
                        self._evicted.add(blk)
                    break
        end = min(num_tokens, req.num_tokens) // bs   # as cache_full_blocks: sampled tokens only, no drafts
        if end > num_registered:
            self._planned.update(self.pool._hashes_upto(req.spec, end)[num_registered:end])
        self._version += 1


def prefix_cache_stats(pools) -> dict:
    """Prefix-cache counters summed over pools (one per replica). `prefix_hit_rate` is the token fraction
    (vLLM `prefix_cache_hits / prefix_cache_queries`); `prefix_block_hit_rate` counts full prompt blocks."""
    q = sum(p.num_queried_tokens for p in pools)
    hit = sum(p.num_hit_tokens for p in pools)
    qb = sum(p.num_queried_blocks for p in pools)
    hosts = [p.host for p in pools if p.host is not None]
    loaded = sum(h.num_hit_tokens for h in hosts)   # with KV offload: prompt tokens loaded, not recomputed
    stats = {"prefix_hit_rate": hit / q if q else 0.0,
             "prefix_block_hit_rate": sum(p.num_hit_blocks for p in pools) / qb if qb else 0.0,
             "num_cached_prompt_tokens": hit,
             "num_recomputed_prompt_tokens": q - hit - loaded,
             "num_prefix_evicted_blocks": sum(p.num_evicted_blocks for p in pools)}
    if hosts:
        stats.update(offload_stats(hosts, q - hit))
    return stats

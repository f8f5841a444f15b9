"""KV offloading to host memory: vLLM's native CPU offloading connector (`--kv-offloading-size`,
OffloadingConnector), its host pool and the loads that bring offloaded prefix blocks back.

What vLLM does, and what is modelled here (vLLM 0.32; paths under vllm/):
- Store on compute, not on eviction. After each step the connector offers the host tier the chunks of
  prompt blocks the step filled (distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py,
  `_build_store_jobs`; `offload_prompt_only` defaults to True in v1/kv_offload/base.py), so a prefix
  survives in host memory once the GPU pool evicts it. Chunks already held are not stored again; a chunk
  is `block_size` tokens of the host tier (a multiple of the GPU block; one GPU block by default).
- The host pool is LRU over chunks (v1/kv_offload/cpu/policies/lru.py): a stored chunk is the most
  recent; a finished request's chunks become the most recent with its first chunk last (its shared prefix
  is evicted last); a store that finds the pool full evicts the least recent chunks that no load is
  reading, and is dropped when it cannot (v1/kv_offload/cpu/manager.py, `prepare_store`).
- Capacity: `cpu_bytes_to_use = kv_offloading_size x 2^30`, the total over the replica's workers
  (config/cache.py), in chunks of KV bytes per block x workers x blocks per chunk, each rounded up to a
  page (v1/kv_offload/cpu/spec.py, `CPUOffloadingSpec.__init__`).
- Lookup: a new (or recompute-preempted) request first takes its GPU prefix hit; the connector then
  counts the consecutive chunks past it that the host holds (`get_num_new_matched_tokens`). A hit is loaded
  asynchronously: the scheduler allocates the request's blocks, leaves it in WAITING_FOR_REMOTE_KVS and
  schedules others (v1/core/sched/scheduler.py); the copy runs on its own CUDA stream beside the forward
  passes (v1/kv_offload/cpu/gpu_worker.py). When a step ends after the copy is done the request goes
  back to the head of the waiting queue with the loaded tokens computed, and its loaded blocks join the
  GPU prefix cache (`delay_cache_blocks`). Here: at each decision the waiting queue is walked in order,
  each request taking its prompt's blocks on paper, until one does not fit (vLLM's scheduler stops at the
  first request it cannot allocate); those with a host hit start loading, the others are left to the
  policy. Loads run one after another over the GPU's host link (each GPU copies its own shard over its own link), and rejoin
  the queue's head at the first decision at or after they end; an idle engine waits for the first.
- Not modelled: a store's own time (a device-to-host copy on a separate stream that blocks nothing but
  the reuse of the block it reads, which vLLM flushes first), ARC eviction, partial-chunk tail hits.
"""
from __future__ import annotations

from collections import OrderedDict
from itertools import chain
from dataclasses import dataclass

from simcore.request import Status

# vLLM rounds each host chunk up to a memory page (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE,
# 4 KiB on x86-64 Linux).
PAGE_BYTES = 4096
GIB = 1024**3


@dataclass(frozen=True)
class OffloadLimits:
    """The host tier of one replica: `num_chunks` chunks of `blocks_per_chunk` GPU blocks; `num_workers`
    GPUs (each stores its own shard of every block)."""
    num_chunks: int
    blocks_per_chunk: int = 1
    num_workers: int = 1


def offload_limits(cpu_bytes: float, gpu_block_bytes: int, blocks_per_chunk: int, num_workers: int) -> OffloadLimits:
    """vLLM's sizing of the host pool (CPUOffloadingSpec): `cpu_bytes` over the replica's workers, in whole
    page-aligned chunks; `gpu_block_bytes` is one GPU block's KV on one worker (all its layers)."""
    chunk_bytes = gpu_block_bytes * num_workers * blocks_per_chunk
    aligned = -(-chunk_bytes // PAGE_BYTES) * PAGE_BYTES
    return OffloadLimits(int(cpu_bytes) // aligned if aligned else 0, blocks_per_chunk, num_workers)


class HostKVPool:
    """One replica's host tier: chunks keyed by the chained hash of their last block (which names the whole
    prefix up to it), least recent first. `_pins` counts the loads reading a chunk (not evictable)."""

    def __init__(self, limits: OffloadLimits, block_size: int, gpu_block_bytes: int, host_link_bytes_per_s: float):
        self.capacity, self.blocks_per_chunk = limits.num_chunks, limits.blocks_per_chunk
        self.num_workers = limits.num_workers
        self.block_size, self.gpu_block_bytes = block_size, gpu_block_bytes
        self.host_link_bytes_per_s = host_link_bytes_per_s
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._pins: dict[int, int] = {}
        self._next_offer: dict[int, int] = {}   # request id -> first chunk not yet offered for storing
        self.link_free_s = 0.0                  # the host link carries one load at a time
        # counters (vLLM's connector prefix-cache hits; bytes over the link follow from the blocks)
        self.num_hit_tokens = 0
        self.num_loads = self.num_blocks_loaded = self.num_chunks_stored = self.num_evicted_chunks = 0
        self.num_dropped_chunks = 0
        self.drops_last_hit_chunk = False   # MTP drafting (simcore/speculative.py drops_last_host_chunk)

    def __len__(self) -> int:
        return len(self._lru)

    def keys(self) -> list[int]:
        """The held chunks' keys, least recent first (the eviction order)."""
        return list(self._lru)

    def _key(self, hashes: list[int], chunk: int) -> int:
        return hashes[(chunk + 1) * self.blocks_per_chunk - 1]

    # ---- stores ----
    def offer(self, request_id: int, hashes: list[int], num_full_blocks: int, num_prompt_tokens: int) -> None:
        """The request's first `num_full_blocks` blocks have KV (or will, by the end of this step): store
        the whole prompt chunks among them not yet offered, in order; `hashes` covers them."""
        end = min(num_full_blocks, num_prompt_tokens // self.block_size) // self.blocks_per_chunk
        start = self._next_offer.get(request_id, 0)
        if start >= end:
            return
        self._next_offer[request_id] = end
        keys = [self._key(hashes, c) for c in range(start, end)]
        new = [k for k in keys if k not in self._lru]
        evict = len(new) - (self.capacity - len(self._lru))
        if evict > 0:
            protected = set(keys)
            victims = [k for k in self._lru if k not in self._pins and k not in protected][:evict]
            if len(victims) < evict:   # vLLM's prepare_store fails whole: nothing of this offer is stored
                self.num_dropped_chunks += len(new)
                return
            for k in victims:
                del self._lru[k]
            self.num_evicted_chunks += evict
        for k in new:
            self._lru[k] = None
        self.num_chunks_stored += len(new)

    def request_finished(self, request_id: int, hashes: list[int] | None) -> None:
        """LRU recency at a request's end (vLLM LRUCachePolicy.on_request_finished): its held chunks become
        the most recent, its first chunk last of all."""
        end = self._next_offer.pop(request_id, 0)
        if hashes is None:
            return
        lru = self._lru
        for c in range(end - 1, -1, -1):
            k = self._key(hashes, c)
            if k in lru:
                lru.move_to_end(k)

    # ---- lookups and loads ----
    def num_hit_blocks(self, hashes: list[int], first_block: int, max_blocks: int, wide_blocks: int = 0) -> int:
        """GPU blocks past `first_block` (the GPU hit) that consecutive held chunks cover, within the
        first `max_blocks` blocks (whole chunks only). The chunk holding `first_block` is looked up whole.
        `wide_blocks` > 0 (MTP: `drops_last_hit_chunk`): looked up to that many blocks, one chunk past the
        limit where the request has it, then the hit's last chunk given back, as vLLM's connector does for
        a drafter's KV group."""
        bpc = self.blocks_per_chunk
        c, last = first_block // bpc, max_blocks // bpc
        n = c
        top = wide_blocks // bpc if wide_blocks else last
        while n < top and self._key(hashes, n) in self._lru:
            n += 1
        if wide_blocks and n > c:
            n = min(n - 1, last)
        return max(0, n * bpc - first_block)

    def loaded(self, request_id: int, num_blocks: int) -> None:
        """A request now has its first `num_blocks` blocks (GPU hit and load): vLLM offers only the chunks
        after them for storing (`update_state_after_alloc`, chunk-level policy)."""
        self._next_offer[request_id] = max(self._next_offer.get(request_id, 0), num_blocks // self.blocks_per_chunk)

    def pin(self, hashes: list[int], first_block: int, num_blocks: int) -> list[int]:
        keys = [self._key(hashes, c) for c in range(first_block // self.blocks_per_chunk,
                                                     (first_block + num_blocks) // self.blocks_per_chunk)]
        for k in keys:
            self._pins[k] = self._pins.get(k, 0) + 1
        return keys

    def unpin(self, keys: list[int]) -> None:
        for k in keys:
            n = self._pins[k] - 1
            if n:
                self._pins[k] = n
            else:
                del self._pins[k]

    def load_s(self, num_blocks: int) -> float:
        """Seconds a load of `num_blocks` GPU blocks takes on the host link (each GPU its own shard)."""
        return num_blocks * self.gpu_block_bytes / self.host_link_bytes_per_s


def offload_stats(pools, num_queried_tokens: int) -> dict:
    """Offload counters summed over replicas' host pools. `offload_hit_rate`: tokens loaded from the host
    over the tokens the host was asked for, those past each request's GPU hit (`num_queried_tokens`; vLLM's
    connector_prefix_cache_queries and _hits, v1/core/sched/scheduler.py); bytes over all GPUs."""
    hit = sum(p.num_hit_tokens for p in pools)
    block_bytes = [p.gpu_block_bytes * p.num_workers for p in pools]
    return {"offload_hit_rate": hit / num_queried_tokens if num_queried_tokens else 0.0,
            "offload_hit_tokens": hit,
            "offload_bytes_loaded": sum(p.num_blocks_loaded * b for p, b in zip(pools, block_bytes)),
            "offload_bytes_stored": sum(p.num_chunks_stored * p.blocks_per_chunk * b
                                        for p, b in zip(pools, block_bytes)),
            "offload_evicted_chunks": sum(p.num_evicted_chunks for p in pools)}


class HostLoads:
    """The loads in flight of one engine (`engine.loading`: their requests, holding their blocks) and the
    decision-time rules: loads that ended rejoin the queue; new requests with a host hit start theirs."""

    def __init__(self, host: HostKVPool, spec_step_blocks: int = 0):
        self.host = host
        # speculative decoding: vLLM admits a load only if its hit blocks leave its first verification's
        # blocks free (`_spec_decode_step_blocks`: 1 + k + lookahead tokens, v1/core/sched/scheduler.py)
        self.spec_step_blocks = spec_step_blocks
        self.in_flight: list[tuple[float, object, list[int]]] = []   # (done_s, request, pinned keys), issue order
        self.rejoined: dict[int, object] = {}   # loaded requests back in the queue (some admitted since)

    @property
    def next_done_s(self) -> float:
        return self.in_flight[0][0]

    def before_decision(self, engine, now_s: float) -> None:
        """At a decision of `engine` (before its policy): finished loads rejoin the head of the waiting queue
        with their blocks cached; then requests in the queue with a host hit past their GPU hit start
        loading, in queue order, until one does not fit in the free blocks."""
        host, cache = self.host, engine.prefix_cache
        if self.in_flight and self.in_flight[0][0] <= now_s:
            ready = []
            while self.in_flight and self.in_flight[0][0] <= now_s:
                _, req, keys = self.in_flight.pop(0)
                host.unpin(keys)
                engine.loading.remove(req)
                cache.cache_full_blocks(req, req.num_computed_tokens)
                ready.append(req)
                self.rejoined[req.request_id] = req
            engine.waiting.extendleft(reversed(ready))
        if not engine.waiting or not len(host):
            return
        bs, started = cache.block_size, []
        # Blocks the loaded requests still need to finish their prompts: kept free, so that a request whose
        # load ended can always be admitted (vLLM allocates only the loaded blocks and can stall here).
        self.rejoined = {k: r for k, r in self.rejoined.items() if r.status is Status.WAITING and r.num_blocks}
        reserved = sum(-(-r.num_tokens // bs) - r.num_blocks for r in chain(engine.loading, self.rejoined.values()))
        free = cache.num_free_blocks
        for req in engine.waiting:
            if req.num_computed_tokens or req.status is not Status.WAITING:
                continue
            hit_blocks = cache.match(req.spec, req.num_tokens)
            g = len(hit_blocks)
            num_prompt_blocks = -(-req.num_tokens // bs)
            need = num_prompt_blocks - sum(1 for b in hit_blocks if b.ref_count > 0)   # shared hits: no free block
            if need + reserved > free:
                break   # vLLM's scheduler stops at the first request it cannot allocate
            max_blocks = (req.num_tokens - 1) // bs
            wide = 0   # MTP: one chunk more queried, then popped
            if host.drops_last_hit_chunk:
                bpc = host.blocks_per_chunk
                wide = min((max_blocks // bpc + 1) * bpc, req.num_tokens // bs // bpc * bpc)
            hashes = cache.block_hashes(req.spec, max(max_blocks, wide))
            h = host.num_hit_blocks(hashes, g, max_blocks, wide)
            if h == 0:   # the policy admits it, ahead of those behind it: its blocks are not theirs to load into
                reserved += need
                continue
            if self.spec_step_blocks and g + h - (num_prompt_blocks - need) + self.spec_step_blocks + reserved > free:
                break
            reserved += num_prompt_blocks - (g + h)   # what it takes when admitted after its load
            cache.admit(req)
            cache.grow(req, (g + h) * bs)
            req.num_computed_tokens = (g + h) * bs
            host.num_hit_tokens += h * bs
            cache.cached_tokens_by_request[req.request_id] += h * bs   # vLLM counts loaded tokens as cached
            host.num_blocks_loaded += h
            host.num_loads += 1
            host.loaded(req.request_id, g + h)
            done_s = max(now_s, host.link_free_s) + host.load_s(h)
            host.link_free_s = done_s
            self.in_flight.append((done_s, req, host.pin(hashes, g, h)))
            engine.loading.append(req)
            started.append(req)
            free = cache.num_free_blocks
        if started:
            ids = {id(r) for r in started}
            engine.waiting = type(engine.waiting)(r for r in engine.waiting if id(r) not in ids)


def host_loads(limits, prefix_cache) -> HostLoads | None:
    """The host tier of an engine with `limits` (None without `kv_offload`), attached to its prefix cache."""
    if limits.kv_offload is None:
        return None
    if prefix_cache is None:   # vLLM's connector keys its chunks by the prefix cache's block hashes
        raise ValueError("engine.kv_offload: needs engine.enable_prefix_caching: true")
    gpu_block_bytes = limits.block_size * limits.kv_bytes_per_token
    prefix_cache.host = HostKVPool(limits.kv_offload, limits.block_size, gpu_block_bytes, limits.host_link_bytes_per_s)
    spec = limits.speculative
    prefix_cache.host.drops_last_hit_chunk = bool(spec and spec.drops_last_host_chunk)
    step = -(-(1 + spec.num_speculative_tokens + spec.num_lookahead_tokens) // limits.block_size) if spec else 0
    return HostLoads(prefix_cache.host, step)

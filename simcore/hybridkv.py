"""vLLM's hybrid KV cache manager for models that mix full-attention and sliding-window layers (gpt-oss,
Mistral-style all-sliding models, any config with `layer_types`), counted as vLLM counts it.

Grouping (vllm/v1/core/kv_cache_utils.py, `_get_kv_cache_groups_uniform_page_size`): layers of one
attention type form KV cache groups of `group_size` layers each, `group_size` being the smallest type's
layer count (or the largest, when the largest is under 1.5x the smallest), the last group of a type padded
with empty layers. Every group's block is `group_size` layers' KV of `block_size` tokens, all groups draw
their blocks from one shared pool, and the pool is sized by that: blocks = free memory / (group_size x
per-layer page). gpt-oss-120b: 18 full and 18 sliding layers, two groups of 18, so a block holds half the
layers of a whole-model block and the pool has twice as many.

Per request (vllm/v1/core/single_type_kv_cache_manager.py): each group keeps a block table of
cdiv(tokens, block_size) entries. A full-attention group holds them all. A sliding-window group frees the
blocks that fell wholly out of the window (`remove_skipped_blocks`, run at the top of `allocate_slots`,
with the tokens computed so far: blocks below (computed - window + 1) // block_size), keeping their
places as null blocks, so a running request's new blocks are cdiv(tokens, block_size) - table length in
every group alike. A waiting request's admission check (`full_sequence_must_fit`) caps each sliding
group's need at `SlidingWindowSpec.max_admission_blocks_per_request`: cdiv(window - 1 + tokens in flight,
block_size) + 1, tokens in flight being the step's token budget (one batch in flight: no async scheduling,
as the policies here).

`--disable-hybrid-kv-cache-manager` (vLLM's switch; engine.disable_hybrid_kv_cache_manager here) turns
sliding layers into full-attention ones for KV management when both kinds are present: one group of all
layers, every block counted for the whole sequence (simcore.kvcache.BlockPool). A model whose layers are
all sliding keeps its window even then (vLLM leaves a uniform model's specs alone).
"""
from __future__ import annotations

from dataclasses import dataclass

from simcore.kvcache import BlockPool, cdiv
from simcore.request import Request


@dataclass(frozen=True)
class KVCacheGroups:
    """The KV cache groups vLLM forms for one model on one GPU, and the per-request block caps it derives.
    `group_size`: layers per group (padding included); `num_full_groups` / `num_sliding_groups`: groups
    of each kind; `sliding_window`: tokens a sliding layer attends to; `max_num_batched_tokens`: the
    step's token budget (tokens in flight); `max_model_len`: the longest sequence."""
    group_size: int
    num_full_groups: int
    num_sliding_groups: int
    sliding_window: int
    block_size: int
    max_num_batched_tokens: int
    max_model_len: int

    @property
    def num_groups(self) -> int:
        return self.num_full_groups + self.num_sliding_groups

    @property
    def sliding_admission_blocks(self) -> int:
        """`SlidingWindowSpec.max_admission_blocks_per_request`: the most blocks one sliding group of one
        request holds (+1: the window need not start at a block boundary)."""
        tokens = min(self.sliding_window - 1 + self.max_num_batched_tokens, self.max_model_len)
        return cdiv(tokens, self.block_size) + 1

    def blocks_per_request(self, num_tokens: int) -> int:
        """Blocks of the shared pool a request of `num_tokens` tokens reserves at admission."""
        n = cdiv(num_tokens, self.block_size)
        return self.num_full_groups * n + self.num_sliding_groups * min(n, self.sliding_admission_blocks)

    def capacity_tokens(self, num_gpu_blocks: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" (kv_cache_utils.get_kv_cache_capacity): the concurrency at
        max_model_len, num_blocks / blocks per max_model_len request, times max_model_len."""
        per_request = self.blocks_per_request(self.max_model_len)
        return int(num_gpu_blocks / per_request * self.max_model_len)


def kv_cache_groups(num_full_layers: int, num_sliding_layers: int, sliding_window: int, *, block_size: int,
                    max_num_batched_tokens: int, max_model_len: int) -> KVCacheGroups:
    """vLLM's grouping of one GPU's (or pipeline stage's) attention layers."""
    counts = [n for n in (num_full_layers, num_sliding_layers) if n > 0]
    group_size = min(counts)
    if max(counts) < 1.5 * group_size:   # vLLM: few padding layers (gpt-oss-20b + EAGLE: 12 sw, 13 full)
        group_size = max(counts)
    return KVCacheGroups(group_size, cdiv(num_full_layers, group_size), cdiv(num_sliding_layers, group_size),
                         sliding_window, block_size, max_num_batched_tokens, max_model_len)


class HybridBlockPool(BlockPool):
    """The shared block pool of vLLM's HybridKVCacheCoordinator, counted. `Request.num_blocks` is the
    physical blocks a request holds over all groups; `_tables[request id] = [table length, skipped]` is
    its block-table length (the same in every group) and how many leading entries each sliding group has
    freed. Invariant: num_blocks = full groups x length + sliding groups x (length - skipped)."""

    def __init__(self, num_gpu_blocks: int, groups: KVCacheGroups):
        super().__init__(num_gpu_blocks, groups.block_size)
        self.groups = groups
        self._full, self._sliding = groups.num_full_groups, groups.num_sliding_groups
        self._all = groups.num_groups
        self._cap = groups.sliding_admission_blocks
        self._window = groups.sliding_window
        self._tables: dict[int, list[int]] = {}

    def _skipped(self, num_computed_tokens: int, length: int, skipped: int) -> int:
        """Leading table entries a sliding group has freed after `remove_skipped_blocks` with
        `num_computed_tokens` computed (never more than the table holds; never fewer than before)."""
        s = (num_computed_tokens - self._window + 1) // self.block_size
        if s > length:
            s = length
        return s if s > skipped else skipped

    def blocks_to_hold(self, req: Request, num_tokens: int) -> int:
        """Free blocks `req` takes to hold `num_tokens` tokens, net of the out-of-window blocks its sliding
        groups free first (may be negative: vLLM frees them before it checks the free count). A request
        holding nothing is checked as vLLM admits one, each sliding group capped (see the module)."""
        n = -(-num_tokens // self.block_size)
        table = self._tables.get(req.request_id)
        if table is None:
            return self._full * n + self._sliding * (n if n < self._cap else self._cap)
        length, skipped = table
        grow = n - length if n > length else 0
        freed = self._skipped(req.num_computed_tokens, length, skipped) - skipped
        return self._all * grow - self._sliding * freed

    def blocks_for(self, num_tokens: int) -> int:
        """The fewest blocks a request with `num_tokens` computed tokens holds (an engine invariant)."""
        n = cdiv(num_tokens, self.block_size)
        return self._full * n + self._sliding * max(0, n - max(0, (num_tokens - self._window + 1) // self.block_size))

    def can_grow(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_to_hold(req, num_tokens) <= self.num_free_blocks

    def grow(self, req: Request, num_tokens: int) -> None:
        """vLLM `allocate_slots`: free the sliding groups' out-of-window blocks (by the tokens computed
        before this step), then extend every group's table to `num_tokens` tokens."""
        rid = req.request_id
        table = self._tables.get(rid)
        if table is None:
            table = self._tables[rid] = [0, 0]
        length, skipped = table
        new_skipped = self._skipped(req.num_computed_tokens, length, skipped)
        n = -(-num_tokens // self.block_size)
        grow = n - length if n > length else 0
        delta = self._all * grow - self._sliding * (new_skipped - skipped)
        if delta > self.num_blocks - self.num_used_blocks:
            raise RuntimeError(f"KV pool over capacity: request {rid} needs {delta} blocks, "
                               f"{self.num_free_blocks} free (a policy scheduled more than fits)")
        table[0], table[1] = length + grow, new_skipped
        self.num_used_blocks += delta
        req.num_blocks += delta

    def free(self, req: Request) -> int:
        self._tables.pop(req.request_id, None)
        return super().free(req)


def gpu_block_pool(num_gpu_blocks: int, block_size: int, kv_groups: KVCacheGroups | None) -> BlockPool:
    """The counting pool an engine runs without prefix caching: vLLM's hybrid one when the model has
    sliding-window groups, else one group of every layer."""
    if kv_groups is None:
        return BlockPool(num_gpu_blocks, block_size)
    make = getattr(kv_groups, "make_pool", None)   # another engine's allocator (simcore/sglang_swa.py)
    if make is not None:
        return make(num_gpu_blocks)
    if kv_groups.block_size != block_size:
        raise ValueError(f"engine.block_size: {block_size}, but the KV cache groups were formed for {kv_groups.block_size}")
    return HybridBlockPool(num_gpu_blocks, kv_groups)

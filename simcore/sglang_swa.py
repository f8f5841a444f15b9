"""SGLang's hybrid sliding-window memory (`SWATokenToKVPoolAllocator`, sglang/srt/mem_cache/swa_memory_pool.py)
for a model with both full-attention and sliding-window layers (gpt-oss), counted as the SGLang policy here
runs it (no radix cache: SGLang's chunk cache).

Two pools of pages: the full-attention layers' and the sliding layers'. Every token takes a slot in both,
and the sliding pool frees the slots of tokens that left the window. The pools' sizes split SGLang's profiled
KV memory by `--swa-full-tokens-ratio` r (default 0.8, server_args.py): with per-token bytes F per full layer
and S per sliding layer (model_runner_kv_cache_mixin.py `set_num_tokens_hybrid_swa`),
    full tokens = total memory / (F x full layers + r x S x sliding layers),  sliding tokens = r x full tokens,
each aligned down to the page. gpt-oss-120b (18 + 18 layers, one page size): 1/0.9 = 1.11 times the tokens
every layer whole would get, and a sliding pool 0.8 times that.

Freeing out of the window (schedule_batch.py `maybe_evict_swa` / `_evict_swa` with a chunk cache): before a
prefill chunk of a request with `pre_len` tokens computed, and on its 1st, (1 + W)th, (1 + 2W)th ... decode
step (`decode_batch_idx % sliding_window == 1`, pre_len = the sequence less its newest token), the sliding pool
frees the slots below `pre_len - window - page`, aligned down to the page. What the scheduler may use is the
smaller of the two pools' free space (`available_size`: the minimum of the full and sliding pools').

In this simulator's currency, `num_blocks` is the smaller pool's pages and `num_used_blocks` is that less the
smaller free count, so a policy's free blocks are SGLang's `available_size` in pages, and an idle engine uses
none. A request's `num_blocks` counts its pages in both pools (`num_block_refs` is their sum over requests).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from simcore.kvcache import BlockPool, cdiv
from simcore.request import Request

# SGLang's default --swa-full-tokens-ratio (python/sglang/srt/server_args.py)
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8


@dataclass(frozen=True)
class SwaPools:
    """The layout of SGLang's two pools for one model on one GPU: how many layers of each kind, the window, the
    page and the sliding/full token ratio."""
    num_full_layers: int
    num_sliding_layers: int
    sliding_window: int
    block_size: int
    swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    policies: ClassVar[tuple[str, ...]] = ("sglang",)   # the engine whose allocator this is

    def num_swa_blocks(self, num_full_blocks: int) -> int:
        """Sliding-pool pages for a full pool of `num_full_blocks` pages: int(full tokens x r), page-aligned."""
        return int(num_full_blocks * self.block_size * self.swa_full_tokens_ratio) // self.block_size

    def bytes_per_block(self, per_layer_bytes_per_token: float) -> int:
        """The memory one full-pool page costs with its share of the sliding pool (the ratio's denominator)."""
        return int((self.num_full_layers + self.swa_full_tokens_ratio * self.num_sliding_layers)
                   * per_layer_bytes_per_token * self.block_size)

    def blocks_per_request(self, num_tokens: int) -> int:
        """Full-pool pages a request of `num_tokens` tokens takes (what decides whether it can ever fit)."""
        return cdiv(num_tokens, self.block_size)

    def capacity_tokens(self, num_gpu_blocks: int) -> int:
        """SGLang's `max_total_num_tokens`: the full pool's tokens."""
        return num_gpu_blocks * self.block_size

    def make_pool(self, num_gpu_blocks: int) -> "SwaBlockPool":
        return SwaBlockPool(num_gpu_blocks, self)


class SwaBlockPool(BlockPool):
    """The two pools, counted (module docstring). `_held[request id] = [pages, pages freed from the sliding
    pool, decode steps since admission]`."""

    def __init__(self, num_gpu_blocks: int, pools: SwaPools):
        super().__init__(num_gpu_blocks, pools.block_size)
        self.pools = pools
        self.num_full_blocks = self.num_blocks
        self.num_swa_blocks = pools.num_swa_blocks(num_gpu_blocks)
        self.num_blocks = min(self.num_full_blocks, self.num_swa_blocks)
        self._window = pools.sliding_window
        self._full_used = self._swa_used = 0
        self._held: dict[int, list[int]] = {}

    @property
    def num_full_free_blocks(self) -> int:
        return self.num_full_blocks - self._full_used

    @property
    def num_swa_free_blocks(self) -> int:
        return self.num_swa_blocks - self._swa_used

    @property
    def num_block_refs(self) -> int:
        """Pages held in both pools (the sum of the requests' `num_blocks`)."""
        return self._full_used + self._swa_used

    def _update_used(self) -> None:
        free = min(self.num_full_blocks - self._full_used, self.num_swa_blocks - self._swa_used)
        self.num_used_blocks = self.num_blocks - free

    def blocks_for(self, num_tokens: int) -> int:
        """The fewest pages a request with `num_tokens` computed tokens holds over both pools."""
        n = cdiv(num_tokens, self.block_size)
        return n + n - min(n, max(0, num_tokens - self._window - self.block_size) // self.block_size)

    def blocks_to_hold(self, req: Request, num_tokens: int) -> int:
        """Pages `req` takes to hold `num_tokens` tokens: its growth (each new page takes one in both pools;
        what the sliding pool frees this step is not counted, as SGLang checks before it evicts)."""
        held = self._held.get(req.request_id)
        n = cdiv(num_tokens, self.block_size)
        return max(0, n - (held[0] if held else 0))

    def can_grow(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_to_hold(req, num_tokens) <= self.num_free_blocks

    def grow(self, req: Request, num_tokens: int) -> None:
        """Free the sliding pool's slots out of the window (at a prefill chunk, or on the decode steps SGLang
        evicts at), then give `req` pages for `num_tokens` tokens in both pools."""
        rid, bs = req.request_id, self.block_size
        held = self._held.get(rid)
        if held is None:
            held = self._held[rid] = [0, 0, 0]
        pages, freed, steps = held
        computed = req.num_computed_tokens
        decode = num_tokens - computed == 1 and req.num_generated_tokens > 0
        if decode:
            steps += 1
        if not decode or steps % self._window == 1 % self._window:
            evict = min(max(0, computed - self._window - bs) // bs, pages)
            if evict > freed:
                self._swa_used -= evict - freed
                freed = evict
        n = cdiv(num_tokens, bs)
        grow = n - pages if n > pages else 0
        if grow > self.num_full_blocks - self._full_used or grow > self.num_swa_blocks - self._swa_used:
            raise RuntimeError(f"KV pool over capacity: request {rid} needs {grow} pages, "
                               f"{self.num_free_blocks} free (a policy scheduled more than fits)")
        self._full_used += grow
        self._swa_used += grow
        held[0], held[1], held[2] = pages + grow, freed, steps
        req.num_blocks = 2 * held[0] - freed
        self._update_used()

    def free(self, req: Request) -> int:
        held = self._held.pop(req.request_id, None)
        if held is not None:
            self._full_used -= held[0]
            self._swa_used -= held[0] - held[1]
            self._update_used()
        n, req.num_blocks = req.num_blocks, 0
        return n

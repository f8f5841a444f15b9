"""Paged KV-cache pool (vLLM's BlockPool, counted rather than addressed) and host swap space.

Blocks are fungible here: the pool counts them. Memory sizing follows vLLM's profile run:
blocks = (GPU memory x gpu_memory_utilization - weights - activation reserve) / bytes per block.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcore.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


def plan_memory(*, gpu_memory_bytes: float, gpu_memory_utilization: float, weight_bytes: float,
                kv_bytes_per_token: int, block_size: int, activation_reserve_bytes: float,
                num_gpu_blocks: int | None = None) -> MemoryPlan:
    """Derive the KV block count, or take `num_gpu_blocks` as given (vLLM's `num_gpu_blocks_override`)."""
    if num_gpu_blocks is None:
        free = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes
        num_gpu_blocks = int(free // (kv_bytes_per_token * block_size))
        if num_gpu_blocks <= 0:
            raise ValueError(
                f"no memory left for the KV cache: {gpu_memory_bytes / 1e9:.0f} GB x {gpu_memory_utilization} "
                f"< weights {weight_bytes / 1e9:.1f} GB + activations {activation_reserve_bytes / 1e9:.1f} GB; "
                "use more tensor parallelism, a bigger GPU or engine.num_gpu_blocks")
    return MemoryPlan(num_gpu_blocks, block_size, kv_bytes_per_token, gpu_memory_bytes,
                      gpu_memory_utilization, weight_bytes, activation_reserve_bytes)


class BlockPool:
    """GPU KV blocks. Invariant: 0 <= num_used_blocks <= num_blocks, and it equals the sum of what
    the requests holding blocks have (checked by the engine)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
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
        extra = self.blocks_for(num_tokens) - req.num_blocks
        if extra <= 0:
            return
        if extra > self.num_free_blocks:
            raise RuntimeError(f"KV pool over capacity: request {req.request_id} needs {extra} blocks, "
                               f"{self.num_free_blocks} free (a policy scheduled more than fits)")
        self.num_used_blocks += extra
        req.num_blocks += extra

    def free(self, req: Request) -> int:
        n = req.num_blocks
        self.num_used_blocks -= n
        req.num_blocks = 0
        return n


class HostSwapSpace:
    """Host (CPU) memory for swapped-out KV (vLLM V0 `swap_space`, 4 GiB per GPU by default)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_used_blocks = 0

    def can_hold(self, num_blocks: int) -> bool:
        return self.num_used_blocks + num_blocks <= self.num_blocks

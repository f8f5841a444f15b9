"""The sweep file's `engine.kv_offload:` section: KV offloading to host memory (simcore/kvoffload.py), with
vLLM's names beside the short ones.

    engine:
      enable_prefix_caching: true
      kv_offload: {cpu_gb: 8}      # vLLM --kv-offloading-size 8 (GiB, the replica's total over its GPUs)

Keys: `cpu_gb` (or vLLM's `kv_offloading_size`), GiB of host memory for the offloaded KV; `block_size`,
tokens per chunk of the host tier (vLLM's kv_connector_extra_config block_size; a multiple of
engine.block_size, default one GPU block); `eviction_policy`: lru (vLLM's default; its arc is not modelled).
"""
from __future__ import annotations

from dataclasses import dataclass

from experiments.configcheck import ConfigError, check_keys, number
from simcore.kvoffload import GIB, OffloadLimits, offload_limits

KEYS = ("cpu_gb", "kv_offloading_size", "block_size", "eviction_policy")


@dataclass(frozen=True)
class OffloadSettings:
    cpu_gb: float                   # GiB, as vLLM's kv_offloading_size (x 2^30 bytes)
    block_size: int | None = None   # host chunk in tokens; None: the GPU block
    eviction_policy: str = "lru"

    def limits(self, gpu_block_size: int, gpu_block_bytes: int, num_workers: int) -> OffloadLimits:
        """The host pool for GPU blocks of `gpu_block_size` tokens and `gpu_block_bytes` bytes on each of
        `num_workers` GPUs."""
        blocks_per_chunk = (self.block_size or gpu_block_size) // gpu_block_size
        return offload_limits(self.cpu_gb * GIB, gpu_block_bytes, blocks_per_chunk, num_workers)


def parse_offload(spec, where: str = "engine.kv_offload") -> OffloadSettings | None:
    """`engine.kv_offload` typed and checked; None when absent."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping such as {{cpu_gb: 8}}, got {spec!r}")
    check_keys(where, spec, KEYS)
    if "cpu_gb" in spec and "kv_offloading_size" in spec:
        raise ConfigError(f"{where}.kv_offloading_size: the same setting as {where}.cpu_gb; give one")
    key = "cpu_gb" if "cpu_gb" in spec else "kv_offloading_size"
    if key not in spec:
        raise ConfigError(f"{where}.cpu_gb: required (GiB of host memory for offloaded KV)")
    cpu_gb = number(f"{where}.{key}", spec[key])
    if cpu_gb <= 0:
        raise ConfigError(f"{where}.{key}: must be positive, got {spec[key]!r}")
    block_size = spec.get("block_size")
    if block_size is not None:
        block_size = number(f"{where}.block_size", block_size, integer=True)
        if block_size < 1:
            raise ConfigError(f"{where}.block_size: must be at least 1, got {block_size!r}")
    policy = spec.get("eviction_policy", "lru")
    if policy != "lru":
        raise ConfigError(f"{where}.eviction_policy: only lru is modelled (vLLM's default), got {policy!r}")
    return OffloadSettings(cpu_gb, block_size)


def check_offload(settings: OffloadSettings, engine_block_size: int, enable_prefix_caching: bool,
                  host_memory_bytes: float | None, num_gpus: int, gpu_name: str, has_deadlines: bool,
                  where: str = "engine.kv_offload") -> None:
    """The rules vLLM and this model put on an offload setting, each one line naming the key."""
    if not enable_prefix_caching:
        raise ConfigError(f"{where}: needs engine.enable_prefix_caching: true (vLLM keys offloaded blocks by "
                          "their prefix-cache hashes)")
    if settings.block_size is not None and settings.block_size % engine_block_size:
        raise ConfigError(f"{where}.block_size: {settings.block_size} must be a multiple of engine.block_size "
                          f"({engine_block_size}), as vLLM requires")
    if host_memory_bytes is not None and settings.cpu_gb * GIB > host_memory_bytes * num_gpus:
        raise ConfigError(f"{where}.cpu_gb: {settings.cpu_gb:g} GiB is more than the host memory of "
                          f"{num_gpus} x {gpu_name} ({host_memory_bytes * num_gpus / GIB:g} GiB; "
                          "hardware.host_memory_bytes per GPU)")
    if has_deadlines:
        raise ConfigError(f"{where}: not modelled with gateway deadlines (a request may leave while its load "
                          "is in flight)")

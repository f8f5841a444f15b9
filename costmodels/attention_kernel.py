"""Which FlashAttention path vLLM's attention backend takes on a GPU, where that changes what a step costs.

vLLM's FLASH_ATTN backend runs one varlen kernel over every request of a step, prefill chunks and decodes
together (vllm/v1/attention/backends/flash_attn.py). On FlashAttention 2, the version vLLM picks on every
NVIDIA GPU but Hopper (FA3) and datacenter Blackwell SM100 (FA4) (vllm/v1/attention/backends/fa_utils.py,
get_flash_attn_version), a decode-only step takes the grouped-query path: `mha_varlen_fwd` folds the query
heads that share a KV head into one tile (`seqlenq_ngroups_swapped = max_seqlen_q == 1 && num_heads >
num_heads_k ...`, flash-attention csrc/flash_attn/flash_api.cpp), so each KV head's cache is read once,
split over KV blocks. A step with any prefill chunk has max_seqlen_q > 1: the decode rows then run one
query head per tile, and each KV head's cache is read once per query head sharing it. The L2 cache serves
the re-reads of a KV head's slice that fits in it. vLLM 0.19's own kernel timings show it (LLMServingSim's
profiler, attention.csv, docs/fidelity/gpu/kernels.md): 128 decodes at context 1,024 plus a 16-token
chunk take 2.35x the decode-only kernel on an RTX 4090 and 1.66x on an RTX PRO 6000, the excess growing
with decodes x context. FA3 and FA4 pack grouped query heads in mixed batches too (pack_gqa), ROCm runs
its own kernels: no such excess there.
"""
from __future__ import annotations

from costmodels.catalog import GPU


def _major(gpu: GPU) -> int | None:
    """The compute capability's major version (9 for "9.0"), None for a GPU described without one (AMD)."""
    cc = gpu.compute_capability
    return int(cc.split(".")[0]) if cc else None


def mixed_batch_rereads_kv(gpu: GPU, kv_format: str = "bf16") -> bool:
    """True when a step mixing prefill chunks with decodes reads each decode's KV once per query head
    (FlashAttention 2's varlen kernel without its grouped-query fold): vLLM's choice of FA version by compute
    capability (`get_flash_attn_version`): FA3 on 9.x (Hopper), FA4 on 10.x (datacenter Blackwell, where the
    default backend is FlashInfer, which runs decodes apart), FA2 on the others from 8.0 (Ampere, Ada,
    consumer and workstation Blackwell 12.x). A GPU without a compute capability (AMD, or one described
    without it) has no such excess. Nor has an FP8 cache: FlashAttention 2 cannot read one
    (`flash_attn_supports_kv_cache_dtype`, vllm/v1/attention/backends/fa_utils.py: FP8 only on FA3 / FA4),
    so vLLM takes the next backend (FlashInfer, whose decode kernel groups the query heads, or Triton's)."""
    major = _major(gpu)
    return kv_format != "fp8" and major is not None and major >= 8 and major not in (9, 10)


def fp8_kv_decode_on_chip_bound(gpu: GPU, kv_format: str) -> bool:
    """True when paged decode attention over an FP8 cache runs FlashAttention 3 (Hopper, 9.x), whose FP8
    path streams the cache at an on-chip rate below DRAM's (`Efficiencies.fp8_kv_decode_bytes_per_flop`):
    NVIDIA's vLLM tables time it at 2.32 TB/s on an H100 and 2.38 on an H200, the same rate on 43% more
    DRAM bandwidth, where their bf16 caches stream at 0.87 and 0.82 of DRAM. Blackwell's FlashInfer kernels,
    Ada's and the RTX PRO 6000's stream an FP8 cache at about their bf16 share (0.77-0.91)."""
    return kv_format == "fp8" and _major(gpu) == 9

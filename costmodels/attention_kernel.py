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

# Catalog GPUs on which vLLM runs FlashAttention 2 (compute capability 8.x and 12.x): Ampere A100/A10G,
# Ada L4/L40/L40S/RTX 4090, Blackwell RTX PRO 6000 (SM120).
FA2_GPUS = frozenset({"a100-40gb", "a100-80gb", "a10g", "l4", "l40", "l40s", "rtx-4090", "rtx-pro-6000",
                      "rtx-pro-6000-server"})


def mixed_batch_rereads_kv(gpu: GPU) -> bool:
    """True when a step mixing prefill chunks with decodes reads each decode's KV once per query head
    (FlashAttention 2's varlen kernel without its grouped-query fold). A GPU described by the user from a
    catalog `base` (named `<base>-custom` unless it names itself) counts as its base's kind."""
    return gpu.name.removesuffix("-custom") in FA2_GPUS

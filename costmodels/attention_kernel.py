"""Which FlashAttention path vLLM's attention backend takes on a GPU, where that changes what a step costs:
the decodes' re-reads in a mixed step (below) and how a prefill chunk is tiled (`prefill_tile_shape`,
`prefill_compute_s`: query tiles as CTAs walking their keys, one CTA per SM at a time).

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

The same FA2 kernel sizes its grid by the step's longest query: `num_m_block = (seqlen_q + kBlockM - 1) /
kBlockM` with `seqlen_q` the batch's max_seqlen_q, times sequences times query heads
(src/flash_fwd_launch_template.h, run_flash_splitkv_fwd), and a CTA past its own sequence's queries exits at
once. Beside a 2,048-token chunk every decode launches 31 such empty CTAs a query head: vLLM 0.19's kernel
takes 0.35 us an empty CTA per SM on both GPUs (the roofline's `_varlen_excess_s`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PrefillTiles:
    """How a FlashAttention kernel tiles a prefill chunk: `block_m` query rows by `block_n` keys a tile;
    `pack_gqa`: the rows of one tile come from all the query heads sharing a KV head (so a short chunk fills
    more of its tile); `split_kv`: a KV walk too long for the CTAs the chunk has is split over idle SMs;
    `kernel`: "fa2" or "fa3", whose measured tile rate and overhead differ (Efficiencies.attention_tiles)."""
    kernel: str
    block_m: int
    block_n: int
    pack_gqa: bool
    split_kv: bool


def prefill_tile_shape(gpu: GPU, head_dim: int, kv_format: str = "bf16") -> PrefillTiles | None:
    """The tiles of the FlashAttention kernel vLLM runs a prefill chunk with, or None where another kernel
    runs it (datacenter Blackwell's FlashInfer, ROCm, an FP8 cache on FlashAttention 2 GPUs) or the GPU's SM
    count is not known: the prefill is then priced by its FLOPs alone.
    - FlashAttention 2 (compute capability 8.x and 12.x): vLLM passes a paged KV cache (block_table), which
      `mha_varlen_fwd` always runs through the split-KV kernel (`run_mha_fwd(params, stream,
      /*force_split_kernel=*/paged_KV)`) with one split and one query head a tile when the chunk has more
      than one token (the grouped-query fold is for decodes only), tiles of `kBlockM = 64`, `kBlockN =
      Headdim <= 64 ? 256 : (Headdim <= 128 ? 128 : 64)` (csrc/flash_attn/flash_api.cpp,
      src/flash_fwd_launch_template.h run_mha_fwd_splitkv_dispatch). vLLM 0.19's own timings show both: a
      16-token chunk after 16,384 cached tokens takes as long as a 256-token one (one wave, each CTA walking
      the whole prefix), and the time doubles when query tiles x 32 heads pass the SM count (128 CTAs on an
      RTX 4090, 188 on an RTX PRO 6000).
    - FlashAttention 3 (9.x), causal, 16-bit: 192 x 128 up to head dim 96, 128 x 128 up to 128, 128 x 112 up
      to 192, 128 x 80 above (hopper/tile_size.h, tile_size_fwd_sm90); varlen queries pack the grouped
      query heads into a tile (`should_pack_gqa`) and too few tiles for the SMs split the KV walk
      (`get_num_splits`, hopper/flash_api.cpp)."""
    major = _major(gpu)
    if gpu.sm_count is None or major is None:
        return None
    if major == 9:
        bm, bn = (192, 128) if head_dim <= 96 else (128, 128) if head_dim <= 128 else \
            (128, 112) if head_dim <= 192 else (128, 80)
        return PrefillTiles("fa3", bm, bn, pack_gqa=True, split_kv=True)
    if major >= 8 and major != 10 and kv_format != "fp8":
        return PrefillTiles("fa2", 64, 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64, pack_gqa=False,
                            split_kv=False)
    return None


def empty_query_tiles(new_tokens, num_decode: int, block_m: int) -> int:
    """The CTAs of one query head that FlashAttention 2's varlen grid launches past their sequence's queries:
    every sequence (chunks of `new_tokens` each, and `num_decode` single-token decodes) gets the longest
    chunk's ceil(max / block_m) query tiles, and uses its own ceil(new / block_m)."""
    longest = -(-max(new_tokens) // block_m)
    used = sum(-(-n // block_m) for n in new_tokens) + num_decode
    return (len(new_tokens) + num_decode) * longest - used


def prefill_compute_s(prefill, tiles: PrefillTiles, sm_count: int, heads: int, kv_heads: float, tile_s: float,
                      overhead: float, window: int | None = None) -> float:
    """One layer's prefill attention where compute-bound, tile by tile: each query tile of each head (each
    KV head, packed) is a CTA that walks its keys in tiles of `tile_s` seconds each (4 x block_m x block_n x
    head dim FLOP at one SM's share of the peak times the kernel's measured rate) and adds `overhead`
    tiles' worth (loading its queries, the softmax's last rescale, writing its output); the SMs share the
    CTAs. Without split-KV no schedule beats two more bounds: the longest CTA, and the SM that runs
    ceil(CTAs / SMs) of them, each at least as long as the shortest (a chunk after a long cached prefix,
    whose CTAs all walk about the same keys, takes whole waves: 256 CTAs on 188 SMs take two)."""
    group = heads / kv_heads if tiles.pack_gqa and kv_heads else 1.0
    total, units, longest, shortest = prefill_tiles(prefill, tiles.block_m / group, tiles.block_n, window)
    ctas = kv_heads if group > 1 else heads
    work = ctas * (total + units * overhead) / sm_count
    if not tiles.split_kv:
        waves = -(-round(ctas * units) // sm_count)
        work = max(work, longest + overhead, waves * (shortest + overhead))
    return work * tile_s


def tile_seconds(tiles: PrefillTiles, head_dim: int, sm_flops_per_s: float) -> float:
    """One tile's time: its 4 x block_m x block_n x head_dim FLOP at `sm_flops_per_s`."""
    return 4.0 * tiles.block_m * tiles.block_n * head_dim / sm_flops_per_s


@dataclass(frozen=True)
class PrefillTileFit:
    """Prefill attention of one layer as measured on one GPU (a kernel profile's `prefill_attn_tiles`): the
    tile model with its tile time, overhead and a fixed time fitted to the profile's own prefill timings
    (calibration/prefill_tiles.py), so a chunk after a cached prefix is priced as the kernel runs it."""
    tiles: PrefillTiles
    sm_count: int
    tile_s: float
    overhead: float
    fixed_s: float

    def layer_s(self, prefill, heads: int, kv_heads: float) -> float:
        return prefill_compute_s(prefill, self.tiles, self.sm_count, heads, kv_heads, self.tile_s,
                                 self.overhead) + self.fixed_s

    def to_dict(self) -> dict:
        return {"kernel": self.tiles.kernel, "block_m": self.tiles.block_m, "block_n": self.tiles.block_n,
                "pack_gqa": self.tiles.pack_gqa, "split_kv": self.tiles.split_kv, "sm_count": self.sm_count,
                "tile_s": self.tile_s, "overhead": self.overhead, "fixed_s": self.fixed_s}

    @classmethod
    def from_dict(cls, d: dict) -> "PrefillTileFit":
        tiles = PrefillTiles(str(d["kernel"]), int(d["block_m"]), int(d["block_n"]), bool(d["pack_gqa"]),
                             bool(d["split_kv"]))
        fit = cls(tiles, int(d["sm_count"]), float(d["tile_s"]), float(d["overhead"]), float(d["fixed_s"]))
        if min(fit.sm_count, fit.tile_s, tiles.block_m, tiles.block_n) <= 0 or fit.overhead < 0 or fit.fixed_s < 0:
            raise ValueError(f"prefill_attn_tiles: non-positive figure in {d}")
        return fit


def prefill_tiles(prefill, block_m: float, block_n: int,
                  window: int | None = None) -> tuple[float, int, float, float]:
    """(KV tiles summed over every query tile, number of query tiles, KV tiles of the longest and of the
    shortest query tile) of one head's causal prefill attention over `prefill`, a list of (new tokens,
    cached tokens): query tile i of a chunk covers rows up to e_i = min((i + 1) block_m, new) and reads the
    c + e_i keys before them (at most window + block_m on a sliding-window layer), in block_n-key tiles; the
    last of those is partial, half a tile on average (block_m: positions a tile covers, fewer than its rows
    when grouped query heads are packed). Closed form, exact in float64 for integer inputs."""
    total_keys, units, longest, first = 0.0, 0, 0.0, math.inf
    for n, c in prefill:
        if n <= 0:
            continue
        q = int(-(-n // block_m))
        if window is None:
            keys = q * c + block_m * q * (q - 1) / 2 + n
            last = c + n
            first = min(first, c + min(block_m, n))
        else:
            cap = window + block_m
            k = min(max(int(-(-(cap - c) // block_m)) - 1, 0), q - 1)   # the first q - 1 tiles below the cap
            keys = k * c + block_m * k * (k + 1) / 2 + (q - 1 - k) * cap + min(c + n, cap)
            last = min(c + n, cap)
            first = min(first, c + min(block_m, n), cap)
        total_keys += keys
        units += q
        longest = max(longest, last / block_n + 0.5)
    shortest = first / block_n + 0.5 if units else 0.0
    return total_keys / block_n + 0.5 * units, units, longest, shortest

"""The roofline prior's kernel constants, recomputed from measured kernel timings.

    python -m benchmarks.kernel_efficiency [--shared PATH]

Fits latency = fixed + bytes / (datasheet bandwidth x efficiency) (least squares on relative error) to:
decode-shaped bf16 GEMMs (m <= 64, weights >= 4 MB) and paged decode attention (bf16 KV, full attention,
KV >= 4 MB) in NVIDIA aiconfigurator's vLLM tables (the `aiconfigurator-core` package, when installed);
the same two families in vLLM 0.19's own per-layer timings on an RTX 4090 and an RTX PRO 6000 Server
Edition (../shared/real-runs/llmservingsim/profiler_perf, when present); TP all-reduce (vLLM's custom
all-reduce under CUDA graphs and NCCL, H100, 256 kB to 64 MB) as latency + ring bytes / (NVLink x eff);
vLLM's FP8 linear (CUTLASS scaled_mm) at decode sizes and where compute-bound, against the same tables'
bf16 GEMMs; decode attention over an FP8 KV cache against a bf16 one; prefill attention where
compute-bound, over a bf16 and an FP8 cache; vLLM's fused MoE kernel where compute-bound, as a fraction of
the dense peak; vLLM's FP8 MoE kernels, compute-bound and at decode sizes; the fixed time of a kernel that
moves almost nothing (vLLM's FP8 quantisation kernel in the tables, its fused elementwise kernels at one token).
Prints one line per GPU and family; costmodels/roofline.py `Efficiencies` quotes these lines. --compare
adds the op-by-op comparison of docs/fidelity/gpu/kernels.md.
"""
from __future__ import annotations

import glob
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.shared_data import shared_folder  # noqa: E402
from commandline.parser import Parser  # noqa: E402
from costmodels.attention_kernel import fp8_kv_decode_on_chip_bound  # noqa: E402
from costmodels.catalog import GPUS  # noqa: E402
from costmodels.collectives import MiB, gpu_allreduce_link, nvlink_ampere  # noqa: E402

TABLE_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "b200_sxm": "b200-sxm", "a100_sxm": "a100-80gb",
              "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000-server"}
PROFILER_GPUS = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000-server"}
LLAMA31_8B = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}


def fit(num_bytes: np.ndarray, latency_s: np.ndarray, bytes_per_s: float) -> tuple[float, float, float]:
    """(fixed seconds, efficiency, median |relative error|) of latency = fixed + bytes / (bw x eff)."""
    a = np.c_[np.ones_like(num_bytes), num_bytes / bytes_per_s]
    w = 1 / latency_s
    coef, *_ = np.linalg.lstsq(a * w[:, None], latency_s * w, rcond=None)
    return float(coef[0]), 1 / float(coef[1]), float(np.median(np.abs(a @ coef / latency_s - 1)))


def line(what: str, f) -> str:
    text = f"{what}: {f[1]:.2f} of datasheet + {f[0] * 1e6:.1f} us fixed (median |err| {f[2]:.0%})"
    if f[1] > 1.0:   # faster than DRAM can feed it: the benchmark re-read data its L2 still held
        text += "; above DRAM bandwidth (warm L2 in the table's timing), not a figure for serving"
    return text


def tables(root: Path) -> None:
    for g, name in TABLE_GPUS.items():
        bw = GPUS[name].hbm_bytes_per_s
        gemm = sorted(glob.glob(f"{root}/{g}/gemm/vllm/*/gemm_perf.parquet"))
        if gemm:
            d = pd.read_parquet(gemm[-1])
            d = d[(d.gemm_dtype == "bfloat16") & (d.m <= 64) & (d.n * d.k * 2 >= 4e6)]
            b = (d.n * d.k * 2 + d.m * (d.n + d.k) * 2.0).to_numpy()
            print(line(f"{name} decode GEMM (aiconfigurator vllm {gemm[-1].split('/')[-2]}, {len(d)} rows)",
                       fit(b, d.latency.to_numpy() * 1e-3, bw)))
            r = pd.read_parquet(gemm[-1])
            r = r[(r.gemm_dtype == "bfloat16") & (r.n * r.k * 2 >= 4e6)]
            print(ridge_line(name, f"aiconfigurator vllm {gemm[-1].split('/')[-2]}", r.m, r.n, r.k, r.latency * 1e-3))
        attn = sorted(glob.glob(f"{root}/{g}/attention/vllm/*/generation_attention_perf.parquet"))
        if attn:
            d = pd.read_parquet(attn[-1])
            d = d[(d.kv_cache_dtype == "bfloat16") & ((d.window_size == 0) if "window_size" in d else True)]
            b = (d.batch_size * (d.isl + d.step) * 2 * d.num_key_value_heads * d.head_dim * 2.0).to_numpy()
            keep = b >= 4e6
            print(line(f"{name} decode attention (aiconfigurator vllm {attn[-1].split('/')[-2]}, {keep.sum()} rows)",
                       fit(b[keep], d.latency.to_numpy()[keep] * 1e-3, bw)))
    for text in scaled_mm_lines(Path(root)):
        print(text)
    for text in gemm_compute_lines(Path(root)) + fp8_kv_decode_lines(Path(root)) + prefill_attention_lines(Path(root)):
        print(text)
    for text in moe_compute_lines(Path(root)) + moe_fp8_lines(Path(root)):
        print(text)
    for what, us in small_kernel_table_us(Path(root)).items():
        print(small_kernel_line(what, us))
    # the TP all-reduce over NVLink (costmodels/collectives.py NVLINK): vLLM's all-reduce under CUDA graphs, through
    # its own dispatch (custom kernel, symmetric-memory multimem at TP 8), and NCCL's for comparison
    for g, label, path, backend in (
            ("h100_sxm", "vLLM custom all-reduce (graph)", "vllm/0.24.0/custom_allreduce_perf.parquet", "vllm_graph"),
            ("h100_sxm", "NCCL 2.27 all-reduce", "nccl/2.27.3/nccl_perf.parquet", None),
            ("h200_sxm", "vLLM custom all-reduce (graph)", "vllm/0.24.0/custom_allreduce_perf.parquet", "vllm_graph"),
            ("a100_sxm", "vLLM custom all-reduce (graph)", "vllm/0.14.0/custom_allreduce_perf.parquet", "vllm_graph")):
        comm = Path(root) / g / "comm"
        if not (comm / path).exists():
            continue
        t = pd.read_parquet(comm / path)
        t = t[t.backend == backend] if backend else t[(t.op_name == "all_reduce") & (t.nccl_dtype == "half")]
        gpu = GPUS[TABLE_GPUS[g]]
        for tp in (2, 4, 8):
            # vLLM's dispatch hands larger messages to NCCL (costmodels/collectives.py NVLINK, NVLINK_AMPERE)
            limit = gpu_allreduce_link(gpu, tp).beyond_bytes
            # Hopper's pair below the limit was fitted over 256 kB-64 MB (its limits sit at 32-64 MiB); the
            # A100's custom kernel stops at 8 MiB, far inside that range
            ranges = [("", 256e3, limit - 1 if nvlink_ampere(gpu) else 64e6)]
            if backend:
                ranges.append((f", {limit / MiB:.0f} MiB and more", limit, 1e12))
            for what, low, high in ranges:
                s = t[(t.num_gpus == tp) & (t.message_size * 2 >= low) & (t.message_size * 2 <= high)]
                if len(s):
                    ring = s.message_size.to_numpy() * 2.0 * 2 * (tp - 1) / tp
                    f = fit(ring, s.latency.to_numpy() * 1e-3, GPUS[TABLE_GPUS[g]].interconnect_bytes_per_s)
                    print(f"{TABLE_GPUS[g]} {label} TP{tp}{what} (link): {f[1]:.2f} of datasheet + "
                          f"{f[0] * 1e6:.1f} us fixed (median |err| {f[2]:.0%})")


def scaled_mm_lines(root: Path) -> list[str]:
    """vLLM's W8A8 FP8 linear (CUTLASS scaled_mm; the table times the layer: a static-scale quantisation of
    the activation, then the GEMM) against the same table's bf16 GEMMs: decode-shaped rows (m <= 64, FP8
    weights >= 4 MB) fitted as fixed + bytes / (DRAM x efficiency), and compute-bound rows (m 1,024-8,192,
    n and k >= 4,096) as a fraction of the GPU's FP8 peak once the quantisation (read the bf16 activation,
    write it in FP8, at 0.9 of DRAM, plus 3 us) is taken out: in a compiled model it is fused into the
    RMSNorm or SiLU*mul before most linears (costmodels/roofline.py `Efficiencies.scaled_mm_*`)."""
    lines = []
    for g, name in TABLE_GPUS.items():
        gemm = sorted(glob.glob(f"{root}/{g}/gemm/vllm/*/gemm_perf.parquet"))
        gpu = GPUS[name]
        if not gemm or not gpu.fp8_flops_per_s:
            continue
        t = pd.read_parquet(gemm[-1])
        version, bw = gemm[-1].split("/")[-2], gpu.hbm_bytes_per_s
        fits = {}
        for dtype, wb, ab in (("bfloat16", 2, 2), ("fp8", 1, 1)):
            d = t[(t.gemm_dtype == dtype) & (t.m <= 64) & (t.n * t.k * wb >= 4e6)]
            if len(d):
                b = (d.n * d.k * wb + d.m * d.k * ab + d.m * d.n * 2.0).to_numpy()
                fits[dtype] = fit(b, d.latency.to_numpy() * 1e-3, bw)
        c = t[(t.gemm_dtype == "fp8") & (t.m >= 1024) & (t.m <= 8192) & (t.n >= 4096) & (t.k >= 4096)]
        if "fp8" not in fits or not len(c):
            continue
        gemm_s = c.latency * 1e-3 - (c.m * c.k * 3 / (bw * 0.9) + 3e-6)
        frac = float(np.median(2 * c.m * c.n * c.k / gemm_s / gpu.peak_flops_per_s("fp8")))
        f, b16 = fits["fp8"], fits.get("bfloat16")
        lines.append(f"{name} FP8 scaled_mm (aiconfigurator vllm {version}): decode {f[1]:.2f} of DRAM + "
                     f"{f[0] * 1e6:.1f} us (bf16 {b16[1]:.2f} + {b16[0] * 1e6:.1f} us; median |err| {f[2]:.0%}); "
                     f"compute-bound {frac:.2f} of the FP8 peak ({len(c)} rows)")
    return lines


def gemm_compute_lines(root: Path) -> list[str]:
    """bf16 GEMMs where compute-bound (costmodels/catalog.py GEMM_FIGURES, Efficiencies.gemm_compute): per GPU
    and framework table (vLLM's first), rows with m >= 2,048 and n, k >= 4,096, the median of
    2 m n k / (latency x the datasheet 16-bit peak), beside the catalog's figure for that GPU."""
    lines = []
    for g, name in {**TABLE_GPUS, "gb200": "gb200"}.items():
        gpu, shares = GPUS[name], []
        for framework in ("vllm", "trtllm", "sglang"):
            paths = sorted(glob.glob(f"{root}/{g}/gemm/{framework}/*/gemm_perf.parquet"))
            if not paths:
                continue
            d = pd.read_parquet(paths[-1])
            d = d[(d.gemm_dtype == "bfloat16") & (d.m >= 2048) & (d.n >= 4096) & (d.k >= 4096)]
            if len(d):
                share = np.median(2.0 * d.m * d.n * d.k / (d.latency * 1e-3 * gpu.bf16_flops_per_s))
                shares.append(f"{framework} {paths[-1].split('/')[-2]} {share:.2f} ({len(d)} rows)")
        if shares:
            lines.append(f"{name} bf16 GEMM compute-bound, of the datasheet peak: {'; '.join(shares)}; catalog "
                         f"gemm_compute {gpu.gemm_compute}")
    return lines


def prefill_attention_lines(root: Path) -> list[str]:
    """Prefill (context) attention where compute-bound (Efficiencies.attention_compute): per GPU, the newest
    vLLM table's full-attention rows with head dim 128, batch x prompt >= 8,192 tokens, prompts of 1,024 or
    more and 8+ heads, causal FLOPs / (latency x the 16-bit peak), over a bf16 and over an FP8 cache; then
    the median of the GPUs' bf16 figures."""
    lines, medians = [], []
    for g, name in TABLE_GPUS.items():
        paths = sorted(glob.glob(f"{root}/{g}/attention/vllm/*/context_attention_perf.parquet"))
        if not paths:
            continue
        d = pd.read_parquet(paths[-1])
        if "window_size" in d:
            d = d[d.window_size == 0]
        d = d[(d.head_dim == 128) & (d.batch_size * d.isl >= 8192) & (d.isl >= 1024) & (d.num_heads >= 8)]
        peak, shares = GPUS[name].bf16_flops_per_s, {}
        for kv in ("bfloat16", "fp8"):
            x = d[d.kv_cache_dtype == kv]
            if len(x):
                flops = 4.0 * x.head_dim * x.num_heads * x.batch_size * x.isl * (x.isl + 1) / 2
                shares[kv] = (float(np.median(flops / (x.latency * 1e-3 * peak))), len(x))
        if "bfloat16" not in shares:
            continue
        medians.append(shares["bfloat16"][0])
        text = (f"{name} prefill attention, compute-bound (aiconfigurator vllm {paths[-1].split('/')[-2]}, "
                f"{shares['bfloat16'][1]} rows): bf16 cache {shares['bfloat16'][0]:.2f} of the 16-bit peak")
        if "fp8" in shares:
            text += f", FP8 cache {shares['fp8'][0]:.2f}"
        lines.append(text)
    if medians:
        lines.append(f"prefill attention compute-bound, median of the {len(medians)} GPUs: {np.median(medians):.2f} "
                     "of the 16-bit peak (Efficiencies.attention_compute)")
    return lines


def prefill_tile_time_s(rows, gpu, eff: float, overhead: float, fixed_s: float) -> np.ndarray:
    """Prefill attention priced tile by tile, as the prior prices it (costmodels/attention_kernel.py
    `prefill_compute_s`): `rows` of (sequences, new tokens, cached tokens, query heads, KV heads, head dim),
    each a batch of equal sequences."""
    from costmodels.attention_kernel import prefill_compute_s, prefill_tile_shape, tile_seconds
    out = []
    for b, n, c, h, kvh, d in rows:
        tiles = prefill_tile_shape(gpu, int(d))
        tile_s = tile_seconds(tiles, int(d), gpu.bf16_flops_per_s * eff / gpu.sm_count)
        out.append(prefill_compute_s([(int(n), int(c))] * int(b), tiles, gpu.sm_count, int(h), float(kvh), tile_s,
                                     overhead) + fixed_s)
    return np.array(out)


def prefill_flops_time_s(rows, gpu) -> np.ndarray:
    """The same rows priced by FLOPs and bytes alone (the prior before tiles, and still for GPUs without an SM
    count): the roofline with no tile figures, at each row's heads and head dim."""
    from dataclasses import replace
    from costmodels.catalog import get_model
    from costmodels.deployment import Deployment
    from costmodels.roofline import Efficiencies, RooflineCostModel
    base, by_flops, priced = get_model("llama-3.1-8b"), Efficiencies(attention_tiles=()), {}
    out = []
    for b, n, c, h, kvh, d in rows:
        key = (int(h), int(kvh), int(d))
        if key not in priced:
            priced[key] = RooflineCostModel(replace(base, num_heads=key[0], num_kv_heads=key[1], head_dim=key[2]),
                                            gpu, deployment=Deployment(dtype="bf16"), eff=by_flops)
        out.append(priced[key]._prefill_attention_s([(int(n), int(c))] * int(b)))
    return np.array(out)


def prefill_tile_lines(root: Path | None, shared: Path | None) -> list[str]:
    """Prefill (context) attention tile by tile (Efficiencies.attention_tiles): per source, the share of a
    streaming multiprocessor's 16-bit peak one tile
    runs at, the tiles' worth of work each query tile adds (loading its queries, the softmax's last
    rescale, writing its output) and a fixed time, least squares on the log of the latency; then the
    medians over each kernel's sources (FlashAttention 2 and 3). Sources: the newest vLLM context-attention table of each GPU NVIDIA timed
    with FlashAttention (full attention, bf16 cache, head dim 128, 8-64 heads, prompts of 32+ tokens: a
    chunk vLLM schedules), and vLLM 0.19's own prefill-chunk timings after 0-16,384 cached tokens on an
    RTX 4090 and an RTX PRO 6000 Server (LLMServingSim profiler, attention.csv, Llama-3.1-8B)."""
    from scipy.optimize import least_squares
    sources = []
    kernels = {"h100_sxm": "vllm_flash_attn_fa3", "h200_sxm": "vllm_flash_attn_fa3", "a100_sxm": "vllm_flash_attn",
               "l40s": "vllm_flash_attn_fa2", "rtx_pro_6000_server": "vllm_flash_attn_fa2"}
    for g, kernel in kernels.items() if root is not None else ():
        paths = sorted(glob.glob(f"{root}/{g}/attention/vllm/*/context_attention_perf.parquet"))
        if not paths:
            continue
        d = pd.read_parquet(paths[-1])
        d = d[(d.kernel_source == kernel) & (d.head_dim == 128) & (d.kv_cache_dtype == "bfloat16") & (d.isl >= 32)
              & d.num_heads.isin([8, 16, 32, 64])]
        if "window_size" in d:
            d = d[d.window_size == 0]
        rows = list(zip(d.batch_size, d.isl, [0] * len(d), d.num_heads, d.num_key_value_heads, d.head_dim))
        sources.append((f"{TABLE_GPUS[g]} (aiconfigurator vllm {paths[-1].split('/')[-2]}, {kernel})",
                        GPUS[TABLE_GPUS[g]], rows, d.latency.to_numpy() * 1e-3))
    base = shared / "real-runs" / "llmservingsim" / "profiler_perf" if shared is not None else None
    for g, name in PROFILER_GPUS.items() if base is not None else ():
        path = base / f"{g}_Llama-3.1-8B_bf16" / "tp1" / "attention.csv"
        if not path.exists():
            continue
        a = pd.read_csv(path)
        a = a[(a.n_decode == 0) & (a.prefill_chunk > 0)]
        rows = list(zip([1] * len(a), a.prefill_chunk, a.kv_prefill, [32] * len(a), [8] * len(a), [128] * len(a)))
        sources.append((f"{name} (vLLM 0.19 eager, chunks after 0-16,384 cached tokens)", GPUS[name], rows,
                        a.time_us.to_numpy() * 1e-6))
    lines, fits = [], []
    for label, gpu, rows, lat in sources:
        def residual(p, rows=rows, gpu=gpu, lat=lat):
            return np.log(prefill_tile_time_s(rows, gpu, p[0], p[1], p[2] * 1e-6)) - np.log(lat)
        fit_ = least_squares(residual, [0.6, 1.0, 5.0], bounds=([0.05, 0.0, 0.0], [3.0, 20.0, 100.0])).x
        err = np.abs(np.exp(residual(fit_)) - 1)
        fits.append(fit_)
        lines.append(f"{label} prefill attention by tiles ({len(lat)} rows): {fit_[0]:.2f} of an SM's 16-bit peak, "
                     f"+{fit_[1]:.2f} tiles a query tile, +{fit_[2]:.1f} us (median |err| {np.median(err):.0%}, "
                     f"p90 {np.percentile(err, 90):.0%})")
    from costmodels.attention_kernel import prefill_tile_shape
    kernel_of = [prefill_tile_shape(gpu, 128).kernel for _, gpu, _, _ in sources]
    pooled = {}
    for k in sorted(set(kernel_of)):
        mine = [f for f, kk in zip(fits, kernel_of) if kk == k]
        pooled[k] = (float(np.median([f[0] for f in mine])), float(np.median([f[1] for f in mine])))
        lines.append(f"prefill attention by tiles, {k}, median of {len(mine)} sources: {pooled[k][0]:.2f} of an SM's "
                     f"peak, +{pooled[k][1]:.2f} tiles a query tile (Efficiencies.attention_tiles)")
    for (label, gpu, rows, lat), k in zip(sources, kernel_of):   # the pooled constants, 2 us launch, as priced
        err = prefill_tile_time_s(rows, gpu, *pooled[k], 2e-6) / lat - 1
        flops = prefill_flops_time_s(rows, gpu) / lat - 1
        lines.append(f"  {label}: with the {k} medians, median |err| {np.median(np.abs(err)):.0%} "
                     f"(median {np.median(err):+.0%}, p90 |err| {np.percentile(np.abs(err), 90):.0%}); by FLOPs "
                     f"alone {np.median(np.abs(flops)):.0%} (median {np.median(flops):+.0%}, p90 "
                     f"{np.percentile(np.abs(flops), 90):.0%})")
    return lines


SMALL_KERNEL_BYTES = 64e3   # a streaming kernel moving this little takes its fixed time alone


def small_kernel_table_us(root: Path) -> dict[str, float]:
    """The fixed time of a streaming kernel that moves almost nothing (`Efficiencies.kernel_launch_s`): the
    median latency, in us, of vLLM's static FP8 quantisation kernel (read 16 bits, write 8) over the rows of
    NVIDIA's vLLM quantisation table that move 64 kB or less, per GPU."""
    out = {}
    for g, name in TABLE_GPUS.items():
        path = sorted(glob.glob(f"{root}/{g}/quantize/vllm/*/scale_matrix_perf.parquet"))
        if not path:
            continue
        d = pd.read_parquet(path[-1])
        d = d[(d.latency > 0) & (d.m * d.k * 3.0 <= SMALL_KERNEL_BYTES)]
        if len(d):
            out[f"{name} (aiconfigurator vllm {path[-1].split('/')[-2]}, static FP8 quantisation, {len(d)} rows)"] = \
                float(np.median(d.latency) * 1e3)
    return out


def small_kernel_profiler_us(dense: pd.DataFrame) -> float | None:
    """The same from vLLM 0.19's own per-layer timings: the median of its fused elementwise kernels (add +
    RMSNorm, the final norm, SiLU*mul, rotary) at one token, where each moves a few kB."""
    s = dense[dense.layer.isin(("layernorm", "final_layernorm", "act_fn", "rotary_emb")) & (dense.tokens == 1)]
    return float(np.median(s.time_us)) if len(s) else None


def small_kernel_line(what: str, us: float) -> str:
    return f"{what} smallest streaming kernel: {us:.2f} us"


def fp8_kv_decode_lines(root: Path) -> list[str]:
    """Paged decode attention over an FP8 KV cache against a bf16 one, the same table (m: KV bytes read):
    the rate at which the kernel streams the cache where it is large (512 MB or more a layer), in bytes a
    second and as a share of DRAM, and on Hopper that rate over the GPU's 16-bit tensor peak
    (costmodels/roofline.py `Efficiencies.fp8_kv_decode_bytes_per_flop`)."""
    lines = []
    for g, name in TABLE_GPUS.items():
        attn = sorted(glob.glob(f"{root}/{g}/attention/vllm/*/generation_attention_perf.parquet"))
        if not attn:
            continue
        d = pd.read_parquet(attn[-1])
        if "window_size" in d:   # full attention only
            d = d[d.window_size == 0]
        gpu, rates = GPUS[name], {}
        for kv, kb in (("bfloat16", 2.0), ("fp8", 1.0)):
            x = d[d.kv_cache_dtype == kv]
            b = x.batch_size * (x.isl + x.step) * 2 * x.num_key_value_heads * x.head_dim * kb
            big = b >= 512e6
            if big.any():
                rates[kv] = float(np.median(b[big] / (x.latency[big] * 1e-3)))
        if len(rates) < 2:
            continue
        bw = gpu.hbm_bytes_per_s
        text = (f"{name} decode attention, KV >= 512 MB (aiconfigurator vllm {attn[-1].split('/')[-2]}): bf16 KV "
                f"{rates['bfloat16'] / 1e12:.2f} TB/s ({rates['bfloat16'] / bw:.2f} of DRAM), FP8 KV "
                f"{rates['fp8'] / 1e12:.2f} TB/s ({rates['fp8'] / bw:.2f})")
        if fp8_kv_decode_on_chip_bound(gpu, "fp8"):   # the GPUs the prior prices at this rate
            text += f"; FP8 rate / bf16 peak {rates['fp8'] / gpu.bf16_flops_per_s:.2e} bytes a FLOP"
        lines.append(text)
    return lines


def moe_table_terms(t: pd.DataFrame, gpu, weight_bytes: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, tokens) of each MoE table row as the prior counts them (costmodels/roofline.py
    `_routed_experts_s`: gate, up and down over the routed tokens; the active experts' weights at
    `weight_bytes` a parameter and the routed activations in bf16), for the busiest rank of the row's tp x ep
    layout."""
    h, i, k, e, tp, ep, n = (t[c].to_numpy(float) for c in ("hidden_size", "inter_size", "topk", "num_experts",
                                                            "moe_tp_size", "moe_ep_size", "num_tokens"))
    width, routed = i / tp, n * k / ep
    active = e / ep * (1 - (1 - 1 / e) ** (n * k))
    return (2 * routed * 3 * h * width, active * 3 * h * width * weight_bytes + routed * (2 * h + 3 * width) * 2,
            n)


def moe_rows(path: str) -> pd.DataFrame:
    """A vLLM MoE table's bf16 rows of layouts people serve (tp x ep <= 8, an intermediate width per rank of
    128 or more)."""
    t = pd.read_parquet(path)
    return t[(t.moe_dtype == "bfloat16") & (t.moe_tp_size * t.moe_ep_size <= 8) & (t.inter_size / t.moe_tp_size >= 128)]


def moe_compute_lines(root: Path) -> list[str]:
    """vLLM's Triton fused-MoE kernel when compute-bound (Efficiencies.moe_compute): per GPU, the newest
    vLLM table whose bf16 rows ran it, the median over rows whose FLOPs take over 3x their bytes at the
    datasheet figures of FLOPs / (latency x peak), every routing the table measured; then the median over
    the GPUs."""
    lines, medians = [], []
    for g, name in TABLE_GPUS.items():
        gpu = GPUS[name]
        for path in sorted(glob.glob(f"{root}/{g}/moe/vllm/*/moe_perf.parquet"), reverse=True):
            t = moe_rows(path)
            t = t[t.kernel_source.str.contains("triton") | (t.kernel_source == "vllm_fused_moe")]
            if t.empty:
                continue
            flops, bytes_, _ = moe_table_terms(t, gpu)
            compute = flops / gpu.bf16_flops_per_s
            bound = compute > 3 * bytes_ / gpu.hbm_bytes_per_s
            if not bound.any():
                continue
            eff = float(np.median(compute[bound] / (t.latency.to_numpy()[bound] * 1e-3)))
            medians.append(eff)
            lines.append(f"{name} fused MoE, compute-bound (aiconfigurator vllm {path.split('/')[-2]}, "
                         f"{int(bound.sum())} rows, routing {', '.join(sorted(set(t.distribution[bound])))}): "
                         f"{eff:.2f} of peak")
            break
    if medians:
        lines.append(f"fused MoE compute-bound, median of the {len(medians)} GPUs: {np.median(medians):.2f} "
                     "(Efficiencies.moe_compute)")
    return lines + moe_prior_lines(root)


def moe_fp8_lines(root: Path) -> list[str]:
    """vLLM's FP8 MoE kernels (W8A8: Triton's fused_moe, FlashInfer's CUTLASS and TensorRT-LLM kernels, as
    each table's vLLM picked them) on the GPUs with FP8 tensor cores, one family per (GPU, scale format,
    kernel) of the newest vLLM table: the share of DRAM its decode-sized rows read their FP8 weights at
    (memory over 3x compute, weights >= 50 MB a rank) against the same table's bf16 MoE, and its share of
    the FP8 peak where compute-bound (FLOPs over 3x bytes). A family whose decode reads at under half the
    bf16 kernel's rate is a slow path, listed but left out of the median (`Efficiencies.moe_fp8_compute`).
    Then the prior's FP8 experts (`moe_fp8_compute` of the FP8 peak, the weights read at `moe_fp8_memory` of
    DRAM) against every kept family: median error by tokens."""
    from costmodels.roofline import Efficiencies
    e, lines, fractions, decode_errors = Efficiencies(), [], [], []
    for g, name in TABLE_GPUS.items():
        gpu = GPUS[name]
        paths = sorted(glob.glob(f"{root}/{g}/moe/vllm/*/moe_perf.parquet"))
        if not paths or not gpu.fp8_flops_per_s:
            continue
        t = pd.read_parquet(paths[-1])
        t = t[(t.moe_tp_size * t.moe_ep_size <= 8) & (t.inter_size / t.moe_tp_size >= 128)]
        version, bw, peak = paths[-1].split("/")[-2], gpu.hbm_bytes_per_s, gpu.peak_flops_per_s("fp8")

        def decode_share(rows, wb):
            flops, bytes_, _ = moe_table_terms(rows, gpu, wb)
            weights = bytes_ - moe_table_terms(rows, gpu, 0.0)[1]
            sel = (bytes_ / bw > 3 * flops / peak) & (weights >= 50e6)
            return float(np.median(bytes_[sel] / bw / (rows.latency.to_numpy()[sel] * 1e-3))) if sel.any() else None

        bf16 = decode_share(t[t.moe_dtype == "bfloat16"], 2.0)
        for (fmt, kernel), rows in t[t.moe_dtype.isin(["fp8", "fp8_block"])].groupby(["moe_dtype", "kernel_source"]):
            flops, bytes_, n = moe_table_terms(rows, gpu, 1.0)
            compute, y = flops / peak, rows.latency.to_numpy() * 1e-3
            bound = compute > 3 * bytes_ / bw
            share = decode_share(rows, 1.0)
            if share is None or bound.sum() < 20:
                continue
            frac = float(np.median(compute[bound] / y[bound]))
            slow = bf16 is not None and share < 0.5 * bf16
            text = (f"{name} FP8 MoE {fmt} {kernel} (aiconfigurator vllm {version}): decode {share:.2f} of DRAM "
                    f"(bf16 MoE {bf16:.2f}), compute-bound {frac:.2f} of the FP8 peak ({int(bound.sum())} rows)")
            if slow:
                lines.append(text + "; a slow path, left out")
                continue
            fractions.append(frac)
            p, keep = e.gemm_ridge_exponent, n >= 16
            prior = ((compute / e.moe_fp8_compute) ** p + (bytes_ / (bw * e.moe_fp8_memory)) ** p) ** (1 / p) \
                + 2 * e.kernel_launch_s
            err = [round(np.median(y[keep & s] / prior[keep & s]) - 1, 2) + 0.0   # + 0.0: no "-0%"
                   for s in (n <= 256, (n > 256) & (n < 2048), n >= 2048)]
            decode_errors.append(err[0])
            lines.append(text + "; table over the prior at 16-256 / 257-2,047 / 2,048+ tokens "
                         + " / ".join(f"{x:+.0%}" for x in err))
    if fractions:
        lines.append(f"FP8 MoE compute-bound, median of the {len(fractions)} families: {np.median(fractions):.2f} of "
                     f"the FP8 peak (Efficiencies.moe_fp8_compute); at 16-256 tokens the tables run "
                     f"{round(np.median(decode_errors), 2) + 0.0:+.0%} over the prior (median; weights at moe_fp8_memory "
                     f"{e.moe_fp8_memory:.2f} of DRAM)")
    return lines


def moe_prior_lines(root: Path) -> list[str]:
    """The prior's routed-experts term (one rank, the ridge between compute and memory) against each GPU's
    newest vLLM bf16 MoE table, whatever kernel it ran, with the compute side at the dense GEMM's efficiency
    and at moe_compute: median error by tokens."""
    from costmodels.roofline import Efficiencies
    e, lines = Efficiencies(), []
    for g, name in {**TABLE_GPUS, "gb200": "gb200"}.items():
        paths = sorted(glob.glob(f"{root}/{g}/moe/vllm/*/moe_perf.parquet"))
        if not paths:
            continue
        gpu, t = GPUS[name], moe_rows(paths[-1])
        t = t[t.num_tokens >= 16]
        flops, bytes_, n = moe_table_terms(t, gpu)
        memory = bytes_ / (gpu.hbm_bytes_per_s * e.gemm_memory)
        y, p = t.latency.to_numpy() * 1e-3, e.gemm_ridge_exponent
        parts = []
        for label, eff in ((f"dense {e.gemm_compute:.2f}", e.gemm_compute), (f"moe_compute {e.moe_compute:.2f}", e.moe_compute)):
            prior = ((flops / (gpu.bf16_flops_per_s * eff)) ** p + memory ** p) ** (1 / p) + 2 * e.kernel_launch_s
            err = [np.median(y[sel] / prior[sel]) - 1 for sel in (n <= 256, (n > 256) & (n < 2048), n >= 2048)]
            parts.append(f"{label}: {err[0]:+.0%} / {err[1]:+.0%} / {err[2]:+.0%}")
        lines.append(f"{name} MoE table (vllm {paths[-1].split('/')[-2]}, {len(t)} rows) over the prior at 16-256 / "
                     f"257-2,047 / 2,048+ tokens, {'; '.join(parts)}")
    return lines


def mixed_excess(att: pd.DataFrame) -> pd.DataFrame:
    """The profiler's mixed prefill+decode attention rows (no cached prefill) with `excess_s`: the mixed
    kernel less the decode-only kernel of its decodes and the prefill-only kernel of its chunk."""
    a = att[att.kv_prefill == 0]
    dec = a[a.prefill_chunk == 0].set_index(["n_decode", "kv_decode"]).time_us
    pre = a[a.n_decode == 0].set_index("prefill_chunk").time_us
    m = a[(a.prefill_chunk > 0) & (a.n_decode > 0)].copy()
    m["excess_s"] = 1e-6 * (m.time_us - np.array([dec.get((n, k), np.nan) for n, k in zip(m.n_decode, m.kv_decode)])
                            - np.array([pre.get(c, np.nan) for c in m.prefill_chunk]))
    return m.dropna(subset=["excess_s"])


def empty_ctas_per_sm(m: pd.DataFrame, gpu) -> np.ndarray:
    """Llama-3.1-8B (32 query heads): the empty CTAs a mixed row's FlashAttention 2 grid holds per SM
    (costmodels/attention_kernel.py `empty_query_tiles`: every decode gets the chunk's query tiles)."""
    from costmodels.attention_kernel import empty_query_tiles
    return np.array([32 * empty_query_tiles([int(c)], int(n), 64) / gpu.sm_count
                     for c, n in zip(m.prefill_chunk, m.n_decode)], dtype=float)


def empty_query_tile_seconds(att: pd.DataFrame, gpu) -> tuple[float, int]:
    """(seconds per empty CTA and SM, rows): least squares of the mixed rows' excess over the same decodes'
    excess beside a 16-token chunk, against their empty CTAs per SM, at decode contexts of 16-64 (no KV to
    speak of moves: the excess is the grid's) and 8+ decodes (Efficiencies.empty_query_tile_s)."""
    m = mixed_excess(att)
    m = m[(m.kv_decode <= 64) & (m.n_decode >= 8)]
    base = m[m.prefill_chunk == 16].set_index(["n_decode", "kv_decode"]).excess_s
    extra = m.excess_s.to_numpy() - np.array([base.get((n, k), np.nan) for n, k in zip(m.n_decode, m.kv_decode)])
    x = empty_ctas_per_sm(m, gpu)
    keep = (x > 0) & np.isfinite(extra)
    return float((extra[keep] * x[keep]).sum() / (x[keep] ** 2).sum()), int(keep.sum())


def mixed_kernel_errors(att: pd.DataFrame, name: str, eff=None) -> np.ndarray:
    """The mixed rows with 8+ decodes priced as the measured decode-only and prefill-only kernels plus the
    prior's excess for one layer (`_varlen_excess_s`, with `eff`'s constants): priced / measured - 1."""
    from costmodels.catalog import get_model
    from costmodels.roofline import Efficiencies, RooflineCostModel
    model = get_model("llama-3.1-8b")
    cm = RooflineCostModel(model, GPUS[name], 1, "bf16", eff=eff or Efficiencies())
    a = att[att.kv_prefill == 0]
    dec = a[a.prefill_chunk == 0].set_index(["n_decode", "kv_decode"]).time_us
    pre = a[a.n_decode == 0].set_index("prefill_chunk").time_us
    m = mixed_excess(att)
    m = m[m.n_decode >= 8]
    priced = [dec[(n, k)] + pre[c] + 1e6 * cm._varlen_excess_s([(c, 0)], n, float(n * k)) / model.num_layers
              for c, n, k in zip(m.prefill_chunk, m.n_decode, m.kv_decode)]
    return np.asarray(priced) / m.time_us.to_numpy() - 1


def mixed_reread_speeds(att: pd.DataFrame, gpu) -> np.ndarray:
    """Llama-3.1-8B (32 query heads over 8 KV heads): the rate, as a multiple of attention_memory x HBM, at
    which a mixed step's 3 re-reads of each KV head's decode slice ran, over the rows with 8+ decodes at
    context 256+ whose slice (one KV head's K and V) fits in L2 (costmodels/attention_kernel.py), after the
    grid's empty query tiles (Efficiencies.empty_query_tile_s)."""
    from costmodels.roofline import Efficiencies
    e = Efficiencies()
    m = mixed_excess(att)
    kv_bytes = m.n_decode * m.kv_decode * 2 * 8 * 128 * 2.0   # one layer's decode KV
    rereads_s = m.excess_s - empty_ctas_per_sm(m, gpu) * e.empty_query_tile_s
    keep = (kv_bytes / 8 <= gpu.l2_bytes) & (m.n_decode >= 8) & (m.kv_decode >= 256) & (rereads_s > 0)
    return (3 * kv_bytes[keep] / rereads_s[keep] / (gpu.hbm_bytes_per_s * e.attention_memory)).to_numpy()


def ridge_line(name: str, source: str, m, n, k, latency_s) -> str:
    """bf16 GEMMs within 0.5-2x of the ridge (the prior's compute time, peak x gemm_compute, against its
    memory time, HBM x gemm_memory): the median of measured / max(), and the exponent p of (compute^p +
    memory^p)^(1/p) + gemm_fixed_s that zeroes the median log error there (Efficiencies.gemm_ridge_exponent)."""
    from costmodels.roofline import Efficiencies
    e, g = Efficiencies(), GPUS[name]
    m, n, k, y = (np.asarray(v, dtype=float) for v in (m, n, k, latency_s))
    tc = 2 * m * n * k / (g.bf16_flops_per_s * e.gemm_compute_on(g))
    tm = 2 * (n * k + m * k + m * n) / (g.hbm_bytes_per_s * e.gemm_memory)
    near = (tc / tm > 0.5) & (tc / tm < 2)
    ps = np.linspace(1.0, 12.0, 221)
    med = [np.median(np.log(((tc[near] ** p + tm[near] ** p) ** (1 / p) + e.gemm_fixed_s) / y[near])) for p in ps]
    ratio = np.median(y[near] / (np.maximum(tc[near], tm[near]) + e.gemm_fixed_s))
    return (f"{name} GEMMs near the ridge ({source}, {int(near.sum())} rows): {ratio:.2f}x max(); "
            f"exponent {ps[int(np.argmin(np.abs(med)))]:.2f}")


def profiler(shared: Path) -> list[float]:
    """Prints the fits to vLLM 0.19's per-layer timings; returns each GPU's smallest streaming kernel, in us."""
    base = shared / "real-runs" / "llmservingsim" / "profiler_perf"
    speeds, empties, smallest = [], [], []
    for g, name in PROFILER_GPUS.items():
        d = base / f"{g}_Llama-3.1-8B_bf16" / "tp1"
        if not d.is_dir():
            continue
        bw = GPUS[name].hbm_bytes_per_s
        dense = pd.read_csv(d / "dense.csv")
        s = dense[dense.layer.isin(LLAMA31_8B) & (dense.tokens <= 64)]
        b = np.array([LLAMA31_8B[l][0] * LLAMA31_8B[l][1] * 2 + t * sum(LLAMA31_8B[l]) * 2
                      for l, t in zip(s.layer, s.tokens)], dtype=float)
        print(line(f"{name} decode GEMM (vLLM 0.19 eager, Llama-3.1-8B, {len(s)} rows)", fit(b, s.time_us.to_numpy() * 1e-6, bw)))
        s = dense[dense.layer.isin(LLAMA31_8B)]
        print(ridge_line(name, "vLLM 0.19 eager, Llama-3.1-8B", s.tokens, [LLAMA31_8B[l][0] for l in s.layer],
                         [LLAMA31_8B[l][1] for l in s.layer], s.time_us * 1e-6))
        big = s[s.tokens == 2048]
        if len(big):   # compute-bound: the share of the datasheet 16-bit peak (Efficiencies.gemm_compute)
            share = np.median([2.0 * 2048 * LLAMA31_8B[l][0] * LLAMA31_8B[l][1] / (t * 1e-6 * GPUS[name].bf16_flops_per_s)
                               for l, t in zip(big.layer, big.time_us)])
            print(f"{name} bf16 GEMM compute-bound at 2,048 tokens (vLLM 0.19 eager, Llama-3.1-8B, {len(big)} "
                  f"GEMMs): {share:.2f} of the datasheet peak; catalog gemm_compute {GPUS[name].gemm_compute}")
        a = pd.read_csv(d / "attention.csv")
        a = a[(a.prefill_chunk == 0) & (a.n_decode > 0)]
        b = (a.n_decode * a.kv_decode * 2 * 8 * 128 * 2.0).to_numpy()
        keep = b >= 4e6
        print(line(f"{name} decode attention (vLLM 0.19 eager, {keep.sum()} rows)",
                   fit(b[keep], a.time_us.to_numpy()[keep] * 1e-6, bw)))
        act = dense[(dense.layer == "act_fn") & (dense.tokens == 2048)]
        if len(act):   # silu_and_mul: reads gate and up, writes their product
            moved = 2048 * 3 * 14336 * 2.0
            print(f"{name} silu_and_mul at 2,048 tokens: {moved / (act.time_us.iloc[0] * 1e-6) / bw:.2f} of datasheet")
        small = small_kernel_profiler_us(dense)
        if small is not None:
            smallest.append(small)
            print(small_kernel_line(f"{name} (vLLM 0.19 eager, fused elementwise kernels at 1 token)", small))
        norm = dense[(dense.layer == "layernorm") & (dense.tokens == 2048)]
        if len(norm):   # fused residual add + RMSNorm: reads x and the residual, writes both
            moved = 2048 * 4 * 4096 * 2.0
            print(f"{name} fused add+RMSNorm at 2,048 tokens ({moved / 1e6:.0f} MB): "
                  f"{moved / (norm.time_us.iloc[0] * 1e-6) / bw:.2f} of datasheet")
        att = pd.read_csv(d / "attention.csv")
        per_cta, n = empty_query_tile_seconds(att, GPUS[name])
        empties.append(per_cta)
        print(f"{name} empty query tiles of FlashAttention 2's varlen grid ({n} rows): {per_cta * 1e6:.3f} us a "
              "CTA per SM")
        v = mixed_reread_speeds(att, GPUS[name])
        speeds.append(v)
        print(f"{name} mixed-step KV re-reads from L2 ({len(v)} rows): median {np.median(v):.1f}x attention_memory x HBM")
        from costmodels.roofline import Efficiencies
        for label, eff in (("the prior", None), ("re-reads alone, before the grid's empty tiles",
                                                 Efficiencies(empty_query_tile_s=0.0, mixed_reread_l2_speedup=4.7))):
            err = mixed_kernel_errors(att, name, eff)
            print(f"  {name} mixed-step attention kernel, 8+ decodes ({len(err)} rows), {label}: median |err| "
                  f"{np.median(np.abs(err)):.1%} (median {np.median(err):+.1%}, p90 |err| {np.percentile(np.abs(err), 90):.1%})")
    if empties:
        print(f"empty query tiles, both GPUs: median {np.median(empties) * 1e6:.2f} us a CTA per SM "
              "(Efficiencies.empty_query_tile_s)")
    if speeds:
        v = np.concatenate(speeds)
        print(f"mixed-step KV re-reads from L2, both GPUs ({len(v)} rows): median {np.median(v):.1f}x "
              "(Efficiencies.mixed_reread_l2_speedup)")
    return smallest


PRIOR_BEFORE = dict(gemm_memory=0.75, gemm_fixed_s=2e-6, attention_memory=0.70, decode_attention_fixed_s=2e-6,
                    elementwise_memory=0.60, l2_speedup=1.0, attention_tiles=())   # the constants this prior replaced


def op_comparison(shared: Path) -> str:
    """The roofline's per-op terms (the replaced constants and the current ones) against vLLM 0.19's own
    per-layer timings, op by op, as Markdown tables."""
    from costmodels.catalog import get_gpu, get_model
    from costmodels.profile import gemm_shapes
    from costmodels.roofline import Efficiencies, RooflineCostModel
    from experiments.report import md_table
    model = get_model("llama-3.1-8b")
    shp = gemm_shapes(model, 1)
    ops = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}
    out = []
    for g, name in PROFILER_GPUS.items():
        base = shared / "real-runs" / "llmservingsim" / "profiler_perf" / f"{g}_Llama-3.1-8B_bf16" / "tp1"
        if not base.is_dir():
            continue
        dense, att = pd.read_csv(base / "dense.csv"), pd.read_csv(base / "attention.csv")
        priors = {p: RooflineCostModel(model, get_gpu(name), 1, "bf16", eff=e)
                  for p, e in (("before", Efficiencies(**PRIOR_BEFORE)), ("after", Efficiencies()))}
        rows = []

        def add(op, x, measured_us, priced):
            row = {"op": op, "tokens / batch": x, "measured us": round(float(measured_us), 1)}
            for p, m in priors.items():
                v = priced(m) * 1e6
                row[f"{p} us"], row[f"{p} err"] = round(v, 1), f"{v / measured_us - 1:+.0%}"
            rows.append(row)
        for layer, op in ops.items():
            for t in (1, 64, 512, 2048):
                meas = dense[(dense.layer == layer) & (dense.tokens == t)].time_us.iloc[0]
                add(layer, t, meas, lambda m, t=t, op=op: m._gemm_s(t, *shp[op]))
        for nd, kv in ((16, 1024), (64, 1024), (128, 2048), (256, 2048)):
            meas = att[(att.prefill_chunk == 0) & (att.n_decode == nd) & (att.kv_decode == kv)].time_us.iloc[0]
            add(f"decode attention, context {kv}", nd, meas,
                lambda m, nd=nd, kv=kv: m._decode_attention_s(float(nd * kv), nd) / model.num_layers)
        for chunk, cached in ((64, 0), (512, 0), (2048, 0), (16, 4096), (512, 4096), (2048, 16384)):
            meas = att[(att.n_decode == 0) & (att.prefill_chunk == chunk) & (att.kv_prefill == cached)].time_us.iloc[0]
            add(f"prefill attention, {cached} cached", chunk, meas,
                lambda m, chunk=chunk, cached=cached: m._prefill_attention_s([(chunk, cached)]))
        for t in (64, 512, 2048):   # a layer has two norms, one rotary, one SiLU*mul
            one = lambda layer, t=t: dense[(dense.layer == layer) & (dense.tokens == t)].time_us.iloc[0]  # noqa: E731
            add("elementwise (2 norms, rotary, silu_mul)", t, 2 * one("layernorm") + one("rotary_emb") + one("act_fn"),
                lambda m, t=t: m._elementwise_s(t, model.intermediate_size))
        excess = mixed_excess(att)
        for nd, kv, chunk in ((8, 1024, 16), (32, 1024, 16), (128, 256, 16), (128, 1024, 16), (128, 4096, 16),
                              (64, 256, 2048), (64, 1024, 2048)):
            meas = excess[(excess.n_decode == nd) & (excess.kv_decode == kv) & (excess.prefill_chunk == chunk)]
            if len(meas):   # the prior before this term priced none of it
                add(f"mixed-step attention excess, context {kv}, {chunk:,}-token chunk", nd, meas.excess_s.iloc[0] * 1e6,
                    lambda m, nd=nd, kv=kv, chunk=chunk: (
                        m._varlen_excess_s([(chunk, 0)], nd, float(nd * kv)) / model.num_layers
                        if m.eff != priors["before"].eff else 0.0))
        out.append(f"### {name}: vLLM 0.19.0, Llama-3.1-8B, one layer (eager-mode timings, launch included)\n\n"
                   + md_table(pd.DataFrame(rows)))
    return "\n\n".join(out)


def aic_prefill_lines(shared: Path) -> list[str]:
    """The `[aic]` model's prefill attention against vLLM 0.19's own prefill chunks after 0-16,384 cached
    tokens (LLMServingSim profiler) on each GPU that has NVIDIA's tables: the table at the chunk's
    fresh-prompt equivalent alone, and as the model prices it (with the tile model's extra cost of a cached
    prefix, costmodels/aic.py `_prefill_attention_s`)."""
    from costmodels.aic import aic_cost_model
    from costmodels.catalog import CatalogError, get_model
    from costmodels.deployment import Deployment
    from costmodels.profile import prefill_coords
    model, out = get_model("llama-3.1-8b"), []
    for g, name in PROFILER_GPUS.items():
        path = shared / "real-runs" / "llmservingsim" / "profiler_perf" / f"{g}_Llama-3.1-8B_bf16" / "tp1" / "attention.csv"
        if not path.is_file():
            continue
        try:
            cm = aic_cost_model("aic", model, GPUS[name], Deployment(dtype="bf16"))
        except CatalogError:
            continue   # no NVIDIA table of this GPU
        att = pd.read_csv(path)
        rows = att[(att.n_decode == 0) & (att.prefill_chunk > 0)]
        grid = cm._g.get("prefill_attn_full")
        if grid is None:
            continue
        measured = rows.time_us.to_numpy() * 1e-6
        table = np.array([grid(*prefill_coords([c], [k])) for c, k in zip(rows.prefill_chunk, rows.kv_prefill)])
        priced = np.array([cm._prefill_attention_s([(int(c), int(k))]) for c, k in zip(rows.prefill_chunk, rows.kv_prefill)])
        for label, v in (("the table alone", table), ("with the tile model's prefix cost (costmodels/aic.py)", priced)):
            err = v / measured - 1
            out.append(f"{name} [aic] prefill attention against vLLM 0.19's chunks after 0-16,384 cached tokens "
                       f"({len(err)} rows), {label}: median |err| {np.median(np.abs(err)):.1%} (median "
                       f"{np.median(err):+.1%}, p90 |err| {np.percentile(np.abs(err), 90):.1%})")
    return out


def main(argv=None) -> int:
    ap = Parser(prog="python -m benchmarks.kernel_efficiency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", help="the shared data folder (default: ../shared beside the checkout)")
    ap.add_argument("--compare", action="store_true",
                    help="also print the roofline's per-op terms against vLLM 0.19's per-layer timings")
    a = ap.parse_args(argv)
    shared = shared_folder(ap, a.shared)
    from costmodels import aic
    root = aic.tables_root()
    if root is not None:
        tables(Path(root))
    else:
        print("aiconfigurator-core not installed: table fits skipped")
    for text in prefill_tile_lines(Path(root) if root is not None else None, shared):
        print(text)
    small = list(small_kernel_table_us(Path(root)).values()) if root is not None else []
    if shared is not None:
        small += profiler(shared)
    if small:
        print(f"smallest streaming kernel, median of the {len(small)} figures above: {np.median(small):.2f} us "
              "(Efficiencies.kernel_launch_s)")
    if shared is not None:
        if root is not None:
            for text in aic_prefill_lines(shared):
                print(text)
        if a.compare:
            print(op_comparison(shared))
    else:
        print("no ../shared/real-runs: profiler fits skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

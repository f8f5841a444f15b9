"""Roofline cost model: each operator of one forward pass costs the larger of its compute and memory time
at realistic efficiencies (GEMMs a little more near the ridge, where the two overlap imperfectly) plus a
fixed launch cost; the step adds CPU-side overheads.

It is the prior for GPUs and models without a measured profile (datasheet figures from
`costmodels.catalog`). Per family: dense attention (full or sliding-window layers), MLA attention
(absorbed in decode), dense MLPs, MoE layers (router, shared experts, grouped expert GEMMs over the
tokens routed to each rank's experts), TP all-reduces and EP all-to-alls. It ignores GEMM tile
quantisation, wave effects, cache reuse and compute/communication overlap; profiles capture the first three.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np

from costmodels.attention_kernel import (empty_query_tiles, fp8_kv_decode_on_chip_bound, mixed_batch_rereads_kv,
                                        prefill_compute_s, prefill_tile_shape, tile_seconds)
from costmodels.catalog import GPU, GPUS, ModelShape
from costmodels.collectives import collective_link, gpu_allreduce_link, logits_gather_s, ring_allreduce_s
from costmodels.deployment import COMPUTE_DTYPE, KV_BYTES, WEIGHT_BYTES, Deployment
from costmodels.frontend import HTTP as HTTP_FRONTEND, FrontendLatency
from costmodels import deployment as _deployment


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of datasheet peaks that kernels reach, with the measurement behind each (docs/sources.md,
    "Roofline efficiencies"; the comparison op by op: docs/fidelity/gpu/kernels.md). The prior represents
    vLLM V1 as of 0.15-0.24 on CUDA: CUDA graphs for decode, torch.compile with vLLM's fused kernels
    (fused_add_rms_norm, silu_and_mul, rotary), FlashAttention decode, custom all-reduce, async scheduling.

    A bandwidth-bound kernel is priced bytes / (bandwidth x efficiency) + a fixed time: the efficiency is
    what large transfers reach, the fixed time the kernel's ramp and tail (DRAM latency, the split-KV
    combine, the last wave), so small kernels reach a lower fraction, as measured."""
    # bf16 GEMMs where compute-bound, of the datasheet dense peak, for a GPU without a measured figure of
    # its own (`GPU.gemm_compute`, costmodels/catalog.py GEMM_FIGURES, wins where there is one): the median
    # of nine measurements, aiconfigurator's vLLM GEMM tables (m >= 2,048; H100 0.81, H200 0.79, B200 0.70,
    # GB200 0.63, A100 0.90, L40S 0.64, RTX PRO 6000 Server 0.80) and vLLM 0.19's own Llama-3.1-8B GEMMs at
    # 2,048 tokens (LLMServingSim profiler: RTX 4090 0.99, RTX PRO 6000 Server 0.75).
    gemm_compute: float = 0.79
    # vLLM's fused MoE experts (Triton `fused_moe`: its default unquantized MoE kernel through 0.22 on every
    # NVIDIA GPU, and on pre-Blackwell GPUs after) reach far less of the peak than a dense GEMM when compute-
    # bound: they sort the routed tokens by expert, pad each expert's share to the block size and run one
    # narrow GEMM per expert (intermediate widths 512-2,048). aiconfigurator's vLLM bf16 MoE tables, rows
    # whose FLOPs take over 3x their bytes at datasheet figures (tp x ep <= 8), every routing measured: median
    # 0.51 of peak on H100, 0.57 H200, 0.46 L40S (vLLM 0.24), 0.33 B200 (0.22), 0.25 A100 (0.14); the median
    # of the five (`python -m benchmarks.kernel_efficiency`). Decode-sized MoE is bound by the experts'
    # weights, where the same tables sit within about 10% of the memory side.
    moe_compute: float = 0.46
    # vLLM's FP8 MoE experts (W8A8 on GPUs with FP8 tensor cores: Triton's fused_moe for block scales on
    # Hopper and for the Ada GPUs, FlashInfer's CUTLASS under EP on Hopper and on SM120, FlashInfer's
    # TensorRT-LLM kernels on B200, vLLM's CUTLASS grouped GEMM for channel scales) reach a smaller share of
    # the FP8 peak still, as the dense FP8 GEMMs do of theirs (scaled_mm_compute): aiconfigurator's vLLM 0.24
    # FP8 MoE tables, compute-bound rows, 0.17-0.34 of the FP8 peak over nine (GPU, format, kernel) families
    # on H100, H200, B200, L40S and RTX PRO 6000 Server, median 0.30 (the bf16 kernels: 0.46). Decode-sized,
    # they read their FP8 weights at 0.54-0.83 of DRAM, 0.75-0.99 of the same tables' bf16 MoE (median 0.94);
    # the prior's routed-experts term meets their rows of 16-256 tokens (median error 0) with the weights read
    # at 0.76 of DRAM, where 0.73 (the dense FP8 GEMMs' `scaled_mm_memory`) prices them 4% slow and 0.83 (the
    # 16-bit `gemm_memory`, which meets the bf16 MoE rows) 9% fast. vLLM's CUTLASS grouped GEMM for channel
    # scales has no table; vLLM PR #19983 measured its block-scale sibling within a few percent of Triton's
    # kernel. Left out: FlashInfer's CUTLASS path for per-tensor FP8 on Hopper, which reads at 0.12-0.17 of
    # DRAM (`python -m benchmarks.kernel_efficiency`, "FP8 MoE" lines).
    moe_fp8_compute: float = 0.30
    moe_fp8_memory: float = 0.76
    # vLLM's FP8 linear (W8A8: per-tensor, per-token or 128-block scales) is CUTLASS's scaled_mm, which
    # reaches less of the FP8 peak than the 16-bit GEMMs reach of theirs. aiconfigurator's vLLM 0.24 FP8
    # tables, compute-bound rows (m 1,024-8,192, n and k >= 4,096) with the activation's quantisation
    # taken out (fused into the norm before it in a compiled model; `_elementwise_s`): 0.52 of the FP8 peak
    # on H100, 0.57 H200, 0.51 B200, 0.54 L40S, 0.79 RTX PRO 6000 Server (whose FP8 peak is an estimate);
    # 128-block scales 0.61, 0.59, 0.50, 0.38 (the same bf16 rows: 0.64-0.81 of the 16-bit peak). At decode
    # sizes (m <= 64, FP8 weights >= 4 MB) it reads its weights at 0.79 of DRAM on H100, 0.73 H200, 0.68
    # B200, 0.73 L40S, 0.91 RTX PRO 6000 Server: 0.86-0.96 of the same tables' bf16 figure. Medians of the
    # five (`python -m benchmarks.kernel_efficiency`). Where the GPU has no FP8 tensor cores (Ampere) vLLM
    # runs FP8 weights through Marlin at the 16-bit rate, priced as the 16-bit GEMMs. INT8 W8A8 runs CUTLASS's
    # int8 scaled_mm, which no table here times: it keeps the 16-bit fractions, of the INT8 peak.
    scaled_mm_compute: float = 0.54
    scaled_mm_memory: float = 0.73
    # Near the ridge a GEMM's memory and compute time overlap imperfectly (tile loads against MMA, the
    # pipeline's fill and drain), so it takes longer than the larger of the two: time = (compute^p +
    # memory^p)^(1/p). aiconfigurator's bf16 GEMM tables with compute / memory time (each GPU's own compute
    # share) between 0.5 and 2 run a median 9% (H100, vLLM 0.24, 4,874 rows), 13% (H200), 18% (B200), 13%
    # (L40S), 47% (A100) over max(); the exponent that zeroes the median there is each measured GPU's own
    # (`GPU.gemm_ridge_exponent`, costmodels/catalog.py GEMM_FIGURES: 2.85 H100 ... 1.15 A100). For a GPU
    # without one, 3: about the H100's, the most conservative of them (vLLM 0.19's own GEMMs on an RTX 4090,
    # at its own compute share: 2.45; `python -m benchmarks.kernel_efficiency`). The fused MoE kernels keep
    # 3 (their figures were measured with it).
    # At compute = memory it is 1.26x max(); at a ratio of 0.5 or 2, 1.04x.
    gemm_ridge_exponent: float = 3.0
    # Decode-shaped GEMMs (m <= 64, weights >= 4 MB), latency = fixed + bytes / (HBM x eff) fitted to
    # aiconfigurator's vLLM 0.24 tables: H100 0.86 + 3.3 us, H200 0.83 + 3.6 us, B200 0.77 + 2.9 us (A100,
    # vLLM 0.14: 0.74 + 5.1 us); vLLM 0.19's own qkv/o/gate_up/down timings (LLMServingSim profiler): RTX
    # 4090 0.92 + 5.0 us, RTX PRO 6000 Server Edition 0.93 + 3.4 us. Near the median of the six (0.84).
    gemm_memory: float = 0.83
    gemm_fixed_s: float = 3.5e-6
    # Prefill (flash) attention where compute-bound, of the 16-bit peak: aiconfigurator's vLLM context-
    # attention tables, bf16 cache, head dim 128, batch x prompt >= 8,192 tokens, prompts of 1,024 or more,
    # 8+ heads: median 0.54 on H100 and H200 (FlashAttention 3), 0.45 B200 (FlashInfer's TRT-LLM kernel),
    # 0.52 A100 (FA2, vLLM 0.14), 0.47 L40S, 0.54 RTX PRO 6000 Server (FA2); the median of the six. Over an
    # FP8 cache the same rows run no faster (0.49 and 0.48 of the 16-bit peak on H100 and H200, 0.45 B200,
    # 0.41 L40S, 0.50 RTX PRO 6000 Server), so the attention is priced at the 16-bit peak whatever the cache
    # (`python -m benchmarks.kernel_efficiency`, "prefill attention" lines).
    attention_compute: float = 0.53
    # ... and tile by tile, where the GPU's FlashAttention kernel and SM count are known
    # (costmodels/attention_kernel.py): a prefill chunk runs as query tiles of 64 (FA2) or 128 (FA3) rows,
    # each a CTA that walks the KV in tiles, one CTA per SM at a time; the FLOPs of a padded tile run at the
    # kernel's first figure times one SM's share of the 16-bit peak, and each query tile adds its second
    # figure in tiles' worth (loading its queries, the softmax's last rescale, writing its output). So a
    # short chunk after a long cached prefix, whose few query tiles leave most SMs idle while each walks the
    # whole prefix, costs what its longest tile does on FA2 (FA3 splits the walk), CTAs of equal walks take
    # whole waves, and short prompts pay their padded diagonal tiles. Least squares on log latency per
    # source, then the median per kernel: FA2, NVIDIA's vLLM context-attention tables (head dim 128, bf16
    # cache, prompts of 32+) A100 0.56 of an SM and +1.38 tiles, L40S 0.51 / +1.28, RTX PRO 6000 Server
    # 0.58 / +1.49, and vLLM 0.19's own chunks after 0-16,384 cached tokens (LLMServingSim profiler) RTX
    # 4090 0.81 / +1.58, RTX PRO 6000 Server 0.56 / +2.14; FA3, the same tables, H100 0.66 / +3.61 and H200
    # 0.65 / +3.30 (a larger tile and a deeper pipeline to fill and drain). Against the same rows the
    # medians err 5-13% (median |err|; RTX 4090 +47%: the card runs above its rated clock, as its GEMMs do)
    # where FLOPs alone at attention_compute err 20-55%, too fast (`python -m benchmarks.kernel_efficiency`,
    # "prefill attention by tiles" lines).
    attention_tiles: tuple[tuple[str, float, float], ...] = (("fa2", 0.56, 1.49), ("fa3", 0.66, 3.45))
    # Paged decode attention (FlashAttention), the same fit over batch x context: H100 0.85 + 13.5 us per
    # kernel, H200 0.81 + 14.5 us, B200 0.87 + 10.5 us (aiconfigurator vLLM 0.24 generation_attention;
    # A100, vLLM 0.14: 0.70 + 20.7 us); vLLM 0.19 on an RTX 4090 0.89 + 15.0 us, RTX PRO 6000 Server
    # Edition 0.90 + 14.5 us (LLMServingSim profiler, attention.csv, decode only). Median of the six: 0.86.
    attention_memory: float = 0.85
    decode_attention_fixed_s: float = 14e-6   # per layer's kernel
    # FlashAttention 3's decode over an FP8 cache (Hopper) streams the cache at an on-chip rate, not DRAM's:
    # the same tables, rows with 512 MB of KV or more, 2.32 TB/s on an H100 (0.69 of DRAM) and 2.38 on an
    # H200 (0.50), the same on 43% more bandwidth (bf16 caches: 0.87 and 0.82 of DRAM). The rate goes with
    # the SMs (the conversions and descaling of the FP8 path), so it is a share of the 16-bit tensor peak:
    # 2.34e-3 and 2.41e-3 bytes a peak FLOP (`python -m benchmarks.kernel_efficiency`).
    fp8_kv_decode_bytes_per_flop: float = 2.4e-3
    # RMSNorm (+ residual add), rotary, SiLU*mul: vLLM's fused CUDA kernels stream their tensors once. vLLM
    # 0.19's silu_and_mul at 2,048 tokens moves 1.03x (RTX 4090) and 1.17x (RTX PRO 6000 Server) of the DRAM
    # datasheet bandwidth (part of it from L2), RMSNorm more; 0.9 leaves room for GPUs with smaller L2.
    elementwise_memory: float = 0.90
    # Fused RMSNorm at 2,048 tokens (67 MB, inside L2) moves 2.35x (RTX 4090, 72 MB L2) and 2.67x (RTX PRO
    # 6000 Server, 128 MB L2) of the DRAM datasheet bandwidth (vLLM 0.19 per-layer timings, LLMServingSim).
    l2_speedup: float = 2.4
    # A mixed prefill+decode step on FlashAttention 2 reads each KV head's slice of the decodes' cache once
    # per query head sharing it (costmodels/attention_kernel.py); the re-reads of a slice that fits in L2
    # come from L2 at this multiple of the DRAM figure (attention_memory x HBM). vLLM 0.19's mixed attention
    # rows (LLMServingSim profiler, 786 rows with 8+ decodes at context 256+ whose slice fits in L2, kernel
    # minus the decode-only and prefill-only kernels and the grid's empty tiles, below): median 5.7 (RTX 4090
    # 3.8, RTX PRO 6000 Server 7.1).
    mixed_reread_l2_speedup: float = 5.7
    # FlashAttention 2's varlen kernel launches max(query length) / 64 query tiles for every sequence and head
    # of the step (`num_m_block` from `max_seqlen_q`), and a tile past its sequence's queries exits at once:
    # beside a long chunk every decode (and every shorter chunk) adds such empty CTAs, each holding an SM for
    # its launch and exit. vLLM 0.19's mixed attention rows (LLMServingSim profiler, decode context 16-64 and
    # 8+ decodes, where no KV moves: the excess over the 16-token chunk's against empty CTAs / SMs), least
    # squares: 0.354 us a CTA on the RTX 4090, 0.351 us on the RTX PRO 6000 Server
    # (`python -m benchmarks.kernel_efficiency`, "empty query tiles").
    empty_query_tile_s: float = 0.35e-6
    # The TP all-reduce, EP's collectives and PP's sends: costmodels/collectives.py, by interconnect and size.
    # What a kernel that moves almost nothing takes (its launch, ramp and drain): the fixed time of a fused
    # elementwise kernel, of prefill attention and of the fused MoE kernels. NVIDIA's vLLM 0.24 tables of
    # vLLM's static FP8 quantisation kernel, rows moving 64 kB or less: median 2.03 us on H100, 1.94 H200,
    # 2.17 B200, 1.60 L40S, 1.74 RTX PRO 6000 Server; vLLM 0.19's fused add+RMSNorm, final norm, SiLU*mul
    # and rotary at one token (LLMServingSim profiler): 2.06 us RTX 4090, 2.55 RTX PRO 6000 Server. Median
    # of the seven, 2.03 (`python -m benchmarks.kernel_efficiency`, "smallest streaming kernel" lines).
    kernel_launch_s: float = 2.0e-6
    # CPU time real engines add (scheduling, input prep, sampling bookkeeping, detokenisation):
    per_step_s: float = 4.0e-4
    per_request_s: float = 6.0e-6        # per sequence in the batch
    # vLLM V1's async scheduling prepares step n+1 on the CPU (schedule, input tensors) while the GPU runs
    # step n, so the CPU time above hides behind the GPU's: a step takes max(GPU, CPU), not their sum. It
    # is on by default on CUDA in vLLM 0.32 (vllm/config/vllm.py) and off on its CPU platform
    # (vllm/platforms/cpu.py); False prices a synchronous engine (vLLM V0, async_scheduling=False).
    async_scheduling: bool = True
    # Time per request outside the engine's steps, in the serving front end (costmodels/frontend.py): a
    # fixed part and a part per prompt token (tokenisation), added to TTFT and E2E, not to TPOT or ITL.
    # The default is vLLM's OpenAI-compatible HTTP server (`vllm serve`, as `vllm bench serve` clients
    # reach it), measured on vLLM 0.32's CPU build; `frontend.IN_PROCESS` is AsyncLLM without a server.
    # Sweep files override it under `engine.frontend`; fidelity.fit_engine fits its own.
    frontend: FrontendLatency = HTTP_FRONTEND

    def gemm_compute_on(self, gpu: GPU) -> float:
        """The dense GEMMs' compute share on `gpu`: its own measured figure, else the pooled one."""
        return gpu.gemm_compute if gpu.gemm_compute is not None else self.gemm_compute

    def gemm_ridge_exponent_on(self, gpu: GPU) -> float:
        """The dense GEMMs' ridge exponent on `gpu`: its own measured figure, else the pooled one."""
        return gpu.gemm_ridge_exponent if gpu.gemm_ridge_exponent is not None else self.gemm_ridge_exponent


class RooflineCostModel:
    """`step_time_s(prefill=[(new, cached), ...], decode=[context, ...])` for one replica of `model` on
    `tp` GPUs of kind `gpu` (or as `deployment` lays it out: precision, TP, PP, DP, EP). Seconds.

    A step is `sum over layers (attention GEMMs + attention + MLP or MoE (router, shared experts, routed
    experts) + elementwise + all-reduce + all-to-all) + embedding + LM head and sampling`, the GPU's (a step
    mixing prefill chunks with decodes, or chunks of unequal length, adds what one varlen kernel over them
    costs on FlashAttention 2 GPUs: the decodes' KV re-reads and the grid's empty query tiles,
    `mixed_attention`: costmodels/attention_kernel.py), and
    `per_step_s + per_request_s x sequences`, the CPU's; with async scheduling (vLLM V1's default on CUDA)
    the step takes the larger of the two, else their sum. `step_terms_s` returns each term (the overlap as
    a negative `async_overlap`). Each request also pays `eff.frontend` (its front end) outside the steps.

    Pipeline parallelism: `step_time_s` is one batch through every stage back to back, plus one activation
    send between consecutive stages; `stage_times_s` prices each stage on its own, for the pipelined
    engine (simcore/pipeline.py), which overlaps the stages of successive batches as vLLM does."""

    def __init__(self, model: ModelShape, gpu: GPU, tp: int = 1, dtype: str = "bf16",
                 eff: Efficiencies = Efficiencies(), deployment: Deployment | None = None):
        d = deployment or Deployment(dtype=dtype, tensor_parallel_size=tp)
        self.model, self.gpu, self.tp, self.dtype, self.eff, self.deployment = model, gpu, d.tp, d.dtype, eff, d
        m, tp = model, d.tp
        self.dt = d.activation_bytes()
        self.kv_dt = KV_BYTES[d.kv_format()]
        fmt = d.weight_format(model)
        self.wb = WEIGHT_BYTES[fmt]
        self.quantized_attention = fmt != "mxfp4"   # gpt-oss keeps its attention's weights in bf16
        self.peak_flops = gpu.peak_flops_per_s(COMPUTE_DTYPE[fmt])
        # (weight bytes, peak, compute and memory efficiency) of a GEMM whose weights are in the deployment's
        # format, and of one in the activations' 16-bit dtype (the router, the LM head)
        self.scaled_mm = COMPUTE_DTYPE[fmt] == "fp8" and bool(gpu.fp8_flops_per_s)
        self._gemm_compute, self._gemm_ridge_p = eff.gemm_compute_on(gpu), eff.gemm_ridge_exponent_on(gpu)
        self._gemm_kinds = {
            True: (self.wb, self.peak_flops, eff.scaled_mm_compute if self.scaled_mm else self._gemm_compute,
                   eff.scaled_mm_memory if self.scaled_mm else eff.gemm_memory),
            False: (self.dt, gpu.peak_flops_per_s("bf16"), self._gemm_compute, eff.gemm_memory)}
        # the attention runs at the 16-bit rate whatever the weights' and the cache's format (attention_compute)
        self.attention_peak_flops = gpu.peak_flops_per_s("bf16")
        self.heads = m.num_heads // tp
        h = m.hidden_size
        if m.is_mla:
            qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
            self.q_dim, self.kv_dim = self.heads * qk, m.kv_width(tp)
            q = ([(m.q_lora_rank, h), (self.heads * qk, m.q_lora_rank)] if m.q_lora_rank else [(self.heads * qk, h)])
            self.attn_gemms = q + [(m.kv_width(tp), h), (self.heads * (m.qk_nope_head_dim + v), m.kv_lora_rank),
                                   (h, self.heads * v)]
        else:
            self.q_dim, self.kv_dim = self.heads * m.head_dim, m.kv_width(tp)
            self.attn_gemms = [(self.q_dim + self.kv_dim, h), (h, self.q_dim)]
        mlp_in = (2 if m.gated_mlp else 1) * m.intermediate_size // tp
        self.mlp_gemms = [(mlp_in, h), (h, m.intermediate_size // tp)]
        self.shared_gemms = ([(2 * m.shared_expert_intermediate_size // tp, h),
                              (h, m.shared_expert_intermediate_size // tp)] if m.shared_expert_intermediate_size else [])
        self.layer_gemms = self.attn_gemms + self.mlp_gemms   # (N, K) of a dense layer's GEMMs on one GPU
        e = eff
        self._by_tokens: dict[int, tuple[float, float, float, float]] = {}
        self._heads: dict[int, float] = {}
        self._stage_memo: dict[int, tuple[float, float, float]] = {}   # stage_times_s, by token count
        if m.is_mla:   # absorbed MLA decode: scores over the latent + rope, values in the latent space
            flops_per_ctx = 2.0 * self.heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        else:          # QK^T and PV: 4 * head_dim * heads FLOP per context token
            flops_per_ctx = 4.0 * m.head_dim * self.heads
        kv_rate = gpu.hbm_bytes_per_s * e.attention_memory
        if fp8_kv_decode_on_chip_bound(gpu, d.kv_format()):
            kv_rate = min(kv_rate, gpu.bf16_flops_per_s * e.fp8_kv_decode_bytes_per_flop)
        self._decode_attention_consts = (flops_per_ctx, self.attention_peak_flops * e.attention_compute,
                                         kv_rate, e.decode_attention_fixed_s)
        self.num_sliding = m.num_sliding_layers if m.sliding_window else 0
        # FlashAttention's prefill tiles on this GPU (None: priced by FLOPs; MLA runs other kernels)
        tiles = None if m.is_mla else prefill_tile_shape(gpu, m.head_dim, d.kv_format())
        rates = {kernel: (rate, overhead) for kernel, rate, overhead in e.attention_tiles}
        self._prefill_tile = tiles if tiles is not None and tiles.kernel in rates else None
        if self._prefill_tile:
            rate, self._tile_overhead = rates[tiles.kernel]
            self._tile_s = tile_seconds(tiles, m.head_dim, self.attention_peak_flops * rate / gpu.sm_count)
        # FlashAttention 2's varlen grid: the query heads' empty tiles beside a longer chunk, per CTA over the SMs
        self._empty_tile_s = (e.empty_query_tile_s * self.heads / gpu.sm_count
                              if self._prefill_tile and self._prefill_tile.kernel == "fa2" else 0.0)
        # what the TP all-reduce, the EP all-to-all and the PP sends cross (costmodels/collectives.py)
        self.tp_link = gpu_allreduce_link(gpu, tp)
        self.p2p_link = collective_link(gpu.interconnect_kind, 2)   # one GPU to one other
        self.ep_link = collective_link(gpu.interconnect_kind, max(2, d.data_parallel_size))
        # query heads per KV head whose decode rows re-read the KV in a mixed step (costmodels/attention_kernel.py)
        kv_heads = self.kv_dim / (2 * m.head_dim) if not m.is_mla else 0   # kv_dim holds K and V
        self._kv_heads = kv_heads
        self._mixed_rereads = (self.heads / kv_heads - 1.0
                               if kv_heads and self.heads > kv_heads and mixed_batch_rereads_kv(gpu, d.kv_format()) else 0.0)

    def describe(self) -> dict:
        d = self.deployment
        return {"kind": "roofline", "source": "datasheet roofline prior (no measured profile)",
                "represents": "vLLM V1 0.15-0.24 on CUDA (CUDA graphs, torch.compile, async scheduling)",
                "gpu": self.gpu.name, "model": self.model.name, "family": self.model.family, "tp": self.tp,
                # the catalog's GPU as the catalog has it: what the real-run checks were run on (basis.py)
                "gpu_as_catalog": GPUS.get(self.gpu.name) == self.gpu,
                "dtype": self.dtype, "weights": d.weight_format(self.model), "kv_cache_dtype": d.kv_format(),
                "pp": d.pipeline_parallel_size, "dp": d.data_parallel_size, "ep": d.ep,
                "expert_load_imbalance": d.expert_load_imbalance,
                # what the TP all-reduce crosses and its price (costmodels/collectives.py)
                "tp_link": {"kind": self.gpu.interconnect_kind, "efficiency": self.tp_link.efficiency,
                            "latency_s": self.tp_link.latency_s},
                **{f"eff_{k}": v for k, v in asdict(self.eff).items()},
                # the GPU's own figures where it has them (costmodels/catalog.py GEMM_FIGURES)
                "eff_gemm_compute": self._gemm_compute, "eff_gemm_ridge_exponent": self._gemm_ridge_p,
                "prefill_attention": (f"{self._prefill_tile.kernel} tiles of {self._prefill_tile.block_m} x "
                                      f"{self._prefill_tile.block_n} on {self.gpu.sm_count} SMs"
                                      if self._prefill_tile else "by FLOPs (no FlashAttention tiles known here)")}

    def gemm_sides_s(self, m: float, n: int, k: int, quantized: bool = True) -> tuple[float, float]:
        """(compute seconds, memory seconds) of one linear layer over `m` tokens, weights [n, k]: in the
        deployment's weight format (`quantized`), or in the activations' 16-bit dtype (the router, the LM
        head)."""
        wb, peak, compute_eff, memory_eff = self._gemm_kinds[quantized]
        bytes_ = (m * k + m * n) * self.dt + k * n * wb   # activations + weights
        return 2.0 * m * n * k / (peak * compute_eff), bytes_ / (self.gpu.hbm_bytes_per_s * memory_eff)

    def _gemm_s(self, m: float, n: int, k: int, quantized: bool = True) -> float:
        e = self.eff
        return _ridge(*self.gemm_sides_s(m, n, k, quantized), self._gemm_ridge_p) + e.gemm_fixed_s

    def _prefill_attention_s(self, prefill: Sequence[tuple[int, int]], window: int | None = None) -> float:
        """Varlen flash attention, causal over the new tokens, full over the cached ones (at most `window`
        keys per query on sliding-window layers, counted exactly: `_window_pairs`), its compute tile by tile
        where the GPU's FlashAttention kernel is known (costmodels/attention_kernel.py), else by FLOPs. MLA
        prefill runs it on the up-projected K/V (head dim nope + rope, value dim v) after decompressing the
        cached latent. The sums are of integers and half-integers, exact in float64 in any order."""
        m, e, dt = self.model, self.eff, self.dt
        kv_tokens = float(sum(c + n for n, c in prefill))
        if m.is_mla:
            qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
            flops = 2.0 * self.heads * (qk + v) * self._prefill_pairs(prefill, window)
            cached = float(sum(c for _, c in prefill))   # latent -> per-head K_nope, V for the cached tokens
            flops += 2.0 * cached * m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + v)
            bytes_ = dt * float(sum(n for n, _ in prefill)) * self.heads * (qk + v) + self.kv_dt * kv_tokens * self.kv_dim
        else:
            flops = None if self._prefill_tile else 4.0 * m.head_dim * self.heads * self._prefill_pairs(prefill, window)
            bytes_ = dt * float(sum(2 * n * self.q_dim for n, _ in prefill)) + self.kv_dt * kv_tokens * self.kv_dim
        if flops is not None:
            compute_s = flops / (self.attention_peak_flops * e.attention_compute)
        else:   # tile by tile (Efficiencies.attention_tiles)
            compute_s = prefill_compute_s(prefill, self._prefill_tile, self.gpu.sm_count, self.heads,
                                          self._kv_heads, self._tile_s, self._tile_overhead, window)
        return max(compute_s, bytes_ / (self.gpu.hbm_bytes_per_s * e.attention_memory)) + e.kernel_launch_s

    @staticmethod
    def _prefill_pairs(prefill, window: int | None) -> float:
        """(query, key) pairs of causal attention over new tokens after cached ones, windowed if `window`."""
        if window is None:
            return float(sum(n * (c + (n + 1) / 2.0) for n, c in prefill))
        return float(sum(_window_pairs(n, c, window) for n, c in prefill))

    def _decode_attention_s(self, context_sum, num_seqs: int):
        """Paged decode attention over every layer: stream every sequence's K and V (or MLA latent) once;
        sliding-window layers read at most `window` tokens a sequence (min(sum, seqs x window), an upper
        bound). `context_sum` (the sum of the sequences' contexts, exact in float64) may be a float or an
        array of them, one per step."""
        flops_per_ctx, compute_rate, memory_rate, launch_s = self._decode_attention_consts
        is_float = isinstance(context_sum, float)
        maximum = max if is_float else np.maximum
        q_bytes = self.dt * 2 * num_seqs * self.q_dim
        full = maximum(flops_per_ctx * context_sum / compute_rate,
                       (self.kv_dt * (context_sum * self.kv_dim) + q_bytes) / memory_rate) + launch_s
        if not self.num_sliding:
            return self.model.num_layers * full
        ctx = (min if is_float else np.minimum)(context_sum, float(num_seqs * self.model.sliding_window))
        windowed = maximum(flops_per_ctx * ctx / compute_rate,
                           (self.kv_dt * (ctx * self.kv_dim) + q_bytes) / memory_rate) + launch_s
        return (self.model.num_layers - self.num_sliding) * full + self.num_sliding * windowed

    def _varlen_excess_s(self, prefill, num_decode: int, context_sum: float) -> float:
        """What one FlashAttention 2 varlen kernel over a step's chunks and decodes costs beyond pricing each
        on its own, over all layers: the decodes' KV re-reads beside a chunk (`_mixed_rereads_s`) and the
        grid's empty query tiles (every sequence gets the longest one's `max(new) / block_m` tiles a head;
        those past its own queries exit at once, `Efficiencies.empty_query_tile_s` each). 0 elsewhere."""
        t = self._mixed_rereads_s(context_sum) if num_decode else 0.0
        if self._empty_tile_s and (num_decode or len(prefill) > 1):
            empty = empty_query_tiles([n for n, _ in prefill], num_decode, self._prefill_tile.block_m)
            t += self.model.num_layers * empty * self._empty_tile_s
        return t

    def _mixed_rereads_s(self, context_sum: float) -> float:
        """A step with prefill chunks and decodes on FlashAttention 2 (costmodels/attention_kernel.py): the
        decode rows lose the grouped-query fold, so each KV head's slice of the decodes' cache is read again
        by every other query head that shares it: the part of the slice L2 holds (all of it when it fits)
        at `mixed_reread_l2_speedup` times the DRAM figure, the rest from DRAM. Over all layers; 0 elsewhere."""
        if not self._mixed_rereads:
            return 0.0
        e = self.eff
        kv_bytes = self.kv_dt * context_sum * self.kv_dim   # one layer's decode KV on this GPU
        slice_bytes = kv_bytes / self._kv_heads             # one KV head's K and V
        in_l2 = min(1.0, (self.gpu.l2_bytes or 0.0) / slice_bytes) if slice_bytes > 0 else 1.0
        dram = self.gpu.hbm_bytes_per_s * e.attention_memory
        per_read = kv_bytes * (in_l2 / (dram * e.mixed_reread_l2_speedup) + (1.0 - in_l2) / dram)
        return self.model.num_layers * self._mixed_rereads * per_read

    def _elementwise_s(self, num_tokens: int, mlp_width: float) -> float:
        """vLLM's fused elementwise kernels of one layer, each streaming its tensors once: two fused residual
        add + RMSNorm (read x and the residual, write both), rotary on Q and K (in place), SiLU*mul (read
        gate and up, write their product). A kernel whose tensors fit in L2 (a step's activations written by
        the GEMM before it) runs at `l2_speedup` times the DRAM figure.

        FP8 linears (`scaled_mm`) take their input in FP8: the compiled model (Inductor, over vLLM's native
        ops) quantises it inside the RMSNorm before qkv and gate_up and the SiLU*mul before down, but the
        attention's output, which leaves a kernel Inductor does not generate, is quantised by a kernel of its
        own before o_proj (read 16 bits, write 8). aiconfigurator's FP8 GEMM rows, which time that quantisation
        with every GEMM, take 2.8-3.7 us more than their bf16 rows at decode sizes on H100, H200, B200 and RTX
        PRO 6000 Server (`python -m benchmarks.kernel_efficiency`): one kernel's launch and ramp."""
        m, dt = self.model, self.dt
        kernels = [(2, 4 * m.hidden_size), (1, 2 * (self.q_dim + self.kv_dim)), (1, 3 * mlp_width)]
        t = sum(count * self._streaming_kernel_s(dt * num_tokens * width) for count, width in kernels)
        if self.scaled_mm and self.attn_gemms:   # o_proj's input (a table's MLA module times its own projections)
            t += self.input_quant_s(num_tokens, self.attn_gemms[-1][1])
        return t

    def _streaming_kernel_s(self, num_bytes: float) -> float:
        """One fused elementwise kernel moving `num_bytes`, from L2 when they fit."""
        e, l2 = self.eff, self.gpu.l2_bytes or 0.0
        bw = self.gpu.hbm_bytes_per_s * e.elementwise_memory
        return num_bytes / (bw * (e.l2_speedup if num_bytes <= l2 else 1.0)) + e.kernel_launch_s

    def input_quant_s(self, num_tokens: int, width: int) -> float:
        """The kernel that quantises an FP8 linear's 16-bit input (`width` a token) to FP8: read 16 bits,
        write 8."""
        return self._streaming_kernel_s(num_tokens * width * (self.dt + 1.0))

    def _allreduce_s(self, num_tokens: int) -> float:
        """Two all-reduces per layer under TP (after attention and after the MLP), ring algorithm, at the
        latency and link efficiency of what they cross (costmodels/collectives.py)."""
        if self.tp == 1:
            return 0.0
        message = num_tokens * self.model.hidden_size * self.dt
        return 2 * ring_allreduce_s(message, self.tp, self.gpu.interconnect_bytes_per_s, self.tp_link)

    def _routed_experts_s(self, num_tokens: int, group_tokens: int | None = None) -> float:
        """The routed experts as one grouped GEMM (gate, up, down) on the busiest rank, over `group_tokens`,
        the DP group's gathered tokens (simcore/dp_lockstep.py `group_tokens`; default: every rank's batch
        like this one)."""
        m, e, d = self.model, self.eff, self.deployment
        h, top_k, experts = m.hidden_size, m.experts_per_token, m.num_experts
        tokens_global = num_tokens * d.data_parallel_size if group_tokens is None else group_tokens
        if d.ep > 1:   # each rank holds experts / ep whole experts and gets its share of the routed tokens
            local_experts, width = experts / d.ep, m.moe_intermediate_size
            routed = min(tokens_global * top_k / d.ep * d.expert_load_imbalance, tokens_global * top_k)
        else:          # every rank holds a 1/(tp x dp) slice of every expert and runs it over every DP rank's tokens
            local_experts, width, routed = experts, m.moe_intermediate_size / d.expert_tp, tokens_global * top_k
        # distinct experts hit by tokens_global x top_k uniform picks, on this rank
        active = local_experts * (1.0 - (1.0 - 1.0 / experts) ** (tokens_global * top_k))
        flops = 2.0 * routed * 3 * h * width
        bytes_ = active * 3 * h * width * self.wb + routed * (2 * h + 3 * width) * self.dt
        compute, memory = (e.moe_fp8_compute, e.moe_fp8_memory) if self.scaled_mm else (e.moe_compute, e.gemm_memory)
        return _ridge(flops / (self.peak_flops * compute), bytes_ / (self.gpu.hbm_bytes_per_s * memory),
                      e.gemm_ridge_exponent) + 2 * e.kernel_launch_s

    def _alltoall_s(self, num_tokens: int, exchanged_tokens: int | None = None) -> float:
        """The DP dispatch and combine of one MoE layer as vLLM runs them by default, with or without EP
        (`do_naive_dispatch_combine` whenever DP > 1, vllm/model_executor/layers/fused_moe/runner/moe_runner.py):
        an all-gather of every DP rank's tokens (hidden state, top-k ids and weights) before the experts, so
        each rank runs its experts (or its slice of every expert) over all of them, and a reduce-scatter of the
        experts' partial outputs after (all2all backend
        `allgather_reducescatter`, vLLM's default since 0.11 and its only portable one: vllm/config/parallel.py,
        vllm/distributed/device_communicators/all2all.py `AgRsAll2AllManager`). Each is one ring over the DP
        group, `exchanged_tokens` across the busiest GPU's link (default: the ranks alike, (dp - 1) x this
        rank's; simcore/dp_lockstep.py `group_tokens` otherwise), priced at that link's collective figures
        (costmodels/collectives.py: a ring all-reduce is exactly a reduce-scatter then an all-gather). With
        DP 1 (EP over the TP ranks only) nothing is exchanged: every TP rank holds the tokens, and the TP
        all-reduce sums the experts' outputs."""
        m, d = self.model, self.deployment
        ranks = d.data_parallel_size
        if ranks < 2:
            return 0.0
        hidden = m.hidden_size * self.dt
        exchanged = num_tokens * (ranks - 1) if exchanged_tokens is None else exchanged_tokens
        gathered = exchanged * (hidden + m.experts_per_token * 8)   # + int32 ids, fp32 weights
        scattered = exchanged * hidden
        return (gathered + scattered) / (self.gpu.interconnect_bytes_per_s * self.ep_link.efficiency) \
            + 2 * self.ep_link.latency_s

    def step_time_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                    num_logits: int | None = None) -> float:
        return self.step_time_sums_s(prefill, len(decode), sum(decode), num_logits)

    def step_time_in_dp_group_s(self, group, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                                num_logits: int | None = None) -> float:
        """`step_time_s` of one DP rank of an MoE model in its group's step: the experts over `group.experts`
        tokens and the exchange before and after them carrying `group.exchanged` (simcore/dp_lockstep.py
        `group_tokens`), where `step_time_s` takes every rank alike. The same as `step_time_s` for any other
        model."""
        num_tokens = sum(n for n, _ in prefill) + len(decode)
        layers = self.model.num_moe_layers
        if not num_tokens or not layers or self.deployment.data_parallel_size < 2:
            return self.step_time_s(prefill, decode, num_logits)
        extra = layers * (self._routed_experts_s(num_tokens, group.experts) - self._routed_experts_s(num_tokens)
                          + self._alltoall_s(num_tokens, group.exchanged) - self._alltoall_s(num_tokens))
        return self.step_time_sums_s(prefill, len(decode), sum(decode), num_logits, extra)

    def step_time_sums_s(self, prefill: Sequence[tuple[int, int]], num_decode: int, decode_context_sum: int,
                         num_logits: int | None = None, extra_gpu_s: float = 0.0) -> float:
        """`step_time_s` when only the count and the sum of the decode contexts are at hand: the roofline
        depends on nothing else about them (equal results, bitwise). `extra_gpu_s`: GPU time to add to the
        step's own (before async scheduling's overlap with the CPU's)."""
        num_seqs = len(prefill) + num_decode
        num_tokens = sum(n for n, _ in prefill) + num_decode
        if num_tokens == 0:
            return 0.0
        if num_logits is None:
            num_logits = num_seqs
        attention = 0.0
        if prefill:
            attention += self._prefill_attention_total_s(prefill)
        if num_decode:
            attention += float(self._decode_attention_s(float(decode_context_sum), num_decode))
        if prefill:
            attention += self._varlen_excess_s(prefill, num_decode, float(decode_context_sum))
        return self._step_s(num_tokens, num_seqs, num_logits, attention + extra_gpu_s)

    def _prefill_attention_total_s(self, prefill) -> float:
        full = self._prefill_attention_s(prefill)
        if not self.num_sliding:
            return self.model.num_layers * full
        windowed = self._prefill_attention_s(prefill, self.model.sliding_window)
        return (self.model.num_layers - self.num_sliding) * full + self.num_sliding * windowed

    def decode_steps_time_s(self, num_seqs: int, context_sums: np.ndarray, num_logits: int | None = None):
        """Many decode-only steps at once: step i runs `num_seqs` sequences whose contexts (each including
        its new token) sum to `context_sums[i]`. Element i equals, bitwise, `step_time_s(decode=contexts_i,
        num_logits=num_logits)`: the same float operations in the same order, elementwise (the fast path's
        quiet stretches rely on it)."""
        attention = self._decode_attention_s(np.asarray(context_sums, dtype=float), num_seqs)
        return self._step_s(num_seqs, num_seqs, num_seqs if num_logits is None else num_logits, attention)

    def _step_s(self, num_tokens: int, num_seqs: int, num_logits: int, attention):
        """Everything but attention (all layers' attention, summed) depends on token and sequence counts
        only; `attention` may be an array."""
        by_tokens = self._by_tokens.get(num_tokens)
        if by_tokens is None:   # memoised: a pure function of the token count
            by_tokens = self._by_tokens[num_tokens] = self._token_terms_s(num_tokens)
        head = self._heads.get(num_logits)
        if head is None:
            head = self._heads[num_logits] = self._head_s(num_logits)
        layers, embed = by_tokens
        e = self.eff
        gpu = layers + attention + head + embed
        cpu = e.per_step_s + e.per_request_s * num_seqs
        if not e.async_scheduling:
            return gpu + cpu
        return max(gpu, cpu) if isinstance(gpu, float) else np.maximum(gpu, cpu)  # elementwise: bitwise equal

    @property
    def frontend(self) -> FrontendLatency:
        return self.eff.frontend

    def synchronous(self) -> "RooflineCostModel":
        """This model for an engine without async scheduling (`engine.async_scheduling: false`, or a vLLM
        before 0.14): each step's CPU time adds to its GPU time. The memos hold GPU terms only, so they are
        shared."""
        if not self.eff.async_scheduling:
            return self
        out = copy.copy(self)
        out.eff = replace(self.eff, async_scheduling=False)
        return out

    def decode_step_time_fn(self, num_seqs: int, num_logits: int | None = None):
        """A function of the decode context sum giving `step_time_sums_s((), num_seqs, sum, num_logits)`,
        bitwise: the same operations, with everything that depends only on the counts evaluated once."""
        num_logits = num_seqs if num_logits is None else num_logits
        self._step_s(num_seqs, num_seqs, num_logits, 0.0)   # fills the memos
        attention = self._decode_attention_s

        def step_time_s(context_sum: int) -> float:
            return self._step_s(num_seqs, num_seqs, num_logits, float(attention(float(context_sum), num_seqs)))
        return step_time_s

    def _token_terms_s(self, num_tokens: int) -> tuple[float, float]:
        """(all layers but their attention, embedding lookup) for `num_tokens` tokens."""
        terms = self._layer_terms_s(num_tokens)
        embed = terms.pop("embedding")
        return sum(terms.values()), embed

    def _layer_terms_s(self, num_tokens: int) -> dict[str, float]:
        """Every term that depends on the token count only, summed over the layers that have it."""
        m, e, d = self.model, self.eff, self.deployment
        moe_width = m.experts_per_token * m.moe_intermediate_size / (1 if d.ep > 1 else self.tp)
        t = {"attention_gemms": m.num_layers * sum(self._gemm_s(num_tokens, n, k, self.quantized_attention) for n, k in self.attn_gemms),
             "allreduce": m.num_layers * self._allreduce_s(num_tokens),
             "dense_mlp": m.num_dense_layers * sum(self._gemm_s(num_tokens, n, k) for n, k in self.mlp_gemms),
             "elementwise": (m.num_dense_layers * self._elementwise_s(num_tokens, m.intermediate_size / self.tp)
                             + m.num_moe_layers * self._elementwise_s(num_tokens, moe_width)),
             "moe_router_shared": 0.0, "routed_experts": 0.0, "alltoall": 0.0, "pipeline_sends": 0.0}
        if m.num_moe_layers:
            t["moe_router_shared"] = m.num_moe_layers * (self._gemm_s(num_tokens, m.num_experts, m.hidden_size, quantized=False)
                                                         + sum(self._gemm_s(num_tokens, n, k) for n, k in self.shared_gemms))
            t["routed_experts"] = m.num_moe_layers * self._routed_experts_s(num_tokens)
            t["alltoall"] = m.num_moe_layers * self._alltoall_s(num_tokens)   # none without DP
        if d.pipeline_parallel_size > 1:   # hidden states sent from stage to stage
            t["pipeline_sends"] = (d.pipeline_parallel_size - 1) * (
                num_tokens * m.hidden_size * self.dt / (self.gpu.interconnect_bytes_per_s * self.p2p_link.efficiency)
                + self.p2p_link.latency_s)
        t["embedding"] = num_tokens * m.hidden_size * self.dt * 2 / (self.gpu.hbm_bytes_per_s * e.elementwise_memory)
        return t

    def step_terms_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                     num_logits: int | None = None) -> dict[str, float]:
        """The documented terms of one step, in seconds; they add up to `step_time_s` (to rounding)."""
        num_seqs, num_tokens = len(prefill) + len(decode), sum(n for n, _ in prefill) + len(decode)
        if num_tokens == 0:
            return {}
        t = self._layer_terms_s(num_tokens)
        t["prefill_attention"] = self._prefill_attention_total_s(prefill) if prefill else 0.0
        t["decode_attention"] = float(self._decode_attention_s(float(sum(decode)), len(decode))) if decode else 0.0
        t["mixed_attention"] = self._varlen_excess_s(prefill, len(decode), float(sum(decode))) if prefill else 0.0
        t["lm_head_sampling"] = self._head_s(num_seqs if num_logits is None else num_logits)
        t["per_step"], t["per_request"] = self.eff.per_step_s, self.eff.per_request_s * num_seqs
        if self.eff.async_scheduling:  # the CPU terms hide behind the GPU's (see Efficiencies)
            gpu = sum(v for k, v in t.items() if k not in ("per_step", "per_request"))
            hidden = min(gpu, t["per_step"] + t["per_request"])
            t["async_overlap"] = -hidden
        return t

    def stage_times_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                      num_logits: int | None = None) -> tuple[tuple[float, ...], float]:
        """One batch on each pipeline stage: (seconds on each stage, seconds of one stage-to-stage send).

        A stage runs its share of the decoder layers (vLLM's split, `deployment.stage_layers`; each layer
        term scaled by that share, exact for models whose layers are alike, an average over dense/MoE or
        sliding/full layers otherwise), the first also the embedding, the last the LM head and sampling.
        The CPU's per-step and per-sequence time is the first stage's: overlapped with it (the larger of
        the two) under async scheduling, added otherwise, so the CPU limits how fast batches enter the
        pipeline. The send carries the batch's hidden states to the next stage (`pipeline_sends` of
        `step_terms_s`, per hop). Without PP: `((step_time_s,), 0.0)`, the same float."""
        pp = self.deployment.pipeline_parallel_size
        if pp == 1:
            return (self.step_time_s(prefill, decode, num_logits),), 0.0
        num_seqs, num_tokens = len(prefill) + len(decode), sum(n for n, _ in prefill) + len(decode)
        if num_tokens == 0:
            return (0.0,) * pp, 0.0
        terms = self._stage_memo.get(num_tokens)
        if terms is None:   # memoised: a pure function of the token count
            t = self._layer_terms_s(num_tokens)
            embed, sends = t.pop("embedding"), t.pop("pipeline_sends")
            terms = self._stage_memo[num_tokens] = (sum(t.values()), embed, sends / (pp - 1))
        layers, embed, send_s = terms
        if prefill:
            layers += self._prefill_attention_total_s(prefill)
        if decode:
            layers += float(self._decode_attention_s(float(sum(decode)), len(decode)))
        if prefill:
            layers += self._varlen_excess_s(prefill, len(decode), float(sum(decode)))
        stages = [layers * n / self.model.num_layers for n in _deployment.stage_layers(self.model.num_layers, pp)]
        stages[0] += embed
        stages[-1] += self._head_s(num_seqs if num_logits is None else num_logits)
        e = self.eff
        cpu = e.per_step_s + e.per_request_s * num_seqs
        stages[0] = max(stages[0], cpu) if e.async_scheduling else stages[0] + cpu
        return tuple(stages), send_s

    def _head_s(self, num_logits: int) -> float:
        """Final norm, LM head over the vocabulary shard, logits to fp32, sampling."""
        if not num_logits:
            return 0.0
        m, e = self.model, self.eff
        head = self._gemm_s(num_logits, m.vocab_size // self.tp, m.hidden_size, quantized=False)
        head += num_logits * m.vocab_size * 4 * 2 / (self.gpu.hbm_bytes_per_s * e.elementwise_memory)
        return head + 3 * e.kernel_launch_s + self._logits_gather_s(num_logits)

    def _logits_gather_s(self, num_logits: int) -> float:
        """The all-gather of the LM head's vocabulary shards under TP (collectives.logits_gather_s)."""
        return logits_gather_s(num_logits, self.model.vocab_size, self.tp, self.dt, self.gpu)

    def weights_floor_s(self) -> float:
        """The decode floor: one step reads every weight this GPU holds that a batch-1 step touches, at the
        datasheet HBM bandwidth (no efficiency factor)."""
        m, d = self.model, self.deployment
        total = _deployment.weight_bytes_per_gpu(m, d)
        p = m.param_counts()
        if not m.tie_embeddings:   # the embedding table is looked up, one row, not streamed
            total -= p["embedding"] * self.dt / self.tp
        if m.is_moe:   # each expert is hit with probability top-k / experts
            experts_bytes = p["experts"] * self.wb / (d.ep if d.ep > 1 else d.expert_tp) / d.pipeline_parallel_size
            total -= experts_bytes * (1 - m.experts_per_token / m.num_experts)
        return total / self.gpu.hbm_bytes_per_s


def weight_bytes(model: ModelShape, tp: int = 1, dtype: str = "bf16") -> float:
    return _deployment.weight_bytes_per_gpu(model, Deployment(dtype=dtype, tensor_parallel_size=tp))


def activation_reserve_bytes(model: ModelShape, max_num_batched_tokens: int, max_num_seqs: int,
                             tp: int = 1, dtype: str = "bf16") -> float:
    return _deployment.activation_reserve_bytes(model, Deployment(dtype=dtype, tensor_parallel_size=tp),
                                                max_num_batched_tokens, max_num_seqs)


def _ridge(compute_s: float, memory_s: float, p: float) -> float:
    """(compute^p + memory^p)^(1/p), computed as the larger times (1 + (smaller / larger)^p)^(1/p): max()
    far from the ridge, 2^(1/p) x max() on it (Efficiencies.gemm_ridge_exponent)."""
    hi, lo = (compute_s, memory_s) if compute_s >= memory_s else (memory_s, compute_s)
    return hi * (1.0 + (lo / hi) ** p) ** (1.0 / p) if hi > 0 else 0.0


def _window_pairs(n: int, c: int, window: int) -> float:
    """Query-key pairs of `n` new tokens after `c` cached ones when each query attends to at most `window`
    keys, itself included (vLLM's sliding window): sum over i = 1..n of min(c + i, window)."""
    if c + n <= window:
        return n * c + n * (n + 1) / 2.0
    if c >= window:
        return float(n * window)
    k = window - c   # the first k queries see every earlier token
    return k * c + k * (k + 1) / 2.0 + (n - k) * window

"""How a model is deployed: weight and KV-cache precision and parallelism (vLLM's knob names), with the
memory they imply per GPU. One frozen value per point; `check` turns an impossible layout into one line.

Memory follows vLLM: TP shards attention heads and dense MLPs; without EP every expert is sharded over
the TP x DP ranks (vLLM flattens the experts' TP across DP), with `enable_expert_parallel` the experts
are split whole over the TP x DP ranks instead; PP splits the layers
(the first stage also holds the embedding, the last the LM head: the larger is what must fit).
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodels import mxfp4_moe
from costmodels.catalog import CatalogError, ModelShape

# bytes per weight; block formats carry their scales (mxfp4: one 8-bit scale per 32 values, nvfp4: one
# fp8 scale per 16; fp8_block: one fp32 scale per 128x128 block, negligible; int4 (AWQ, GPTQ): one fp16
# scale and one 4-bit zero point per group of 128 weights, (2 + 0.5) / 128 bytes on top of the half byte,
# as AWQ (Lin et al. 2023, arXiv:2306.00978) and GPTQ (Frantar et al. 2022, arXiv:2210.17323) store them);
# int8 (W8A8, RedHatAI's "-quantized.w8a8"): one fp32 scale per output channel, negligible
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0, "fp8_block": 1.0, "mxfp4": 0.53125,
                "nvfp4": 0.5625, "int4": 0.5 + 2.5 / 128, "int8": 1.0}
# the GEMM input format: mxfp4 is weight-only in vLLM on Hopper; int4 is weight-only everywhere (vLLM's
# Marlin kernels dequantise to 16 bits in registers and run 16-bit tensor-core MMAs: Frantar et al. 2024,
# "MARLIN", arXiv:2408.11743); int8 is W8A8: vLLM quantises each token's activations to INT8 on the fly and
# runs CUTLASS's INT8 GEMM (compressed-tensors W8A8, `cutlass_scaled_mm`) on the INT8 tensor cores
COMPUTE_DTYPE = {"bf16": "bf16", "fp16": "bf16", "fp32": "bf16", "fp8": "fp8", "fp8_block": "fp8",
                 "mxfp4": "bf16", "nvfp4": "fp4", "int4": "bf16", "int8": "int8"}
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0}
KV_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
QUANTIZATIONS = ("fp8", "fp8_block", "mxfp4", "nvfp4", "int8")


@dataclass(frozen=True)
class Deployment:
    """`dtype`: the model's activation/weight dtype (bf16 unless quantised); `quantization`: vLLM's weight
    quantisation (None: the checkpoint's own, from config.json); `kv_cache_dtype`: vLLM's (auto = dtype);
    `expert_load_imbalance`: tokens on the busiest expert-parallel rank over the mean (1.0 = perfectly
    balanced routing; DeepSeek-V3 reports 1.1-1.3 without its redundant experts)."""
    dtype: str = "bf16"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    expert_load_imbalance: float = 1.0

    @property
    def tp(self) -> int:
        return self.tensor_parallel_size

    @property
    def ep(self) -> int:
        """Expert-parallel group size (1 without EP): vLLM's EP spans the TP x DP ranks."""
        return self.tensor_parallel_size * self.data_parallel_size if self.enable_expert_parallel else 1

    @property
    def expert_tp(self) -> int:
        """How many ranks share each routed expert's width: without EP, vLLM shards every expert over all the
        TP x DP ranks (`FusedMoEParallelConfig.make`, `flatten_tp_across_dp_and_pcp`: "2 engine instances and
        the tensors are sharded across 4 devices" at TP 2, DP 2), each rank running its slice over every DP
        rank's tokens; with EP, 1 (each rank holds whole experts)."""
        return 1 if self.enable_expert_parallel else self.tensor_parallel_size * self.data_parallel_size

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one simulated engine (one DP rank): TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def weight_format(self, model: ModelShape) -> str:
        if self.dtype == "fp8":   # the legacy global `dtype: fp8`
            return "fp8"
        return self.quantization or model.quantization or self.dtype

    def kv_format(self) -> str:
        if self.kv_cache_dtype == "auto":
            return "fp8" if self.dtype == "fp8" else self.dtype
        return KV_ALIASES.get(self.kv_cache_dtype, self.kv_cache_dtype)

    def activation_bytes(self) -> float:
        return 2.0 if self.dtype == "fp8" else KV_BYTES[self.dtype]


def check(model: ModelShape, d: Deployment) -> None:
    """One-line CatalogError for a layout vLLM would refuse, naming the knob."""
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        v = getattr(d, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CatalogError(f"{key}: expected a positive integer, got {v!r}")
    if model.num_heads % d.tp:
        raise CatalogError(f"tensor_parallel_size: {d.tp} does not divide {model.num_heads} attention heads")
    if d.pipeline_parallel_size > model.num_layers:
        raise CatalogError(f"pipeline_parallel_size: {d.pipeline_parallel_size} exceeds {model.name}'s "
                           f"{model.num_layers} layers")
    if d.enable_expert_parallel:
        if not model.is_moe:
            raise CatalogError(f"enable_expert_parallel: {model.name} has no experts")
        if model.num_experts % d.ep:
            raise CatalogError(f"enable_expert_parallel: {d.ep} ranks (tensor_parallel_size x data_parallel_size)"
                               f" do not divide {model.num_experts} experts")
    if not isinstance(d.expert_load_imbalance, (int, float)) or d.expert_load_imbalance < 1:
        raise CatalogError(f"expert_load_imbalance: expected a number >= 1, got {d.expert_load_imbalance!r}")
    if d.quantization is not None and d.quantization not in QUANTIZATIONS:
        raise CatalogError(f"quantization: expected one of {', '.join(QUANTIZATIONS)}, got {d.quantization!r}")
    if d.kv_format() not in KV_BYTES:
        raise CatalogError(f"kv_cache_dtype: expected auto, {', '.join(KV_BYTES)}, fp8_e4m3 or fp8_e5m2, "
                           f"got {d.kv_cache_dtype!r}")


def weight_bytes_per_gpu(model: ModelShape, d: Deployment, gpu=None) -> float:
    """Weights one GPU holds. Quantisation applies to the decoder's linear layers (mxfp4, as gpt-oss ships
    it, to the routed experts only); embeddings, LM head and norms stay 16-bit, as in vLLM. With `gpu`
    (costmodels.catalog.GPU), MXFP4 experts as vLLM's MoE kernel for that GPU holds them (padded,
    converted: costmodels/mxfp4_moe.py); without, the checkpoint's bytes."""
    p = model.param_counts()
    wb, half = WEIGHT_BYTES[d.weight_format(model)], d.activation_bytes()
    linear = wb if d.weight_format(model) != "mxfp4" else half
    expert_shards = d.ep if d.enable_expert_parallel else d.expert_tp
    experts = p["experts"] * wb / expert_shards
    if gpu is not None and model.is_moe and d.weight_format(model) == "mxfp4":
        held = mxfp4_moe.expert_bytes_per_gpu(model, gpu, d.expert_tp, d.ep)
        experts = experts if held is None else held
    layers = (p["attention"] + p["dense_mlp"] + p["shared"]) * linear / d.tp + experts + p["norms"] * half
    ends = p["embedding"] * half / d.tp
    if d.pipeline_parallel_size == 1:
        return layers + ends + p["lm_head"] * half / d.tp
    return layers / d.pipeline_parallel_size + max(ends, p["lm_head"] * half / d.tp)


def stage_layers(num_layers: int, pipeline_parallel_size: int) -> tuple[int, ...]:
    """Decoder layers of each pipeline stage, as vLLM splits them (vllm/distributed/utils.py
    `get_pp_indices`, without VLLM_PP_LAYER_PARTITION): equal shares, the remainder one layer each to the
    stages just before the last (the last holds the final norm and LM head)."""
    parts = [num_layers // pipeline_parallel_size] * pipeline_parallel_size
    for i in range(2, num_layers % pipeline_parallel_size + 2):
        parts[-i] += 1
    return tuple(parts)


def kv_bytes_per_token(model: ModelShape, d: Deployment) -> int:
    """KV of one token on one GPU: every layer's (of this pipeline stage) K and V, or MLA latent."""
    per_layer = model.kv_width(d.tp) * KV_BYTES[d.kv_format()]
    layers = -(-model.num_layers // d.pipeline_parallel_size)
    return int(layers * per_layer)


# Memory vLLM's start-up profile counts beyond the weights and the profiling forward's live tensors
# (vllm/v1/worker/gpu_worker.py determine_available_memory: KV = total x gpu_memory_utilization - weights
# - torch peak increase - non-torch increase). The non-torch part is what the first forward loads outside
# PyTorch's allocator: cuBLAS/cuBLASLt workspaces and lazily loaded kernel modules (attention, sampling).
# 0.2e9: what is left of vLLM's own KV block counts once weights, activations and the sampler's tensors
# are taken out, the same on two GPUs, two models and two versions (H100 SXM, Llama-2-7B, vLLM 0.15.1:
# 7,463 blocks, ../shared/real-runs/README.md -> 0.19e9; RTX 4090, Llama-3.1-8B, vLLM 0.19.0: 2,588
# blocks, LLMServingSim's vllm_meta.json -> 0.21e9), and what vLLM's own start-up log prints in public
# reports ("non_torch_memory takes 0.16GiB", H100 80GB, vllm-project/vllm PR #12126; "0.20GiB", a 24 GB
# card, PR #14447). The CUDA context exists before vLLM's baseline snapshot and is not counted; nor, at TP >
# 1, are NCCL's buffers (about 4.5 GiB in PR #25359's report), which vLLM allocates before that snapshot
# since that PR (September 2025, before 0.15: gpu_worker.init_device runs the distributed init first), so
# they sit outside the gpu_memory_utilization budget and do not shrink the KV pool. CUDA graphs are
# captured after the KV cache is allocated and counted only from vLLM 0.21 on
# (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS), so not in the versions this represents.
NON_TORCH_PROFILE_BYTES = 0.2e9
# vLLM's dummy sampler run (gpu_model_runner._dummy_sampler_run) samples min(max_num_seqs, token budget)
# rows with top-k = vocab - 1 and top-p 0.9, so the full-vocabulary sort path runs: fp32 logits, the
# sorted values, their int64 indices (two fp32 widths), the softmax and its cumulative sum are live at
# once: 6 fp32 [rows, vocab] tensors. Logits are gathered to the full vocabulary on every TP rank.
SAMPLER_FP32_COPIES = 6


def activation_reserve_bytes(model: ModelShape, d: Deployment, max_num_batched_tokens: int,
                             max_num_seqs: int) -> float:
    """Non-KV, non-weight memory of vLLM's (0.15-0.19) start-up profile at the token budget: the largest
    live activations of the profiling forward (hidden states, QKV or the MLA projections, the widest MLP
    intermediate: dense, or the top-k experts' gate/up outputs per token), the dummy sampler run's fp32
    tensors, and the non-torch memory the first forward loads (NON_TORCH_PROFILE_BYTES)."""
    dt, tp = d.activation_bytes(), d.tp
    mlp = 3 * model.intermediate_size // tp if model.num_dense_layers else 0
    if model.is_moe:
        shard = 1 if d.enable_expert_parallel else tp
        mlp = max(mlp, model.experts_per_token * (3 * model.moe_intermediate_size // shard + model.hidden_size))
    per_token = dt * (4 * model.hidden_size + mlp)
    sampler = min(max_num_seqs, max_num_batched_tokens) * model.vocab_size * 4 * SAMPLER_FP32_COPIES
    return max_num_batched_tokens * per_token + sampler + NON_TORCH_PROFILE_BYTES


DEPLOYMENT_KEYS = ("dtype", "quantization", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size",
                   "data_parallel_size", "enable_expert_parallel", "expert_load_imbalance")


def parse_deployment(raw: dict, model: ModelShape, dtypes) -> Deployment:
    """The sweep file's top-level precision and parallelism keys (vLLM's names) as a checked Deployment;
    `dtypes`: the accepted `dtype` values. A bad value is a one-line CatalogError naming its key."""
    dtype = raw.get("dtype", "bf16")
    if dtype not in dtypes:
        raise CatalogError(f"dtype: expected one of {', '.join(dtypes)}, got {dtype!r}")
    ep = raw.get("enable_expert_parallel", False)
    if not isinstance(ep, bool):
        raise CatalogError(f"enable_expert_parallel: expected true or false, got {ep!r}")
    for key in ("quantization", "kv_cache_dtype"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise CatalogError(f"{key}: expected a string, got {raw[key]!r}")
    d = Deployment(dtype=dtype, quantization=raw.get("quantization"), kv_cache_dtype=raw.get("kv_cache_dtype", "auto"),
                   tensor_parallel_size=raw.get("tensor_parallel_size", 1),
                   pipeline_parallel_size=raw.get("pipeline_parallel_size", 1),
                   data_parallel_size=raw.get("data_parallel_size", 1), enable_expert_parallel=ep,
                   expert_load_imbalance=raw.get("expert_load_imbalance", 1.0))
    check(model, d)
    return d

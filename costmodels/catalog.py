"""Catalogs of GPUs (datasheet figures) and decoder model shapes: dense, mixture-of-experts (MoE) and
multi-head latent attention (MLA) families, from public config.json files (costmodels/hfconfig.py).

Sources: NVIDIA's product datasheets (dense BF16/FP8, no sparsity) and each model's config.json on the
Hugging Face Hub, listed per entry in docs/sources.md. Only what the cost and memory models need is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops_per_s: float      # dense tensor-core peak
    hbm_bytes_per_s: float       # datasheet HBM bandwidth
    memory_bytes: float          # total device memory
    interconnect_bytes_per_s: float  # per-GPU NVLink (or PCIe) bandwidth used by TP all-reduce
    host_link_bytes_per_s: float     # GPU<->host copies (KV swap), PCIe gen4 x16 ~25 GB/s, gen5 ~50 GB/s
    fp8_flops_per_s: float | None = None  # dense FP8 tensor-core peak; None: no FP8 tensor cores (A100)
    fp4_flops_per_s: float | None = None  # dense FP4 peak (Blackwell); None: FP4 weights dequantised to fp8/bf16
    interconnect_kind: str = "nvlink"     # nvlink | pcie | pcie_host | infinity_fabric: what TP collectives
                                          # cross (pcie: GPU peer-to-peer; pcie_host: staged through host memory)
    l2_bytes: float | None = None         # last-level on-chip cache (the [aic] tables' decode attention uses it)
    host_memory_bytes: float | None = None  # host (CPU) memory per GPU in its reference server (KV offload's
                                            # ceiling); None: not known, not checked
    compute_capability: str | None = None   # NVIDIA's "major.minor" (which kernels an engine picks:
                                            # costmodels/attention_kernel.py); None: not NVIDIA, or not known
    gemm_compute: float | None = None       # share of bf16_flops_per_s that large 16-bit GEMMs sustain on this
                                            # GPU, from its own measured kernel table (GEMM_FIGURES below);
                                            # None: the prior's pooled figure (Efficiencies.gemm_compute)
    gemm_ridge_exponent: float | None = None  # how its GEMMs overlap loads and MMAs near the ridge, from the
                                              # same table; None: Efficiencies.gemm_ridge_exponent
    sm_count: int | None = None   # streaming multiprocessors: how many FlashAttention tiles run at once
                                  # (costmodels/attention_kernel.py); None: not known, prefill attention by FLOPs

    def peak_flops_per_s(self, compute_dtype: str) -> float:
        """Tensor-core peak for GEMMs whose inputs are `compute_dtype` (bf16, fp8, fp4 or int8), falling back
        to the next wider format the GPU has (weight-only quantisation). INT8 runs at the FP8 rate where the
        GPU has FP8 (Ada, Hopper, Blackwell, CDNA 3: H100 SXM 1,979 TOPS and TFLOP/s, L40S 733, MI300X 2,615)
        and at twice the 16-bit rate before it (Ampere: A100 624 TOPS against 312 TFLOP/s bf16)."""
        if compute_dtype == "int8":
            return self.fp8_flops_per_s or 2 * self.bf16_flops_per_s
        if compute_dtype == "fp4" and self.fp4_flops_per_s:
            return self.fp4_flops_per_s
        if compute_dtype in ("fp4", "fp8") and self.fp8_flops_per_s:
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s


# `memory_bytes` is what CUDA (or ROCm) reports as the device's total memory, since vLLM sizes its KV pool
# from it (gpu_memory_utilization x total): a card sold as "80 GB" has 80 GiB of HBM of which the driver
# keeps a little, so CUDA reports about 85.0e9 bytes (vLLM logs total_gpu_memory 79.15-79.2 GiB on
# H100/A100 80GB). Figures marked "est." were not read off a device: the datasheet's GiB less the ~1%
# the driver keeps. Interconnect: per-GPU, per-direction bandwidth the TP all-reduce can use (NVLink,
# PCIe, AMD Infinity Fabric). Every figure's source: docs/sources.md ("GPU catalog").
GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("a100-40gb", 312e12, 1555e9, 42.3e9, 300e9, 25e9,
            compute_capability="8.0", l2_bytes=40e6),   # est. memory
        GPU("a100-80gb", 312e12, 2039e9, 85.0e9, 300e9, 25e9, compute_capability="8.0", l2_bytes=40e6),
        GPU("h100-sxm", 989e12, 3350e9, 85.0e9, 450e9, 50e9, 1979e12, compute_capability="9.0", l2_bytes=50e6),
        GPU("h100-pcie", 756e12, 2000e9, 85.0e9, 300e9, 50e9, 1513e12,
            compute_capability="9.0", l2_bytes=50e6),   # NVLink bridge pairs
        GPU("h100-nvl", 835e12, 3900e9, 100.0e9, 300e9, 50e9, 1671e12,
            compute_capability="9.0", l2_bytes=50e6),   # 94 GB, est. memory
        GPU("h20", 148e12, 4000e9, 102.0e9, 450e9, 50e9, 296e12,
            compute_capability="9.0", l2_bytes=60e6),   # 96 GB, est. memory
        GPU("h200-sxm", 989e12, 4800e9, 150.0e9, 450e9, 50e9, 1979e12,
            compute_capability="9.0", l2_bytes=50e6),   # 141 GB, est. memory
        GPU("b200-sxm", 2250e12, 8000e9, 180e9, 900e9, 50e9, 4500e12, 9000e12,
            compute_capability="10.0", l2_bytes=126e6),   # HGX B200, NVLink 5
        # one Blackwell GPU of a GB200 superchip: NVLink 5 to the other GPUs, NVLink-C2C to its Grace CPU
        GPU("gb200", 2500e12, 8000e9, 186e9, 900e9, 450e9, 5000e12, 10000e12,
            compute_capability="10.0", l2_bytes=126e6),
        GPU("l4", 121e12, 300e9, 23.7e9, 32e9, 25e9, 242e12, interconnect_kind="pcie",
            compute_capability="8.9", l2_bytes=48e6),
        GPU("l40", 181e12, 864e9, 47.7e9, 32e9, 25e9, 362e12, interconnect_kind="pcie",
            compute_capability="8.9", l2_bytes=96e6),
        GPU("l40s", 362e12, 864e9, 47.7e9, 32e9, 25e9, 733e12, interconnect_kind="pcie",
            compute_capability="8.9", l2_bytes=96e6),
        GPU("a10g", 70e12, 600e9, 23.7e9, 32e9, 25e9, interconnect_kind="pcie",
            compute_capability="8.6", l2_bytes=6e6),   # est. memory
        # GeForce Ada: BF16 with FP32 accumulate runs at half the FP16-accumulate rate; NVIDIA's driver gives
        # GeForce cards no GPU peer-to-peer access, so TP collectives go through host memory
        GPU("rtx-4090", 165.2e12, 1008e9, 25_250_627_584, 32e9, 25e9, 330.3e12, interconnect_kind="pcie_host",
            compute_capability="8.9", l2_bytes=72e6),
        # Blackwell, 96 GB GDDR7, est. memory; FLOP/s: half the sparse datasheet figures
        GPU("rtx-pro-6000", 500e12, 1792e9, 102.0e9, 64e9, 50e9, 1000e12, 2000e12, interconnect_kind="pcie",
            compute_capability="12.0", l2_bytes=128e6),
        # the Server Edition (passively cooled, 600 W): the same GB202 with 1,597 GB/s of GDDR7
        GPU("rtx-pro-6000-server", 500e12, 1597e9, 102.0e9, 64e9, 50e9, 1000e12, 2000e12, interconnect_kind="pcie",
            compute_capability="12.0", l2_bytes=128e6),
        GPU("mi300x", 1307.4e12, 5300e9, 205.8e9, 448e9, 50e9, 2614.9e12, interconnect_kind="infinity_fabric",
            l2_bytes=256e6),   # 192 GB HBM3, est. memory; l2: the 256 MB Infinity Cache
        GPU("mi325x", 1307.4e12, 6000e9, 274.4e9, 448e9, 50e9, 2614.9e12, interconnect_kind="infinity_fabric",
            l2_bytes=256e6),   # 256 GB HBM3E, est. memory
    ]
}
# Host memory per GPU of each part's NVIDIA reference server (system memory / 8 GPUs; docs/sources.md, "Host
# memory"): DGX A100 320GB 1 TB, DGX A100 640GB 2 TB, DGX H100 and DGX H200 2 TB, DGX B200 2 TB (4 TB
# optional), GB200 NVL72 480 GB of LPDDR5X per Grace CPU for its two GPUs. Other parts: no reference server.
_HOST_MEMORY_PER_GPU = {"a100-40gb": 128 * GIB, "a100-80gb": 256 * GIB, "h100-sxm": 256 * GIB,
                        "h200-sxm": 256 * GIB, "b200-sxm": 256 * GIB, "gb200": 240e9}
# How each GPU NVIDIA measured runs its 16-bit GEMMs where compute matters, from aiconfigurator's vLLM GEMM
# tables (torch's bf16 matmul as vLLM calls it; `python -m benchmarks.kernel_efficiency` prints each figure;
# docs/sources.md, "GEMM compute by GPU"):
# - the share of the datasheet dense peak large GEMMs sustain (m >= 2,048, n and k >= 4,096, median of
#   2 m n k / (latency x peak)). The peak is quoted at the boost clock; under a sustained tensor-core load
#   a GPU runs at the clock its power limit allows (the L40S's 350 W holds its 142 SMs well below boost).
#   The same package's TensorRT-LLM and SGLang tables rank the GPUs alike (L40S 0.52-0.57, B200 0.65-0.66,
#   A100 0.78-0.84, H100 0.76-0.77).
# - the ridge exponent p of (compute^p + memory^p)^(1/p) that zeroes the median error of the rows within
#   0.5-2x of the ridge (Efficiencies.gemm_ridge_exponent): how well the GPU's GEMMs overlap their tile loads
#   with the MMAs; Hopper's TMA pipelines overlap best, the A100's the least (1.47x max() on the ridge).
# (compute share, ridge exponent); the A100 40 GB is the same GA100 at the same 400 W and clocks as the
# 80 GB part the table measured. The RTX 4090 has no table: its share is the median of four RTX 4090s'
# torch bf16 matmuls in a public database (github.com/zzc0721/torch-performance-test-data: 162-173 TFLOP/s
# against the whitepaper's 165.2; a GeForce boost runs past its rated clock while its 450 W allow), and
# its ridge exponent the prior's pooled one (None). The H20 has none either: one cloud H20 in the same
# database reaches 141.9 of its 148 TFLOP/s (its tensor throughput is cut far below what its 400 W feed,
# so its clock is not power-bound as the H100's is); one measurement, its exponent the pooled one. The RTX
# PRO 6000 Workstation: one in the same database reaches 418 TFLOP/s, 0.84 of the 500 both editions are
# given here, where the Server Edition's table has 0.80: the same GB202 at the same 600 W, boosting to
# about 2.6 GHz (NVIDIA's 125 FP32 TFLOP/s over 24,064 cores) against the Server Edition's 2,430 MHz
# (0.80 x 2.6 / 2.43 = 0.86); its exponent, the same chip's, the Server Edition's. AMD's: the best shape of
# a brute-force search of torch bf16 matmuls (stas00/ml-engineering's "Maximum Achievable Matmul FLOPS"
# table: MI300X 668 TFLOP/s on ROCm 6.3, MI325X 785 at 1,000 W, both with PyTorch's TunableOp), of the
# 1,307 quoted at the 2.1 GHz peak clock, which a saturating matmul does not hold under the power limit; a
# best shape, so an upper bound on a model's shapes (the same table's NVIDIA rows sit 0-0.1 above the
# tables' medians), and far below the pooled 0.79.
GEMM_FIGURES = {"h100-sxm": (0.81, 2.85), "h200-sxm": (0.79, 2.6), "b200-sxm": (0.70, 2.05), "gb200": (0.63, 2.4),
                "a100-80gb": (0.90, 1.15), "a100-40gb": (0.90, 1.15), "l40s": (0.64, 2.6),
                "rtx-pro-6000-server": (0.80, 2.2), "rtx-4090": (1.01, None), "h20": (0.96, None),
                "rtx-pro-6000": (0.84, 2.2), "mi300x": (0.51, None), "mi325x": (0.60, None)}
# Streaming multiprocessors of the NVIDIA parts (CUDA cores per SM: 64 on the A100's GA100, 128 on Ada,
# Hopper and Blackwell; docs/sources.md, "SM counts"). The A10G, H20 and the datacenter Blackwell parts
# (whose prefill runs FlashInfer's kernels, not FlashAttention's) are left out.
SM_COUNTS = {"a100-40gb": 108, "a100-80gb": 108, "h100-sxm": 132, "h100-pcie": 114, "h100-nvl": 132, "h200-sxm": 132,
             "l4": 58, "l40": 142, "l40s": 142, "rtx-4090": 128, "rtx-pro-6000": 188, "rtx-pro-6000-server": 188}
GPUS = {name: replace(g, host_memory_bytes=_HOST_MEMORY_PER_GPU.get(name),
                      gemm_compute=GEMM_FIGURES.get(name, (None, None))[0],
                      gemm_ridge_exponent=GEMM_FIGURES.get(name, (None, None))[1],
                      sm_count=SM_COUNTS.get(name))
        for name, g in GPUS.items()}
# Other spellings people use for the same parts, and the names nvidia-smi reports (lower case, spaces as
# hyphens): "NVIDIA H100 80GB HBM3" is the SXM5 part, "NVIDIA A100-SXM4-80GB" the 80 GB SXM4 one
GPU_ALIASES = {"h100": "h100-sxm", "h100-80gb": "h100-sxm", "h200": "h200-sxm", "b200": "b200-sxm",
               "rtx4090": "rtx-4090", "rtx-pro-6000-blackwell": "rtx-pro-6000",
               "h100-pcie-80gb": "h100-pcie", "h100-80gb-hbm3": "h100-sxm", "h100-sxm5-80gb": "h100-sxm",
               "h100-sxm-80gb": "h100-sxm", "a100-sxm4-80gb": "a100-80gb", "a100-sxm4-40gb": "a100-40gb"}
INTERCONNECT_KINDS = ("nvlink", "pcie", "pcie_host", "infinity_fabric")


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shapes. Dense by default; `num_experts` > 0 makes `num_moe_layers` of its layers MoE
    (routed experts of `moe_intermediate_size`, plus shared experts); `kv_lora_rank` > 0 makes attention
    MLA (DeepSeek-V2/V3: a compressed KV of kv_lora_rank + qk_rope_head_dim per token and layer)."""
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int        # dense layers' MLP width
    vocab_size: int
    max_model_len: int
    gated_mlp: bool = True        # SwiGLU (gate + up + down); False for OPT-style fc1/fc2
    tie_embeddings: bool = False  # LM head shares the embedding matrix (weights counted once)
    head_dim: int | None = None   # None: hidden_size // num_heads (Qwen3, gpt-oss and Llama-4 set it apart)
    sliding_window: int | None = None  # tokens a sliding-window layer attends to (None: full attention)
    num_sliding_layers: int = 0   # layers with the window (Mistral v0.1: all; gpt-oss: every other one)
    num_experts: int = 0          # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0    # top-k
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # all shared experts of a MoE layer together
    num_moe_layers: int = 0
    kv_lora_rank: int = 0         # MLA: compressed KV width
    qk_rope_head_dim: int = 0     # MLA: decoupled rotary part of Q and K (cached beside the latent)
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0          # MLA: compressed Q width (0: Q projected directly, DeepSeek-V2-Lite)
    quantization: str | None = None  # the checkpoint's own weight format (config.json quantization_config)

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def family(self) -> str:
        return ("mla-" if self.is_mla else "") + ("moe" if self.is_moe else "dense")

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def param_counts(self) -> dict[str, int]:
        """Parameters by kind, whole model: embedding, lm_head, attention (all layers), dense_mlp (the dense
        layers), experts (routed, all of them), shared (shared experts and routers), norms."""
        h, hd, mlp = self.hidden_size, self.head_dim, 3 if self.gated_mlp else 2
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk if self.q_lora_rank
                 else h * self.num_heads * qk)
            attn = (q + h * (self.kv_lora_rank + self.qk_rope_head_dim)
                    + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
                    + self.num_heads * self.v_head_dim * h)
        else:
            q, kv = self.num_heads * hd, self.num_kv_heads * hd
            attn = h * (q + 2 * kv) + q * h
        return {"embedding": self.vocab_size * h, "lm_head": 0 if self.tie_embeddings else self.vocab_size * h,
                "attention": self.num_layers * attn,
                "dense_mlp": self.num_dense_layers * mlp * h * self.intermediate_size,
                "experts": self.num_moe_layers * self.num_experts * 3 * h * self.moe_intermediate_size,
                "shared": self.num_moe_layers * (3 * h * self.shared_expert_intermediate_size + h * self.num_experts),
                "norms": self.num_layers * 2 * h + h}

    @property
    def num_params(self) -> int:
        return sum(self.param_counts().values())

    @property
    def num_active_params(self) -> int:
        """Weights one decode step of one sequence reads: all but the embedding table (one row), with the
        routed experts counted experts_per_token of num_experts."""
        p = self.param_counts()
        if self.is_moe:
            p["experts"] = p["experts"] * self.experts_per_token // self.num_experts
        return sum(p.values()) - (0 if self.tie_embeddings else p["embedding"])  # the LM head is read, not the embedding

    def kv_width(self, tp: int = 1) -> int:
        """KV cache elements per token and layer on one of `tp` GPUs: K and V of the local KV heads (KV heads
        split by TP, replicated when TP exceeds them); for MLA the latent plus the rotary key, which every
        TP rank holds whole (vLLM replicates the MLA cache across TP ranks)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: float = 2, tp: int = 1) -> int:
        """KV of every layer for one token, on one of `tp` GPUs (pipeline stages divide it further): what a
        whole sequence's KV weighs. How many tokens the pool holds is the engine's business: vLLM's hybrid
        KV cache manager keeps only a sliding-window layer's window (simcore/hybridkv.py)."""
        return int(self.num_layers * self.kv_width(tp) * dtype_bytes)


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
        ModelShape("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        ModelShape("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
        ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768),
        ModelShape("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, gated_mlp=False, tie_embeddings=True),
        # A small Llama-shaped decoder for CPU calibration, the real backend and tests.
        ModelShape("tiny", 4, 256, 4, 2, 512, 1024, 2048),
    ]
}

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


class CatalogError(ValueError):
    """A model, GPU or config file that cannot be resolved; the message names it."""


def get_gpu(name: str) -> GPU:
    key = name.lower()
    try:
        return GPUS[GPU_ALIASES.get(key, key)]
    except KeyError:
        raise CatalogError(f"unknown hardware {name!r}; known: {', '.join(GPUS)}, a mapping of datasheet "
                           f"figures, or a YAML/JSON file of them (docs/hardware.md)") from None


def get_model(name_or_path: str) -> ModelShape:
    """A catalog name, the path of a Hugging Face config.json (or a folder holding one), or a name either
    stands for (costmodels/model_names.py: 'meta-llama/Llama-3.1-8B-Instruct' is llama-3.1-8b), or a quantised
    checkpoint of one ('RedHatAI/phi-4-FP8-dynamic': phi-4 with `quantization` fp8, the checkpoint's format;
    '-quantized.w4a16', '-AWQ': int4; '-quantized.w8a8': int8)."""
    if name_or_path.lower() in MODELS:
        return MODELS[name_or_path.lower()]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    from costmodels.hfconfig import model_from_hf_config, packaged_config
    from costmodels.model_names import catalog_alias, packaged_alias, quantized_base, unknown_model_message
    if path.suffix == ".json" or path.exists():
        return model_from_hf_config(path)
    alias = catalog_alias(name_or_path, MODELS)
    if alias is not None:
        return MODELS[alias]
    hf_id = name_or_path if packaged_config(name_or_path) is not None else packaged_alias(name_or_path)
    if hf_id is not None:   # "Qwen/Qwen3-30B-A3B": a config.json this package or the [aic] extra ships
        return model_from_hf_config(packaged_config(hf_id))
    quantized = quantized_base(name_or_path)
    if quantized is not None:   # a quantised checkpoint of a model we know: its shape, the checkpoint's weights
        try:
            m = get_model(quantized[0])
        except CatalogError:
            pass
        else:
            return replace(m, quantization=m.quantization or quantized[1])
    raise CatalogError(unknown_model_message(name_or_path, list(MODELS)))


def with_max_model_len(model: ModelShape, max_model_len: int) -> ModelShape:
    return replace(model, max_model_len=max_model_len)


def __getattr__(name):  # `from costmodels.catalog import model_from_hf_config` keeps working
    if name == "model_from_hf_config":
        from costmodels.hfconfig import model_from_hf_config
        return model_from_hf_config
    raise AttributeError(name)

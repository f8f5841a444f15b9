"""Memory of MXFP4 routed experts (gpt-oss's checkpoint format) as vLLM holds them once loaded. vLLM picks
an MoE kernel by the GPU, pads the experts' dimensions to that kernel's tiles, and converts the weights to
the kernel's layout. The count of the checkpoint's own tensors (0.5 byte a value, one 8-bit scale per 32
values) is therefore short of what vLLM reports as "Model loading took".

Kernels, by GPU (CUDA; vllm/model_executor/layers/quantization/mxfp4.py `get_mxfp4_backend` in vLLM 0.10 to
0.14, `Mxfp4MoEMethod.create_weights` for the padding, `process_weights_after_loading` for what stays
loaded):

- Hopper (FP8 tensor cores, no FP4), `triton`: OpenAI's triton_kernels `matmul_ogs`, vLLM's default
  there when triton_kernels is installed. The intermediate size is padded to a multiple of 64 (a no-op for
  gpt-oss's 2,880). The values and scales are swizzled into the kernel's layout. The swizzled scales live in
  the kernel's PrecisionConfig, while the checkpoint's `w13_weight_scale` / `w2_weight_scale` Parameters stay
  registered, so the scales are held twice. The biases are converted to fp32.
- no FP8 tensor cores (SM80 and older), `marlin`: the Marlin MoE kernel needs n % 256 == 0 and
  k % 128 == 0, so the hidden size is padded to a multiple of 256 and the intermediate size to a multiple
  of 128. Biases stay bf16.
- Blackwell (FP4 tensor cores), `trtllm`: FlashInfer's TRT-LLM MoE; both sizes are padded to a multiple of
  256, and the biases are converted to fp32.

Measured for gpt-oss-120b on one H100, "Model loading took": 64.38 GiB with the Triton backend
(vllm-project/vllm issue #33155, vLLM 0.14.1, "Using Triton backend"; the same in llm-d's vLLM 0.11.0
measurement, llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md); 65.97 GiB with
Marlin (vllm-project/vllm issue #23278, vLLM 0.10). The rules here give 64.18 and 65.90 GiB. vLLM 0.32's
MXFP4 oracle deletes the checkpoint's scale Parameters after the swizzle
(vllm/model_executor/layers/fused_moe/oracle/mxfp4.py: "drop the now-dead weight/scale Parameters"). The
count here follows the versions that public logs measure, and is about 3.3 GiB above 0.32's.
"""
from __future__ import annotations

from costmodels.catalog import GPU, ModelShape

MXFP4_BLOCK = 32   # values per 8-bit (e8m0) scale: OCP Microscaling (MX) v1.0


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def mxfp4_moe_backend(gpu: GPU) -> str | None:
    """The MoE kernel vLLM picks for MXFP4 experts on `gpu`, or None where it is not modelled (ROCm)."""
    if gpu.interconnect_kind == "infinity_fabric":
        return None
    if gpu.fp4_flops_per_s:
        return "trtllm"
    return "triton" if gpu.fp8_flops_per_s else "marlin"


def padded_sizes(backend: str, hidden_size: int, intermediate_size: int) -> tuple[int, int]:
    """(hidden, intermediate per shard) after the kernel's padding (`Mxfp4MoEMethod.create_weights`)."""
    if backend == "marlin":
        return _round_up(hidden_size, 256), _round_up(intermediate_size, 128)
    if backend == "trtllm":
        return _round_up(hidden_size, 256), _round_up(intermediate_size, 256)
    return hidden_size, _round_up(intermediate_size, 64)


def expert_bytes_per_gpu(model: ModelShape, gpu: GPU, tp: int = 1, ep: int = 1) -> float | None:
    """Bytes of one GPU's MXFP4 routed experts (gate/up, down, their scales and biases) as vLLM holds them
    on `gpu`: without expert parallelism (`ep` 1) every expert, its intermediate size split over `tp`; with
    it, 1/`ep` of the experts whole. None where the kernel is not modelled."""
    backend = mxfp4_moe_backend(gpu)
    if backend is None:
        return None
    shards = 1 if ep > 1 else tp
    h, i = padded_sizes(backend, model.hidden_size, model.moe_intermediate_size // shards)
    per_expert = 3 * h * i   # w13 (2i x h) and w2 (h x i)
    scale_copies = 2 if backend == "triton" else 1
    bias_bytes = 2 if backend == "marlin" else 4
    per_expert_bytes = per_expert * (0.5 + scale_copies / MXFP4_BLOCK) + (2 * i + h) * bias_bytes
    return model.num_moe_layers * model.num_experts / ep * per_expert_bytes

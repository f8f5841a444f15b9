"""MXFP4 routed experts as vLLM holds them (costmodels/mxfp4_moe.py): the kernel vLLM picks by GPU, its
padding, the scales the Triton kernel keeps twice, and gpt-oss-120b's weights on one H100 against what
vLLM logs."""
import pytest

from costmodels import get_gpu, get_model
from costmodels.catalog import ModelShape
from costmodels.deployment import Deployment, weight_bytes_per_gpu
from costmodels.mxfp4_moe import expert_bytes_per_gpu, mxfp4_moe_backend, padded_sizes

GiB = 2**30


@pytest.mark.parametrize("gpu, backend", [("h100-sxm", "triton"), ("h200-sxm", "triton"), ("a100-80gb", "marlin"),
                                          ("b200-sxm", "trtllm"), ("mi300x", None)])
def test_the_kernel_follows_the_gpu(gpu, backend):
    assert mxfp4_moe_backend(get_gpu(gpu)) == backend


def test_padding_follows_each_kernels_tiles():
    # gpt-oss: hidden 2,880, intermediate 2,880 (45 x 64, not a multiple of 128 or 256)
    assert padded_sizes("triton", 2880, 2880) == (2880, 2880)
    assert padded_sizes("marlin", 2880, 2880) == (3072, 2944)   # n % 256, k % 128
    assert padded_sizes("trtllm", 2880, 2880) == (3072, 3072)
    assert padded_sizes("triton", 2880, 1440 + 16) == (2880, 1472)   # a TP shard off the 64 grid


def test_one_expert_layer_counted_by_hand():
    m = ModelShape("tiny-moe", num_layers=1, hidden_size=2880, num_heads=8, num_kv_heads=8, intermediate_size=2880,
                   vocab_size=1000, max_model_len=4096, num_experts=2, experts_per_token=1, moe_intermediate_size=2880,
                   num_moe_layers=1, quantization="mxfp4")
    per_expert = 3 * 2880 * 2880
    # Triton: half a byte a value, two copies of one 8-bit scale per 32 values, fp32 biases (gate/up 2i, down h)
    assert expert_bytes_per_gpu(m, get_gpu("h100-sxm")) == 2 * (per_expert * (0.5 + 2 / 32) + (2 * 2880 + 2880) * 4)
    # Marlin: padded to 3,072 x 2,944, one copy of the scales, bf16 biases
    padded = 3 * 3072 * 2944
    assert expert_bytes_per_gpu(m, get_gpu("a100-80gb")) == 2 * (padded * (0.5 + 1 / 32) + (2 * 2944 + 3072) * 2)
    # expert parallelism: half the experts each, whole
    assert expert_bytes_per_gpu(m, get_gpu("h100-sxm"), tp=2, ep=2) == expert_bytes_per_gpu(m, get_gpu("h100-sxm")) / 2


def test_gpt_oss_120b_weights_on_an_h100_are_what_vllm_logs():
    pytest.importorskip("aiconfigurator_core")   # gpt-oss-120b's config.json ships with it
    m = get_model("openai/gpt-oss-120b")
    checkpoint = weight_bytes_per_gpu(m, Deployment()) / GiB
    triton = weight_bytes_per_gpu(m, Deployment(), get_gpu("h100-sxm")) / GiB
    marlin = weight_bytes_per_gpu(m, Deployment(), get_gpu("a100-80gb")) / GiB
    assert checkpoint == pytest.approx(60.69, abs=0.01)
    # "Model loading took 64.38 GiB" (Triton backend: vllm-project/vllm #33155, llm-d's vLLM 0.11.0 run)
    assert triton == pytest.approx(64.38, abs=0.25)
    # "Model loading took 65.9651 GiB" (Marlin backend: vllm-project/vllm #23278)
    assert marlin == pytest.approx(65.97, abs=0.1)
    # a bf16 model is the same with or without the GPU
    llama = get_model("llama-3-8b")
    assert weight_bytes_per_gpu(llama, Deployment(), get_gpu("h100-sxm")) == weight_bytes_per_gpu(llama, Deployment())

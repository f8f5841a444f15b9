"""The KV pool the simulator sizes against vLLM's own block counts where they are known.

Figures (written here, sources named):
- H100 SXM 80GB, Llama-2-7B, fp16, TP1, vLLM 0.15.1, max_num_seqs 128, max_num_batched_tokens 2048,
  gpu_memory_utilization 0.9: 7,463 GPU blocks of 16 tokens (inference-sim's training repository,
  transcribed in ../shared/real-runs/README.md);
- RTX 4090 (CUDA total 25,250,627,584 B), Llama-3.1-8B, bf16, TP1, vLLM 0.19.0, max_num_seqs 256,
  max_num_batched_tokens 2048, gpu_memory_utilization 0.9: 2,588 GPU blocks of 16 tokens
  (LLMServingSim bench/examples/RTX4090/meta-llama/Llama-3.1-8B/vllm/meta.json, kv_cache.num_gpu_blocks).
"""
import pytest

from costmodels.catalog import get_gpu, get_model
from costmodels.deployment import Deployment, activation_reserve_bytes, kv_bytes_per_token, weight_bytes_per_gpu
from simcore.kvcache import plan_memory

KNOWN = [("h100-sxm", "llama-2-7b", "fp16", 128, 7463), ("rtx-4090", "llama-3.1-8b", "bf16", 256, 2588)]


@pytest.mark.parametrize("gpu,model,dtype,max_num_seqs,vllm_blocks", KNOWN)
def test_pool_matches_vllms_block_count(gpu, model, dtype, max_num_seqs, vllm_blocks):
    g, m, d = get_gpu(gpu), get_model(model), Deployment(dtype=dtype)
    plan = plan_memory(gpu_memory_bytes=g.memory_bytes, gpu_memory_utilization=0.9,
                       weight_bytes=weight_bytes_per_gpu(m, d), kv_bytes_per_token=kv_bytes_per_token(m, d),
                       block_size=16, activation_reserve_bytes=activation_reserve_bytes(m, d, 2048, max_num_seqs))
    assert plan.num_gpu_blocks == pytest.approx(vllm_blocks, rel=0.01)


def test_sampler_rows_grow_the_reserve():
    """vLLM's dummy sampler run sorts min(max_num_seqs, budget) full-vocabulary rows: more sequences, more
    reserve; a budget below max_num_seqs caps the rows."""
    m, d = get_model("llama-3.1-8b"), Deployment(dtype="bf16")
    assert activation_reserve_bytes(m, d, 2048, 256) > activation_reserve_bytes(m, d, 2048, 128)
    small = activation_reserve_bytes(m, d, 64, 256) - activation_reserve_bytes(m, d, 64, 64)
    assert small == 0

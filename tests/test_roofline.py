"""The roofline prior: monotone in tokens and context, sensible magnitudes against public figures."""
import numpy as np
import pytest

from costmodels import RooflineCostModel, get_gpu, get_model
from costmodels.catalog import model_from_hf_config, CatalogError
from experiments.simulate import memory_plan
from experiments.config import resolve_point

CM = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h100-sxm"))


def test_monotone_in_tokens_and_context():
    pre = [CM.step_time_s(prefill=[(n, 0)]) for n in (1, 16, 128, 512, 2048, 8192)]
    dec = [CM.step_time_s(decode=[ctx] * 32) for ctx in (16, 256, 1024, 4096, 8192)]
    bat = [CM.step_time_s(decode=[1024] * b) for b in (1, 8, 64, 256)]
    cached = [CM.step_time_s(prefill=[(512, c)]) for c in (0, 1024, 4096)]
    for seq in (pre, dec, bat, cached):
        assert np.all(np.diff(seq) > 0)


def test_magnitudes_match_public_figures():
    # batch-1 decode of an 8B bf16 model streams 16 GB of weights: ~5-8 ms on an H100 (3.35 TB/s)
    assert 5e-3 < CM.step_time_s(decode=[512]) < 8e-3
    # a 4096-token prefill is compute-bound: 2 * 8e9 * 4096 FLOP at 0.7-0.9 of 989 TFLOP/s
    assert 0.07 < CM.step_time_s(prefill=[(4096, 0)]) < 0.12
    # H200 has 43% more bandwidth: decode is faster, a big prefill about the same
    h200 = RooflineCostModel(get_model("llama-3-8b"), get_gpu("h200-sxm"))
    assert h200.step_time_s(decode=[512] * 8) < 0.8 * CM.step_time_s(decode=[512] * 8)
    assert h200.step_time_s(prefill=[(8192, 0)]) == pytest.approx(CM.step_time_s(prefill=[(8192, 0)]), rel=0.05)


def test_tensor_parallel_splits_work_and_adds_allreduce():
    m70 = get_model("llama-3-70b")
    tp4 = RooflineCostModel(m70, get_gpu("h100-sxm"), tp=4)
    tp8 = RooflineCostModel(m70, get_gpu("h100-sxm"), tp=8)
    assert tp8.step_time_s(decode=[1024] * 64) < tp4.step_time_s(decode=[1024] * 64)


def test_kv_blocks_from_memory():
    cfg = resolve_point({"model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"policy": "chunked_prefill"},
                         "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate_per_s": 1},
                                      "prompt_tokens": {"dist": "fixed", "value": 1},
                                      "output_tokens": {"dist": "fixed", "value": 1}}})
    plan = memory_plan(cfg)
    # 80 GB x 0.9 - 16 GB weights - activations, at 128 KiB per token: vLLM reports ~ 420-470K tokens
    assert 380_000 < plan.kv_capacity_tokens < 480_000
    assert plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_hf_config(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,'
                 ' "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256}')
    m = model_from_hf_config(f)
    assert (m.num_layers, m.head_dim, m.num_kv_heads, m.max_model_len) == (2, 16, 2, 256)
    f.write_text('{"hidden_size": 64}')
    with pytest.raises(CatalogError, match="config.json lacks required key"):
        model_from_hf_config(f)


def test_async_scheduling_hides_cpu_time_behind_the_gpu():
    """vLLM V1 async scheduling: a step takes max(GPU, CPU) instead of their sum (costmodels/roofline.py)."""
    from dataclasses import replace
    from costmodels.catalog import get_gpu, get_model
    from costmodels.roofline import Efficiencies, RooflineCostModel
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    on = RooflineCostModel(m, g)
    off = RooflineCostModel(m, g, eff=replace(Efficiencies(), async_scheduling=False))
    e = Efficiencies()
    batch = dict(decode=[1000] * 64)
    cpu = e.per_step_s + 64 * e.per_request_s
    assert off.step_time_s(**batch) - on.step_time_s(**batch) == pytest.approx(cpu, rel=1e-9)
    # a tiny GPU step on a slow CPU: the CPU time is the floor
    slow_cpu = RooflineCostModel(get_model("tiny"), g, eff=replace(Efficiencies(), per_step_s=0.05))
    assert slow_cpu.step_time_s(decode=[10]) == pytest.approx(0.05 + 6e-6)
    assert on.frontend == e.frontend and on.frontend.latency_s(1000) > on.frontend.latency_s(100) > 0

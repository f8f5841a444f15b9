"""FP8 linears priced as vLLM runs them (costmodels/roofline.py `Efficiencies.scaled_mm_*`): CUTLASS's
scaled_mm at its own measured fractions where the GPU has FP8 tensor cores, Marlin at the 16-bit rate where
it has not; the router and LM head in 16 bits; o_proj's input quantised by a kernel of its own; the attention
at the 16-bit rate whatever the cache, and an FP8 cache's decode on Hopper at FlashAttention 3's on-chip
rate. Hand-worked numbers."""
from __future__ import annotations

import pytest

from costmodels.catalog import GPUS, ModelShape
from costmodels.deployment import Deployment
from costmodels.roofline import Efficiencies, RooflineCostModel, _ridge

LLAMA_8B = ModelShape("llama-8b-like", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                      intermediate_size=14336, vocab_size=128256, max_model_len=8192, head_dim=128)


def model(gpu: str, quantization: str | None = None, kv: str = "auto") -> RooflineCostModel:
    return RooflineCostModel(LLAMA_8B, GPUS[gpu], deployment=Deployment(quantization=quantization, kv_cache_dtype=kv))


def test_an_fp8_gemm_at_scaled_mm_figures_on_an_h100():
    e, h100 = Efficiencies(), GPUS["h100-sxm"]
    cm = model("h100-sxm", "fp8")
    m, n, k = 2048, 14336, 4096
    # 2 x 2,048 x 14,336 x 4,096 FLOP at 0.54 of 1,979 TFLOP/s; bf16 activations, one-byte weights at 0.73 of DRAM
    compute = 2.0 * m * n * k / (1979e12 * e.scaled_mm_compute)
    memory = ((m * k + m * n) * 2 + n * k * 1) / (3350e9 * e.scaled_mm_memory)
    # near the ridge at the H100's own exponent, 2.85 (costmodels/catalog.py GEMM_FIGURES)
    assert cm._gemm_s(m, n, k) == pytest.approx(_ridge(compute, memory, 2.85) + 3.5e-6, rel=1e-12)
    assert cm._gemm_s(m, n, k) == pytest.approx(230.0e-6, rel=1e-3)   # 0.80 of the FP8 peak gave 157 us
    # the same layer in bf16 at 0.81 of 989 TFLOP/s (the H100's own figure): FP8 is 1.33x faster there, not 2x
    assert model("h100-sxm")._gemm_s(m, n, k) / cm._gemm_s(m, n, k) == pytest.approx(1.33, abs=0.01)
    assert h100.fp8_flops_per_s == 1979e12


def test_router_and_lm_head_run_in_16_bits_in_an_fp8_model():
    fp8, bf16 = model("h100-sxm", "fp8"), model("h100-sxm")
    # the LM head (128,256 x 4,096, bf16 weights) prices the same whatever the decoder's format
    assert fp8._gemm_s(4096, 128256, 4096, quantized=False) == bf16._gemm_s(4096, 128256, 4096)
    assert fp8._head_s(64) == bf16._head_s(64)


def test_fp8_weights_on_an_a100_are_marlin_at_the_16_bit_rate():
    a100 = model("a100-80gb", "fp8")
    assert not a100.scaled_mm
    e = Efficiencies()
    m, n, k = 2048, 14336, 4096
    compute = 2.0 * m * n * k / (312e12 * 0.90)   # the A100's own GEMM compute share (costmodels/catalog.py)
    memory = ((m * k + m * n) * 2 + n * k * 1) / (2039e9 * e.gemm_memory)
    assert a100._gemm_s(m, n, k) == pytest.approx(_ridge(compute, memory, 1.15) + 3.5e-6, rel=1e-12)   # the A100's own


def test_o_proj_input_is_quantised_by_a_kernel_of_its_own():
    e = Efficiencies()
    fp8, bf16 = model("h100-sxm", "fp8"), model("h100-sxm")
    # 64 tokens x 4,096 attention outputs: read 2 bytes, write 1, at 0.90 of DRAM x 2.4 (inside L2) + one launch
    extra = 64 * 4096 * 3 / (3350e9 * e.elementwise_memory * e.l2_speedup) + e.kernel_launch_s
    assert fp8._elementwise_s(64, 14336) - bf16._elementwise_s(64, 14336) == pytest.approx(extra, rel=1e-9)


def test_attention_runs_at_the_16_bit_rate_whatever_the_weights_or_the_cache():
    # NVIDIA's vLLM context-attention tables run no faster over an FP8 cache (FlashAttention 3 on Hopper:
    # 0.49 of the 16-bit peak against 0.54 over a bf16 one), so neither FP8 weights nor an FP8 cache move
    # the prefill attention off the 16-bit rate. 2,048 causal tokens, 32 heads of 128 over 8 KV heads, one
    # layer, tile by tile on the H100 (FA3: 128 x 128 tiles, the 4 query heads of a KV head packed into a
    # tile, so 64 query tiles of 32 positions whose KV tiles sum to 552; 132 SMs): 8 KV heads x (552 + 64 x
    # 3.45) / 132 SMs = 46.8 tiles of 4 x 128 x 128 x 128 FLOP at 0.66 of 989 / 132 TFLOP/s, + one launch;
    # on the B200 (FlashInfer) by FLOPs at 0.53.
    from costmodels.attention_kernel import prefill_compute_s, prefill_tile_shape, tile_seconds
    e = Efficiencies()
    prefill = [(2048, 0)]
    tiles = prefill_tile_shape(GPUS["h100-sxm"], 128)
    (_, rate, overhead), = [t for t in e.attention_tiles if t[0] == "fa3"]
    expected = prefill_compute_s(prefill, tiles, 132, 32, 8, tile_seconds(tiles, 128, 989e12 * rate / 132),
                                 overhead) + e.kernel_launch_s
    assert expected == pytest.approx(8 * (552 + 64 * overhead) / 132 * 4 * 128 ** 3 / (989e12 * rate / 132)
                                     + e.kernel_launch_s, rel=1e-12)
    for quantization, kv in ((None, "auto"), ("fp8", "auto"), (None, "fp8"), ("fp8", "fp8")):
        assert model("h100-sxm", quantization, kv)._prefill_attention_s(prefill) == pytest.approx(expected, rel=1e-12)
    flops = 4.0 * 128 * 32 * 2048 * (2048 + 1) / 2 / (2250e12 * e.attention_compute) + e.kernel_launch_s
    assert model("b200-sxm")._prefill_attention_s(prefill) == pytest.approx(flops, rel=1e-12)
    assert model("b200-sxm", kv="fp8")._prefill_attention_s(prefill) == model("b200-sxm")._prefill_attention_s(prefill)


def test_an_fp8_cache_on_hopper_streams_at_flashattention_3s_on_chip_rate():
    from costmodels.attention_kernel import fp8_kv_decode_on_chip_bound
    e = Efficiencies()
    assert fp8_kv_decode_on_chip_bound(GPUS["h100-sxm"], "fp8") and fp8_kv_decode_on_chip_bound(GPUS["h200-sxm"], "fp8")
    assert not fp8_kv_decode_on_chip_bound(GPUS["b200-sxm"], "fp8")   # FlashInfer: about the bf16 share of DRAM
    assert not fp8_kv_decode_on_chip_bound(GPUS["h100-sxm"], "bf16")
    # 64 sequences at context 2,048, 8 KV heads of 128: one layer's FP8 K and V are 64 x 2,048 x 2,048 bytes,
    # streamed at 2.4e-3 x 989e12 = 2.37 TB/s on an H100 (DRAM x 0.85 would be 2.85 TB/s), plus the queries
    kv = 64 * 2048 * 2048 * 1.0
    q = 2.0 * 2 * 64 * 4096
    per_layer = (kv + q) / (989e12 * e.fp8_kv_decode_bytes_per_flop) + e.decode_attention_fixed_s
    h100 = model("h100-sxm", kv="fp8")
    assert h100._decode_attention_s(64 * 2048.0, 64) == pytest.approx(32 * per_layer, rel=1e-12)
    # on an H200 the same rate although its DRAM is 43% faster: the cache's read no longer scales with DRAM
    assert model("h200-sxm", kv="fp8")._decode_attention_s(64 * 2048.0, 64) == pytest.approx(32 * per_layer, rel=1e-12)
    # a bf16 cache reads twice the bytes at 0.85 of DRAM: FP8 is 1.6x faster on an H100, not 2x
    bf16 = model("h100-sxm")._decode_attention_s(64 * 2048.0, 64)
    assert bf16 / h100._decode_attention_s(64 * 2048.0, 64) == pytest.approx(1.59, abs=0.01)


def test_the_tables_fp8_gemms_lose_the_quantisation_a_compiled_model_fuses():
    # aiconfigurator's FP8 rows time each linear with its input's quantisation; in a compiled vLLM model only
    # o_proj's input is quantised by a kernel of its own. The [aic] model takes that kernel, as the prior
    # prices it, out of every FP8 row and prices o_proj's once with the elementwise kernels, as the prior does.
    aic = pytest.importorskip("costmodels.aic")
    if aic.tables_root() is None:
        pytest.skip("aiconfigurator-core is not installed")
    d = Deployment(quantization="fp8")
    tables = aic.aic_cost_model("aic", LLAMA_8B, GPUS["h100-sxm"], d)
    prior = RooflineCostModel(LLAMA_8B, GPUS["h100-sxm"], deployment=d)
    assert "gemm_weights" in tables._g and tables.scaled_mm and prior.scaled_mm
    assert tables._elementwise_s(64, 14336) == prior._elementwise_s(64, 14336)
    for m, n, k in ((8, 6144, 4096), (2048, 28672, 4096)):
        row = tables._g["gemm_weights"](m, n, k)
        assert tables._gemm_s(m, n, k) == pytest.approx(row - prior.input_quant_s(m, k), rel=1e-12)
    # the quantisation kernel at 8 tokens: 8 x 4,096 x 3 bytes from L2, then the launch: about 2 us
    assert prior.input_quant_s(8, 4096) == pytest.approx(
        8 * 4096 * 3 / (3350e9 * 0.90 * 2.4) + 2e-6, rel=1e-12)
    # the bf16 rows (router, LM head) are as the table has them
    assert tables._gemm_s(8, 128256, 4096, quantized=False) == tables._g["gemm_bf16"](8, 128256, 4096)

"""A step mixing prefill chunks with decodes on FlashAttention 2 GPUs: the decodes re-read their KV once per
query head (costmodels/attention_kernel.py), priced by the prior (costmodels/roofline.py) and, from the
profiler's mixed rows, by an LLMServingSim profile (calibration/import_llmservingsim.py, costmodels/profile.py).
Hand-worked numbers throughout."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from calibration import import_llmservingsim as imp
from costmodels.attention_kernel import mixed_batch_rereads_kv
from costmodels.catalog import get_gpu, get_model
from costmodels.deployment import Deployment
from costmodels.gpuspec import gpu_from_mapping
from costmodels.profile import LogGrid
from costmodels.roofline import RooflineCostModel

LLAMA = get_model("llama-3.1-8b")   # 32 layers, 32 query heads over 8 KV heads of 128: 3 re-reads a KV head


def test_fa2_gpus_are_the_ones_vllm_runs_flash_attention_2_on():
    for name in ("rtx-4090", "rtx-pro-6000", "rtx-pro-6000-server", "l40s", "a100-80gb", "a10g"):
        assert mixed_batch_rereads_kv(get_gpu(name)), name
    for name in ("h100-sxm", "h200-sxm", "h20", "b200-sxm", "gb200", "mi300x"):   # FA3, FA4, ROCm
        assert not mixed_batch_rereads_kv(get_gpu(name)), name
    assert mixed_batch_rereads_kv(gpu_from_mapping({"base": "rtx-4090", "memory_bytes": 24e9}))   # rtx-4090-custom
    # the kernel follows the compute capability, not the name: a renamed card keeps its base's, and a GPU
    # described from scratch says its own (none given: no excess, as on AMD)
    assert mixed_batch_rereads_kv(gpu_from_mapping({"base": "l40s", "name": "my-ada-card"}))
    scratch = {"memory_bytes": 24e9, "hbm_bytes_per_s": 1e12, "interconnect_bytes_per_s": 32e9,
               "host_link_bytes_per_s": 25e9, "dense_flops_per_s": {"bf16": 100e12}}
    assert not mixed_batch_rereads_kv(gpu_from_mapping(scratch))
    for cc, fa2 in ((8.0, True), ("8.6", True), ("sm_89", True), ("12.0", True), (9, False), ("10.0", False)):
        assert mixed_batch_rereads_kv(gpu_from_mapping({**scratch, "compute_capability": cc})) is fa2, cc
    assert not mixed_batch_rereads_kv(gpu_from_mapping({"base": "a100-80gb", "compute_capability": None}))
    # FlashAttention 2 cannot read an FP8 cache: vLLM runs another backend there, without the excess
    assert not mixed_batch_rereads_kv(get_gpu("l40s"), "fp8") and mixed_batch_rereads_kv(get_gpu("l40s"), "bf16")
    fp8_cache = RooflineCostModel(LLAMA, get_gpu("l40s"), deployment=Deployment(kv_cache_dtype="fp8"))
    assert fp8_cache.step_terms_s(prefill=[(512, 0)], decode=[1024] * 64)["mixed_attention"] == 0.0


@pytest.mark.parametrize("bad", ["eight", "8.x", True, -1, "0.5"])
def test_a_compute_capability_that_is_not_major_minor_is_one_line_naming_the_key(bad):
    from costmodels.catalog import CatalogError
    with pytest.raises(CatalogError, match=r"^hardware\.compute_capability: expected NVIDIA's major\.minor"):
        gpu_from_mapping({"base": "l40s", "compute_capability": bad})


def test_rereads_from_l2_when_a_kv_heads_slice_fits():
    # 8 decodes at context 1,024 on an RTX 4090: one layer's decode KV is 2 B x 8,192 tokens x 2,048 (K and V
    # of 8 heads of 128) = 33,554,432 B; one KV head's slice 4.19 MB fits its 72 MB L2, so each of the 3
    # re-reads runs at 1,008e9 x 0.85 x 5.7 = 4.88376e12 B/s: 6.8706 us, x 3 x 32 layers = 0.65958 ms. The
    # 16-token chunk has one query tile, as every decode: no empty tiles.
    cm = RooflineCostModel(LLAMA, get_gpu("rtx-4090"))
    t = cm.step_terms_s(prefill=[(16, 0)], decode=[1024] * 8)
    assert t["mixed_attention"] == pytest.approx(33_554_432 / 4.88376e12 * 96, rel=1e-9)
    assert t["mixed_attention"] == pytest.approx(0.65958e-3, rel=1e-4)
    assert sum(t.values()) == pytest.approx(cm.step_time_s(prefill=[(16, 0)], decode=[1024] * 8), rel=1e-12)


def test_rereads_partly_from_dram_when_the_slice_outgrows_l2():
    # 128 decodes at 4,096 on an RTX 4090: 2 B x 524,288 x 2,048 = 2,147,483,648 B a layer, slice 268.4 MB; L2
    # holds 72e6 / 268,435,456 = 0.268221 of it: per re-read 2.1475e9 x (0.268221 / 4.88376e12 + 0.731779 /
    # 856.8e9) = 1.95207 ms, x 96 = 187.40 ms.
    cm = RooflineCostModel(LLAMA, get_gpu("rtx-4090"))
    t = cm.step_terms_s(prefill=[(16, 0)], decode=[4096] * 128)
    f = 72e6 / 268_435_456
    assert t["mixed_attention"] == pytest.approx(96 * 2_147_483_648 * (f / 4.88376e12 + (1 - f) / 856.8e9), rel=1e-9)
    assert t["mixed_attention"] == pytest.approx(0.18740, rel=1e-4)


def test_no_rereads_without_a_prefill_chunk_or_on_hopper():
    cm = RooflineCostModel(LLAMA, get_gpu("rtx-4090"))
    assert cm.step_terms_s(decode=[1024] * 8)["mixed_attention"] == 0.0
    assert cm.step_terms_s(prefill=[(512, 0)])["mixed_attention"] == 0.0
    h100 = RooflineCostModel(LLAMA, get_gpu("h100-sxm"))
    assert h100.step_terms_s(prefill=[(16, 0)], decode=[1024] * 8)["mixed_attention"] == 0.0
    # the fast path's sums give the same step as the lists
    assert cm.step_time_sums_s([(16, 0)], 8, 8 * 1024) == cm.step_time_s(prefill=[(16, 0)], decode=[1024] * 8)


def test_empty_query_tiles_beside_a_longer_chunk():
    # FlashAttention 2's varlen grid gives every sequence the longest chunk's query tiles: a 2,048-token chunk
    # has 32 tiles of 64 rows, so each of 8 decodes adds 31 empty tiles a query head, 8 x 31 x 32 heads =
    # 7,936 CTAs a layer, over the RTX 4090's 128 SMs at 0.35 us each: 21.7 us a layer, 0.6944 ms over 32.
    cm = RooflineCostModel(LLAMA, get_gpu("rtx-4090"))
    rereads = cm.step_terms_s(prefill=[(16, 0)], decode=[1024] * 8)["mixed_attention"]
    t = cm.step_terms_s(prefill=[(2048, 0)], decode=[1024] * 8)
    assert t["mixed_attention"] - rereads == pytest.approx(32 * 7936 / 128 * 0.35e-6, rel=1e-9)
    assert t["mixed_attention"] - rereads == pytest.approx(0.6944e-3, rel=1e-4)
    assert sum(t.values()) == pytest.approx(cm.step_time_s(prefill=[(2048, 0)], decode=[1024] * 8), rel=1e-12)
    # two chunks without decodes: the 100-token one (2 tiles) gets the 2,048-token one's 32, 30 of them empty
    two = cm.step_terms_s(prefill=[(2048, 0), (100, 0)])["mixed_attention"]
    assert two == pytest.approx(32 * 30 * 32 / 128 * 0.35e-6, rel=1e-9)
    # an MHA model (no re-reads: one query head a KV head) still launches them; one chunk alone has none
    mha = RooflineCostModel(get_model("llama-2-7b"), get_gpu("a100-80gb"))
    assert mha.step_terms_s(prefill=[(512, 0)], decode=[700] * 4)["mixed_attention"] == \
        pytest.approx(32 * 4 * 7 * 32 / 108 * 0.35e-6, rel=1e-9)
    assert mha.step_terms_s(prefill=[(512, 0)])["mixed_attention"] == 0.0
    # FA3 (Hopper) and an FP8 cache (not FlashAttention 2) launch no such tiles; the sums path agrees
    h100 = RooflineCostModel(LLAMA, get_gpu("h100-sxm"))
    assert h100.step_terms_s(prefill=[(2048, 0)], decode=[1024] * 8)["mixed_attention"] == 0.0
    fp8 = RooflineCostModel(LLAMA, get_gpu("l40s"), deployment=Deployment(kv_cache_dtype="fp8"))
    assert fp8.step_terms_s(prefill=[(2048, 0)], decode=[1024] * 8)["mixed_attention"] == 0.0
    assert cm.step_time_sums_s([(2048, 0), (100, 3)], 8, 8 * 1024) == \
        cm.step_time_s(prefill=[(2048, 0), (100, 3)], decode=[1024] * 8)


def _attention_rows(extra_us):
    """A profiler grid: decodes {1, 2, 4}, contexts {16, 32}, chunks {16, 32}; decode-only 5 us x decodes,
    prefill-only 7 us, mixed = both + extra_us(decodes, context, chunk)."""
    rows = [(0, 0, n, k, 5.0 * n) for n in (1, 2, 4) for k in (16, 32)]
    rows += [(c, 0, 0, 0, 7.0) for c in (16, 32)]
    rows += [(c, 0, n, k, 5.0 * n + 7.0 + extra_us(n, k, c)) for n in (1, 2, 4) for k in (16, 32) for c in (16, 32)]
    rows += [(16, 0, 3, 16, 99.0)]   # off the powers-of-two grid (a skew point): not a knot
    return pd.DataFrame(rows, columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"])


def test_mixed_grid_is_the_kernel_less_its_parts_with_a_floor():
    grid = imp.mixed_attention_grid(_attention_rows(lambda n, k, c: n * k / 8 - 1.0))
    assert [np.exp(k).round().tolist() for k in grid.log_knots] == [[1, 2, 4], [16, 32], [16, 32]]
    assert grid(4, 32, 16) == pytest.approx(15e-6)    # 4 x 32 / 8 - 1 us
    assert grid(2, 16, 32) == pytest.approx(3e-6)
    assert grid(1, 16, 16) == pytest.approx(1e-6)
    floored = imp.mixed_attention_grid(_attention_rows(lambda n, k, c: -2.0))
    assert np.allclose(np.exp(floored.log_s), imp.MIXED_FLOOR_S)   # a kernel no slower than its parts: none
    assert grid(8, 32, 16) == pytest.approx(30e-6)    # beyond the last knot: linear in decodes
    assert grid(4, 32, 64) == pytest.approx(15e-6)    # flat in chunk


def test_profile_adds_the_mixed_grid_to_mixed_steps_only(tmp_path):
    from tests.test_import_llmservingsim import write_profiler
    folder = write_profiler(tmp_path / "p")
    att = pd.read_csv(folder / "tp1" / "attention.csv")
    att = att[(att["prefill_chunk"] == 0) | (att["n_decode"] == 0)]
    mixed = [(c, 0, n, k, 9.0 + n * k / 1e3 + 20.0 + c / 10 + 100.0) for c in (16, 256) for n in (1, 8, 64)
             for k in (16, 256, 4096)]   # 100 us over the parts everywhere
    pd.concat([att, pd.DataFrame(mixed, columns=att.columns)]).to_csv(folder / "tp1" / "attention.csv", index=False)
    out = tmp_path / "prof.json"
    assert imp.main([str(folder), "--out", str(tmp_path / "m"), "--fit", str(out)]) == 0
    profile = json.loads(out.read_text())
    assert profile["overheads"]["per_step_s"] == 0.0 and profile["overheads"]["per_request_s"] == 0.0
    assert LogGrid.from_dict(profile["families"]["mixed_attn"])(8, 256, 16) == pytest.approx(100e-6, rel=1e-3)
    from costmodels.profile import profile_cost_model
    cm = profile_cost_model(profile, LLAMA, get_gpu("rtx-4090"))
    without = dict(profile, families={k: v for k, v in profile["families"].items() if k != "mixed_attn"})
    base = profile_cost_model(without, LLAMA, get_gpu("rtx-4090"))
    mixed_step = cm.step_time_s(prefill=[(16, 0)], decode=[256] * 8) - base.step_time_s(prefill=[(16, 0)], decode=[256] * 8)
    assert mixed_step == pytest.approx(32 * 100e-6, rel=1e-3)   # 100 us in each of 32 layers
    assert cm.step_time_s(decode=[256] * 8) == base.step_time_s(decode=[256] * 8)
    assert cm.step_time_s(prefill=[(256, 0)]) == base.step_time_s(prefill=[(256, 0)])
    assert math.isfinite(cm.step_time_sums_s([(16, 0)], 8, 8 * 256))


def test_gemm_near_the_ridge_is_slower_than_the_larger_of_compute_and_memory():
    from costmodels.roofline import _ridge
    assert _ridge(1.0, 1.0, 3.0) == pytest.approx(2 ** (1 / 3))               # on the ridge: 1.2599x
    assert _ridge(3.0, 4.0, 3.0) == pytest.approx(4 * (1 + 27 / 64) ** (1 / 3))   # 4.4982
    assert _ridge(4.0, 3.0, 3.0) == _ridge(3.0, 4.0, 3.0)
    assert _ridge(1.0, 100.0, 3.0) == pytest.approx(100.0, rel=1e-6)       # far from it: max()
    # Llama-3.1-8B's gate_up (28,672 x 4,096) on an H100 at 285 tokens: compute 2 x 285 x 28,672 x 4,096 /
    # (989e12 x 0.81, the H100's own share) = 83.56 us, memory (234.9 MB + 285 x 32,768 x 2 B) / (3,350e9 x
    # 0.83) = 91.19 us; at the H100's own exponent 2.85, (83.56^2.85 + 91.19^2.85)^(1/2.85) = 111.63 us, + 3.5 us
    # fixed = 115.13 us (max() would say 94.69)
    cm = RooflineCostModel(LLAMA, get_gpu("h100-sxm"))
    tc = 2 * 285 * 28672 * 4096 / (989e12 * 0.81)
    tm = (285 * (4096 + 28672) * 2 + 28672 * 4096 * 2) / (3350e9 * 0.83)
    assert cm._gemm_s(285, 28672, 4096) == pytest.approx((tc ** 2.85 + tm ** 2.85) ** (1 / 2.85) + 3.5e-6, rel=1e-12)
    assert cm._gemm_s(285, 28672, 4096) == pytest.approx(115.13e-6, rel=1e-4)

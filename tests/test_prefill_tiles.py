"""Prefill attention tile by tile (costmodels/attention_kernel.py, `RooflineCostModel._prefill_attention_s`):
FlashAttention runs a chunk as query tiles, each a CTA walking its keys, one CTA per SM at a time."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from costmodels.attention_kernel import PrefillTiles, prefill_tile_shape, prefill_tiles
from costmodels.catalog import get_gpu, get_model
from costmodels.deployment import Deployment
from costmodels.gpuspec import gpu_from_mapping
from costmodels.roofline import Efficiencies, RooflineCostModel

LLAMA = get_model("llama-3.1-8b")   # 32 query heads over 8 KV heads of 128


def enumerate_tiles(prefill, block_m, block_n, window=None):
    """The definition, tile by tile: query tile i ends at row min((i + 1) block_m, n) and reads the c + that
    keys before it (at most window + block_m), in block_n-key tiles, the last half a tile on average."""
    total, units, longest, shortest = 0.0, 0, 0.0, math.inf
    for n, c in prefill:
        for i in range(math.ceil(n / block_m)):
            keys = c + min((i + 1) * block_m, n)
            if window is not None:
                keys = min(keys, window + block_m)
            total += keys / block_n + 0.5
            units += 1
            longest = max(longest, keys / block_n + 0.5)
            shortest = min(shortest, keys / block_n + 0.5)
    return total, units, longest, shortest


def test_closed_form_counts_the_tiles_one_by_one():
    rng = random.Random(7)
    for _ in range(500):
        prefill = [(rng.randint(1, 3000), rng.choice([0, rng.randint(0, 20000)])) for _ in range(rng.randint(1, 4))]
        bm, bn, window = rng.choice([64, 128, 192, 32.0]), rng.choice([64, 128]), rng.choice([None, 128, 4096])
        got, want = prefill_tiles(prefill, bm, bn, window), enumerate_tiles(prefill, bm, bn, window)
        assert got[0] == pytest.approx(want[0], abs=1e-9) and got[1] == want[1] and got[2] == pytest.approx(want[2])
        assert got[3] == pytest.approx(want[3])


def test_the_kernel_vllm_runs_a_prefill_with():
    fa2 = prefill_tile_shape(get_gpu("rtx-4090"), 128)
    assert fa2 == PrefillTiles("fa2", 64, 128, pack_gqa=False, split_kv=False)
    assert prefill_tile_shape(get_gpu("a100-80gb"), 64).block_n == 256
    assert prefill_tile_shape(get_gpu("l40s"), 256).block_n == 64
    assert prefill_tile_shape(get_gpu("h100-sxm"), 128) == PrefillTiles("fa3", 128, 128, pack_gqa=True, split_kv=True)
    h200 = prefill_tile_shape(get_gpu("h200-sxm"), 64)
    assert (h200.block_m, h200.block_n) == (192, 128)
    # FlashInfer on datacenter Blackwell, ROCm, no SM count, an FP8 cache on FA2: by FLOPs
    for name in ("b200-sxm", "gb200", "mi300x", "a10g", "h20"):
        assert prefill_tile_shape(get_gpu(name), 128) is None, name
    assert prefill_tile_shape(get_gpu("l40s"), 128, "fp8") is None
    assert prefill_tile_shape(get_gpu("h100-sxm"), 128, "fp8") is not None
    scratch = {"memory_bytes": 24e9, "hbm_bytes_per_s": 1e12, "interconnect_bytes_per_s": 32e9,
               "host_link_bytes_per_s": 25e9, "dense_flops_per_s": {"bf16": 100e12}, "compute_capability": "8.9"}
    assert prefill_tile_shape(gpu_from_mapping(scratch), 128) is None
    assert prefill_tile_shape(gpu_from_mapping({**scratch, "sm_count": 60}), 128).kernel == "fa2"


def prefill_s(gpu: str, new: int, cached: int) -> float:
    cm = RooflineCostModel(LLAMA, get_gpu(gpu), deployment=Deployment(dtype="bf16"))
    return cm._prefill_attention_s([(new, cached)])


def test_fa2_short_chunk_after_a_long_prefix_is_one_wave_of_whole_walks():
    """vLLM 0.19's own timings on an RTX 4090 (128 SMs): after 16,384 cached tokens a chunk of 16, 64 or 256
    tokens takes the same time (at most 4 query tiles x 32 heads = 128 CTAs, one wave, each walking the
    whole prefix), 512 twice that (two waves)."""
    base = prefill_s("rtx-4090", 16, 16384)
    assert prefill_s("rtx-4090", 64, 16384) == pytest.approx(base, rel=0.01)
    assert prefill_s("rtx-4090", 256, 16384) == pytest.approx(base, rel=0.02)
    assert prefill_s("rtx-4090", 512, 16384) == pytest.approx(2 * base, rel=0.05)
    # far above what its FLOPs or its bytes alone would take
    flops_bound = 4 * 128 * 32 * 16 * (16384 + 8.5) / (165.2e12 * Efficiencies().attention_compute)
    assert base > 10 * flops_bound


def test_fa2_ctas_of_equal_walks_take_whole_waves():
    # 512 new tokens after 4,096 cached on an RTX PRO 6000 Server (188 SMs): 8 query tiles x 32 heads = 256
    # CTAs, two waves. The shortest walks (4,096 + 64) / 128 + 0.5 = 33 KV tiles, +1.49 of overhead: 2 x
    # 34.49 = 68.98 tiles, above the fluid share 32 x ((8 x 4,096 + 64 x 28 + 512) / 128 + 0.5 x 8 + 8 x
    # 1.49) / 188 = 49.35 and the longest CTA's (4,608 / 128 + 0.5 + 1.49 = 37.99)
    from costmodels.attention_kernel import prefill_compute_s, tile_seconds
    gpu = get_gpu("rtx-pro-6000-server")
    tiles = prefill_tile_shape(gpu, 128)
    _, rate, overhead = next(t for t in Efficiencies().attention_tiles if t[0] == "fa2")
    assert overhead == 1.49
    tile_s = tile_seconds(tiles, 128, gpu.bf16_flops_per_s * rate / gpu.sm_count)
    assert prefill_compute_s([(512, 4096)], tiles, 188, 32, 8, tile_s, overhead) == pytest.approx(68.98 * tile_s)
    # 128 CTAs of fresh 64-token prompts are one wave of one KV tile each: the fluid share is below it
    assert prefill_compute_s([(64, 0)] * 4, tiles, 188, 32, 8, tile_s, overhead) == \
        pytest.approx((64 / 128 + 0.5 + overhead) * tile_s)


def test_fa3_splits_the_walk_of_a_short_chunk():
    """FlashAttention 3 splits the KV walk over idle SMs and packs the grouped query heads: a 16-token chunk
    after 6,000 cached tokens on an H100 is bound by reading that KV, not by one CTA's walk."""
    cm = RooflineCostModel(LLAMA, get_gpu("h100-sxm"), deployment=Deployment(dtype="bf16"))
    e = cm.eff
    kv_read = (2 * 16 * cm.q_dim * 2 + 2 * (6000 + 16) * cm.kv_dim) / (3350e9 * e.attention_memory)
    assert cm._prefill_attention_s([(16, 6000)]) == pytest.approx(kv_read + e.kernel_launch_s)


def test_a_gpu_without_an_sm_count_keeps_the_flop_price():
    e = Efficiencies()
    for gpu in ("b200-sxm", "mi300x"):
        g = get_gpu(gpu)
        flops = 4 * 128 * 32 * 2048 * (2048 + 1) / 2
        bytes_ = 2 * (2 * 2048 * 4096) + 2 * 2048 * 2048
        want = max(flops / (g.bf16_flops_per_s * e.attention_compute),
                   bytes_ / (g.hbm_bytes_per_s * e.attention_memory)) + e.kernel_launch_s
        assert prefill_s(gpu, 2048, 0) == pytest.approx(want)


def test_sliding_window_caps_the_walk():
    """A sliding-window layer's query tile reads at most window + block_m keys, however long the prefix."""
    mistral = get_model("mistralai/Mistral-7B-v0.1")   # every layer a 4,096-token window
    cm = RooflineCostModel(mistral, get_gpu("l40s"), deployment=Deployment(dtype="bf16"))
    w = mistral.sliding_window
    assert cm._prefill_attention_s([(512, 20000)], w) == pytest.approx(cm._prefill_attention_s([(512, 30000)], w))
    assert cm._prefill_attention_s([(512, 20000)]) > 2 * cm._prefill_attention_s([(512, 20000)], w)


def test_against_nvidias_context_attention_tables():
    """The prior's tile price against NVIDIA's vLLM context-attention tables (the [aic] extra), rows with
    head dim 128 and a bf16 cache: median |error| within 20% on the H100 (FA3) and A100 (FA2), where FLOPs
    alone are 37-48% fast (`python -m benchmarks.kernel_efficiency`)."""
    from costmodels import aic
    root = aic.tables_root()
    if root is None:
        pytest.skip("the [aic] extra (aiconfigurator-core) is not installed")
    import glob
    import pandas as pd
    for table, gpu, kernel in (("h100_sxm", "h100-sxm", "vllm_flash_attn_fa3"), ("a100_sxm", "a100-80gb", "vllm_flash_attn")):
        d = pd.read_parquet(sorted(glob.glob(f"{root}/{table}/attention/vllm/*/context_attention_perf.parquet"))[-1])
        d = d[(d.kernel_source == kernel) & (d.head_dim == 128) & (d.kv_cache_dtype == "bfloat16") & (d.isl >= 32)
              & (d.num_heads == 32) & (d.num_key_value_heads == 8)]
        if "window_size" in d:
            d = d[d.window_size == 0]
        cm = RooflineCostModel(LLAMA, get_gpu(gpu), deployment=Deployment(dtype="bf16"))
        priced = np.array([cm._prefill_attention_s([(int(n), 0)] * int(b)) for b, n in zip(d.batch_size, d.isl)])
        err = np.abs(priced / (d.latency.to_numpy() * 1e-3) - 1)
        assert len(err) > 50 and np.median(err) < 0.20, (gpu, np.median(err))


def test_a_profile_fits_its_prefill_timings_as_tiles(tmp_path):
    """An LLMServingSim profiler folder whose prefill chunks after 0-16,384 cached tokens follow FlashAttention 2's
    tiles on an RTX 4090: the profile keeps the tile fit (its held-out error far below the grid's, which
    cannot tell a chunk after a prefix from a fresh prompt of the same work) and prices with it."""
    import json

    import pandas as pd

    from calibration import import_llmservingsim as imp
    from costmodels.attention_kernel import PrefillTileFit
    from costmodels.profile import profile_cost_model
    from tests.test_import_llmservingsim import write_profiler
    truth = PrefillTileFit(prefill_tile_shape(get_gpu("rtx-4090"), 128), 128, 4.0e-6, 1.6, 2e-6)
    folder = write_profiler(tmp_path / "p")
    att = pd.read_csv(folder / "tp1" / "attention.csv")
    rng = np.random.default_rng(3)
    chunks = [(c, kv, 0, 0, truth.layer_s([(c, kv)], 32, 8) * 1e6 * rng.uniform(0.98, 1.02))
              for c in (16, 32, 64, 128, 256, 512, 1024, 2048) for kv in (0, 16, 128, 512, 2048, 8192, 16384)]
    att = pd.concat([att[att["prefill_chunk"] == 0], pd.DataFrame(chunks, columns=att.columns)])
    att.to_csv(folder / "tp1" / "attention.csv", index=False)
    out = tmp_path / "prof.json"
    assert imp.main([str(folder), "--out", str(tmp_path / "m"), "--fit", str(out)]) == 0
    profile = json.loads(out.read_text())
    report = profile["fit_report"]["prefill_attn"]
    assert "prefill_attn_tiles" in profile["families"] and "prefill_attn" not in profile["families"]
    assert report["held_out_median_ape"] < 3 < 15 < report["grid_held_out_median_ape"]
    cm = profile_cost_model(profile, LLAMA, get_gpu("rtx-4090"))
    for chunk in ((16, 16384), (512, 0), (2048, 4096)):
        assert cm.prefill_layer_s([chunk]) == pytest.approx(truth.layer_s([chunk], 32, 8), rel=0.05)
    assert cm.step_time_s(prefill=[(16, 16384)]) - cm.step_time_s(prefill=[(16, 0)]) == pytest.approx(
        32 * (truth.layer_s([(16, 16384)], 32, 8) - truth.layer_s([(16, 0)], 32, 8)), rel=0.05)


def test_tiles_only_where_they_predict_better():
    """Fresh prompts only (NVIDIA's tables: batch x prompt, nothing cached) are what the grid's coordinates
    describe exactly: the profile keeps the grid there; so it does on a device without FlashAttention."""
    import pandas as pd

    from calibration.fit import HELD_OUT_FRACTION, fit_family, family_points
    from calibration.prefill_tiles import fit_prefill_tiles
    truth_gpu = get_gpu("h100-sxm")
    cm = RooflineCostModel(LLAMA, truth_gpu, deployment=Deployment(dtype="bf16"))
    rows = [{"family": "prefill_attn", "batch_size": b, "new_tokens": n, "cached_tokens": 0, "num_heads": 32,
             "num_kv_heads": 8, "head_dim": 128, "latency_s": cm._prefill_attention_s([(n, 0)] * b) * (1 + 0.1 * (n < 100))}
            for b in (1, 2, 4, 8, 16) for n in (32, 64, 128, 256, 512, 1024, 2048, 4096)]
    frame = pd.DataFrame(rows).assign(op="", num_gpus=np.nan, m=np.nan, n=np.nan, k=np.nan)
    assert fit_prefill_tiles(frame, None, 32, 8, 128, HELD_OUT_FRACTION) is None
    tiles = fit_prefill_tiles(frame, truth_gpu, 32, 8, 128, HELD_OUT_FRACTION)
    _, grid_report, _ = fit_family(family_points(frame, LLAMA, 1)["prefill_attn"])
    assert tiles is not None and grid_report["held_out_median_ape"] <= tiles[1]["held_out_median_ape"]


def test_a_malformed_tile_family_is_one_line_naming_the_profile():
    from costmodels.catalog import CatalogError
    from costmodels.profile import profile_cost_model, read_profile
    from costmodels.selection import PROFILES_DIR
    profile = read_profile(PROFILES_DIR / "llama-3-8b__h100-sxm__tp1__bf16.json")
    tiles = {"kernel": "fa3", "block_m": 128, "block_n": 128, "pack_gqa": True, "split_kv": True, "sm_count": 132,
             "tile_s": 2e-6, "overhead": 3.0, "fixed_s": 1e-5}
    good = dict(profile, families={**profile["families"], "prefill_attn_tiles": tiles})
    cm = profile_cost_model(good, get_model("llama-3-8b"), get_gpu("h100-sxm"))
    assert cm.prefill_layer_s([(16, 0)]) > tiles["fixed_s"]
    for bad in ({**tiles, "tile_s": -1.0}, {k: v for k, v in tiles.items() if k != "sm_count"}):
        with pytest.raises(CatalogError) as e:
            profile_cost_model(dict(profile, families={**profile["families"], "prefill_attn_tiles": bad}),
                               get_model("llama-3-8b"), get_gpu("h100-sxm"), source="p.json")
        assert str(e.value).startswith("p.json: malformed profile") and "\n" not in str(e.value)

"""A kernel profile's prefill attention, fitted as FlashAttention runs it (costmodels/attention_kernel.py).

The profile's grid for prefill attention is indexed by sequences and an equivalent length (the fresh prompt
that does the same causal work), which cannot tell a short chunk after a long cached prefix from a fresh
prompt of the same work: the first walks the whole prefix in a few query tiles that leave most SMs idle,
the second fills them. Against vLLM 0.19's own chunk timings after 0-16,384 cached tokens (LLMServingSim's
profiler) that grid's held-out median error is 32-35%, above the bar a fit must pass. On a GPU whose
FlashAttention kernel and SM count are known, the profile instead keeps three figures fitted to its own
prefill timings: a tile's time, the tiles' worth each query tile adds and a fixed time per kernel
(least squares on log latency, a fifth of the rows held out, judged like every other family).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.loggrid_fit import split
from costmodels.attention_kernel import PrefillTileFit, prefill_tile_shape
from costmodels.catalog import GPU


def prefill_rows(frame: pd.DataFrame, heads: int, kv_heads: int, head_dim: int) -> pd.DataFrame:
    """The measured prefill-attention rows of this model's attention shape on one GPU."""
    p = frame[(frame["family"] == "prefill_attn") & (frame["num_heads"] == heads)
              & (frame["num_kv_heads"] == kv_heads) & (frame["head_dim"] == head_dim)]
    return p[["batch_size", "new_tokens", "cached_tokens", "latency_s"]].astype(float)


def predict(fit: PrefillTileFit, rows: pd.DataFrame, heads: int, kv_heads: int) -> np.ndarray:
    return np.array([fit.layer_s([(int(n), int(c))] * int(b), heads, kv_heads)
                     for b, n, c in rows[["batch_size", "new_tokens", "cached_tokens"]].to_numpy()])


def fit_prefill_tiles(frame: pd.DataFrame, gpu: GPU | None, heads: int, kv_heads: int, head_dim: int,
                      held_out_fraction: float, seed: int = 0) -> tuple[PrefillTileFit, dict, tuple] | None:
    """(fit, fit report, (measured, predicted, held-out mask)) of the tile model on the profile's prefill
    rows; None where the GPU's kernel or SM count is not known or there are too few rows to fit three
    figures and hold some out."""
    from scipy.optimize import least_squares
    tiles = prefill_tile_shape(gpu, head_dim) if gpu is not None else None
    rows = prefill_rows(frame, heads, kv_heads, head_dim)
    if tiles is None or len(rows) < 10:
        return None
    train, held = split(len(rows), held_out_fraction, seed)
    measured = rows["latency_s"].to_numpy()

    def model(p, part: pd.DataFrame) -> np.ndarray:   # p: tile time and fixed time in us, overhead in tiles
        fit = PrefillTileFit(tiles, gpu.sm_count, p[0] * 1e-6, p[1], p[2] * 1e-6)
        return predict(fit, part, heads, kv_heads)
    start = [4.0 * tiles.block_m * tiles.block_n * head_dim / (gpu.bf16_flops_per_s * 0.56 / gpu.sm_count) * 1e6,
             1.5, 2.0]
    p = least_squares(lambda p: np.log(model(p, rows[train])) - np.log(measured[train]), start,
                      bounds=([1e-3, 0.0, 0.0], [1e4, 20.0, 1e3])).x
    fit = PrefillTileFit(tiles, gpu.sm_count, p[0] * 1e-6, p[1], p[2] * 1e-6)
    predicted = predict(fit, rows, heads, kv_heads)
    err = np.abs(predicted / measured - 1)

    def pct(e: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(e, q)) * 100, 2) if len(e) else None
    report = {"num_points": int(len(rows)), "num_held_out": int(held.sum()),
              "held_out_median_ape": pct(err[held], 50), "held_out_p90_ape": pct(err[held], 90),
              "train_median_ape": pct(err[train], 50), "model": f"{tiles.kernel} tiles of {tiles.block_m} x "
              f"{tiles.block_n} on {gpu.sm_count} SMs: {p[0]:.3g} us a tile, +{p[1]:.2f} tiles a query tile, "
              f"+{p[2]:.2f} us"}
    return fit, report, (measured, predicted, held)

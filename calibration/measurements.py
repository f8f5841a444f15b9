"""The measurement format shared by capture (calibration.capture), the importer of published tables
(calibration.import_aic) and the fit: one CSV row per timed kernel shape, plus a metadata JSON.

Families and the columns that describe their shape (unused columns stay empty):
- gemm:          op (qkv, o, gate_up, down, lm_head or ""), m (tokens), n, k
- prefill_attn:  batch_size, new_tokens, cached_tokens (per sequence), num_heads, num_kv_heads, head_dim
- decode_attn:   batch_size, context_len (mean over the batch), num_heads, num_kv_heads, head_dim;
                 op "mixed" with `batch` holding the per-sequence contexts as JSON
- elementwise:   op (rmsnorm, rotary, silu_mul, residual_add, embedding), m (tokens)
- sampling:      m (sequences sampled)
- layer / iteration: batch = JSON {"prefill": [[new, cached], ...], "decode": [context, ...]}
- moe:           m (tokens entering the layer), n (expert width on this GPU), k (hidden), batch_size
                 (experts), top_k, imbalance (busiest expert's tokens over the mean)
- mla_prefill:   as prefill_attn; num_heads (this GPU's), num_kv_heads 1, head_dim = kv_lora_rank
- mla_decode:    as decode_attn, the same head columns
- gemm_fp8:      as gemm, fp8 inputs and weights
- allreduce:     op "tp<N>", m (tokens), n (hidden), num_gpus; the message is m x n elements
latency_s is the median over repeats on a GPU, the fastest repeat on a CPU (calibration.kernels.Timer);
p10_s/p90_s the spread; status "ok" or why the point failed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

COLUMNS = ["family", "op", "m", "n", "k", "batch_size", "new_tokens", "cached_tokens", "context_len",
           "num_heads", "num_kv_heads", "head_dim", "batch", "latency_s", "p10_s", "p90_s", "repeats",
           "flops", "bytes", "status", "top_k", "imbalance", "num_gpus"]
INT_COLUMNS = ["m", "n", "k", "batch_size", "new_tokens", "cached_tokens", "num_heads", "num_kv_heads",
               "head_dim", "repeats", "top_k", "num_gpus"]
NEW_COLUMNS = ("top_k", "imbalance", "num_gpus")   # added with MODEL_FAMILIES: older files lack them
FAMILIES = ("gemm", "prefill_attn", "decode_attn", "elementwise", "sampling", "layer", "iteration")
MODEL_FAMILIES = ("moe", "mla_prefill", "mla_decode", "gemm_fp8", "allreduce")   # per model and device
ALL_FAMILIES = FAMILIES + MODEL_FAMILIES
TABLE = "measurements.csv"
META = "meta.json"


class MeasurementError(ValueError):
    """A measurements folder that cannot be read; the message names the file."""


def to_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    for col in ("op", "batch", "status"):
        frame[col] = frame[col].astype(object).where(frame[col].notna(), "")
    return frame


def write(out_dir: Path, rows: list[dict], meta: dict) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    to_frame(rows).to_csv(out_dir / TABLE, index=False)
    (out_dir / META).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return out_dir / TABLE


def _numbers(table: Path, column: pd.Series, name: str, whole: bool) -> pd.Series:
    """A column as numbers (empty cells NaN): a cell that is not one, or a negative size or count, or a
    fractional count, names its line and column."""
    x = pd.to_numeric(column, errors="coerce")
    wrong = (x.isna() & column.notna()) | (x < 0) | ((x != x.round()) & x.notna() if whole else False)
    if wrong.any():
        i = int(wrong.to_numpy().nonzero()[0][0])
        what = "a whole number >= 0" if whole else "a number >= 0"
        v = column.iloc[i]
        raise MeasurementError(f"{table}: line {i + 2}: {name}: expected {what}, got "
                               f"{repr(v) if isinstance(v, str) else f'{v:g}'}")
    return x.astype("Int64") if whole else x.astype(float)


def read(in_dir: Path) -> tuple[pd.DataFrame, dict]:
    """The successful rows of a measurements folder and its metadata."""
    in_dir = Path(in_dir)
    table, meta_path = in_dir / TABLE, in_dir / META
    for path in (table, meta_path):
        if not path.exists():
            raise MeasurementError(f"{path}: missing (expected a folder written by calibration.capture or "
                                   f"calibration.import_aic)")
    try:
        frame = pd.read_csv(table, keep_default_na=True, dtype={"op": str, "batch": str, "status": str})
        meta = json.loads(meta_path.read_text())
    except (ValueError, OSError) as e:
        raise MeasurementError(f"{in_dir}: unreadable measurements ({str(e).splitlines()[0]})") from None
    if not isinstance(meta, dict) or ("model" not in meta and not isinstance(meta.get("model_shape"), dict)) \
            or not isinstance(meta.get("gpu", ""), str) or "gpu" not in meta:
        raise MeasurementError(f"{meta_path}: expected a JSON object with model (or model_shape) and gpu, as "
                               "calibration.capture writes it")
    for col in NEW_COLUMNS:
        if col not in frame.columns:
            frame[col] = float("nan")
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise MeasurementError(f"{table}: missing columns {missing}")
    for col in (*INT_COLUMNS, "context_len", "latency_s", "p10_s", "p90_s", "flops", "bytes", "imbalance"):
        frame[col] = _numbers(table, frame[col], col, whole=col in INT_COLUMNS)
    for col in ("op", "batch"):
        frame[col] = frame[col].astype(object).where(frame[col].notna(), "")
    ok = frame[(frame["status"] == "ok") & (frame["latency_s"] > 0)].reset_index(drop=True)
    return ok, meta

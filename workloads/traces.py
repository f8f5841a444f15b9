"""Trace replay: real request logs (Azure LLM 2023, Mooncake, BurstGPT, a generic CSV/JSONL) as workloads.

A trace keeps each request's arrival time, prompt and output length and, where the log has them, the
identities of its prompt's prefix blocks. Replay is open loop at the logged times (scaled by `time_scale`)
or closed loop, keeping only the lengths. Token contents, models and per-request sampling settings are
ignored: the simulator needs lengths, times and prefix identities only.

Generic format (`format: csv` or `jsonl`), one request per row or line:
  arrival_s        arrival time in seconds (any origin; rows are sorted by it)
  prompt_tokens    prompt length, an integer (rows with a zero prompt or output are dropped and counted)
  output_tokens    tokens generated, an integer
  max_new_tokens   optional: the client's max_tokens (>= output_tokens)
  prefix_block_ids optional: ids of the prompt's blocks of `prefix_block_tokens` tokens (a trace option,
                   default 512 as Mooncake), front first; equal ids at equal positions after equal
                   parents mean equal content (a CSV cell holds them space-separated)
  prefix_group     optional (instead of prefix_block_ids): requests with the same group share their first
  prefix_tokens    `prefix_tokens` prompt tokens (a shared system prompt)
"""
from __future__ import annotations

import csv
import dataclasses
import json
import warnings
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from simcore.kvcache import DEFAULT_BLOCK_SIZE
from simcore.request import RequestSpec
from workloads.errors import WorkloadError, check_keys, finite_number
from workloads.prefix import prefix_block_ids
from workloads.requests import Arrival, GeneratedRequests, clip_to_model, parse_long_prompts

FORMATS = ("azure", "mooncake", "burstgpt", "csv", "jsonl")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids each name 512 prompt tokens (FAST'25 release README)

# format -> (time column, time unit in seconds or "datetime", prompt column, output column)
_COLUMNS = {
    "azure": ("TIMESTAMP", "datetime", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", 1e-3, "input_length", "output_length"),
    "burstgpt": ("Timestamp", 1.0, "Request tokens", "Response tokens"),
    "csv": ("arrival_s", 1.0, "prompt_tokens", "output_tokens"),
    "jsonl": ("arrival_s", 1.0, "prompt_tokens", "output_tokens"),
}
_IDS_COLUMN = {"mooncake": "hash_ids", "csv": "prefix_block_ids", "jsonl": "prefix_block_ids"}


@dataclass(frozen=True)
class Trace:
    """A loaded log, sorted by arrival. `arrival_s` starts at 0 (the first request). `prefix_ids[i]` names
    request i's prompt blocks of `prefix_block_tokens` tokens (None: no prefix information for it)."""
    path: str
    format: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    max_new_tokens: np.ndarray | None = None
    prefix_ids: tuple[tuple[int, ...] | None, ...] | None = None
    prefix_groups: np.ndarray | None = None  # generic format: (group index, shared prefix tokens) per request
    prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    num_dropped: int = 0  # rows with a zero length (BurstGPT's failed requests)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    def select(self, start_s: float = 0.0, end_s: float | None = None, num_requests: int | None = None) -> "Trace":
        """The requests arriving in [start_s, end_s), then the first `num_requests` of them; times shifted
        so that `start_s` is 0."""
        t = self.arrival_s
        keep = (t >= start_s) & (t < end_s if end_s is not None else True)
        idx = np.flatnonzero(keep)[:num_requests]
        pick = lambda a: None if a is None else a[idx]  # noqa: E731
        ids = None if self.prefix_ids is None else tuple(self.prefix_ids[i] for i in idx)
        return dataclasses.replace(self, arrival_s=t[idx] - start_s, prompt_tokens=self.prompt_tokens[idx],
                                   output_tokens=self.output_tokens[idx], max_new_tokens=pick(self.max_new_tokens),
                                   prefix_ids=ids, prefix_groups=pick(self.prefix_groups))

    def repeated_block_fraction(self) -> float | None:
        """Fraction of prefix blocks seen earlier in the trace: the hit rate of an infinite prefix cache
        at the trace's own block size (Mooncake reports 36.6% for its conversation trace)."""
        if self.prefix_ids is None:
            return None
        seen: set[int] = set()
        total = repeated = 0
        for ids in self.prefix_ids:
            if ids is None:
                continue
            total += len(ids)
            for h in ids:
                if h in seen:
                    repeated += 1
                else:
                    seen.add(h)
        return repeated / total if total else None


def _fail(path: str, line: int | None, column: str | int | None, msg: str):
    where = "".join([f": line {line}" if line is not None else "",
                     f", column {column}" if column is not None else ""])
    raise WorkloadError(f"{path}{where}: {msg}")


def _show(v) -> str:
    return repr(v.item() if isinstance(v, np.generic) else v)


def _int_column(df: pd.DataFrame, col: str, path: str, line_of, minimum: int = 1) -> np.ndarray:
    """Column `col` as positive integers, or a WorkloadError naming the first bad row."""
    if col not in df.columns:
        _fail(path, line_of(-1) if line_of(-1) > 0 else None, None,  # a CSV header is line 1
              f"missing column {col!r} (has {', '.join(map(str, df.columns))})")
    raw = df[col]
    num = pd.to_numeric(raw, errors="coerce")
    bad = num.isna() | ~np.isfinite(num) | (num < minimum) | (num != np.floor(num)) | (num >= 2**31)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        _fail(path, line_of(i), col, f"expected an integer >= {minimum}, got {_show(raw.iloc[i])}")
    return num.to_numpy().astype(np.int64)


def _read_csv(path: str) -> pd.DataFrame:
    try:
        with warnings.catch_warnings():
            # pandas only warns (and drops data, or takes a column as the index) when a row is too long
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(path, skipinitialspace=True, index_col=False)
    except pd.errors.EmptyDataError:
        _fail(path, None, None, "empty file")
    except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError) as e:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f)
            width = len(next(rows, []))
            for n, row in enumerate(rows, start=2):
                if len(row) != width:
                    _fail(path, n, len(row), f"expected {width} fields as in the header, saw {len(row)}")
        _fail(path, None, None, str(e).strip().splitlines()[-1])


def _read_jsonl(path: str) -> pd.DataFrame:
    """Every line a JSON object. Fast path: pandas; on a syntax error, find the line and column."""
    try:
        df = pd.read_json(path, lines=True, dtype=False)
    except ValueError:
        df = None
    if df is not None and len(df):
        return df
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = []
        for n, text in enumerate(f, start=1):
            if not text.strip():
                _fail(path, n, None, "empty line (one JSON object per line expected)")
            try:
                obj = json.loads(text.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                _fail(path, n, e.colno, f"invalid JSON ({e.msg})")
            if not isinstance(obj, dict):
                _fail(path, n, 1, "expected a JSON object")
            rows.append(obj)
    if not rows:
        _fail(path, None, None, "empty file")
    return pd.DataFrame.from_records(rows)


def _arrival_s(df: pd.DataFrame, col: str, unit, path: str, line_of) -> np.ndarray:
    if col not in df.columns:
        _fail(path, line_of(-1) if line_of(-1) > 0 else None, None,  # a CSV header is line 1
              f"missing column {col!r} (has {', '.join(map(str, df.columns))})")
    if unit == "datetime":
        t = pd.to_datetime(df[col], format="ISO8601", errors="coerce")
        if t.isna().any():
            i = int(np.flatnonzero(t.isna().to_numpy())[0])
            _fail(path, line_of(i), col, f"expected a timestamp like 2023-11-16 18:15:46.68, got {df[col].iloc[i]!r}")
        return (t - t.min()).dt.total_seconds().to_numpy()
    t = pd.to_numeric(df[col], errors="coerce")
    bad = t.isna() | ~np.isfinite(t) | (t < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        _fail(path, line_of(i), col, f"expected a non-negative time, got {_show(df[col].iloc[i])}")
    return t.to_numpy(dtype=float) * unit


def _ids(value, path: str, line: int, col: str) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, str):  # CSV cell: space-separated ids
        parts = value.split()
    elif isinstance(value, (list, tuple)):
        parts = value
    else:
        parts = [value]
    try:
        out = tuple(int(p) for p in parts if not isinstance(p, bool) and float(p) == int(p))
    except (TypeError, ValueError):
        out = ()
    if len(out) != len(parts):
        _fail(path, line, col, f"expected a list of integer block ids, got {value!r}")
    return out


def _prefix_ids(df: pd.DataFrame, fmt: str, path: str, line_of):
    col = _IDS_COLUMN.get(fmt)
    if col is not None and col in df.columns:
        ids = tuple(_ids(v, path, line_of(i), col) for i, v in enumerate(df[col].tolist()))
        return ids if any(x is not None for x in ids) else None
    return None


def _prefix_groups(df: pd.DataFrame, fmt: str, path: str, line_of) -> np.ndarray | None:
    """Generic format: `prefix_group` (any label) + `prefix_tokens` as (group index, tokens) rows."""
    if fmt not in ("csv", "jsonl") or "prefix_group" not in df.columns:
        return None
    groups = pd.factorize(df["prefix_group"])[0]  # -1 where a row has no group
    if "prefix_tokens" not in df.columns:
        _fail(path, line_of(-1) if line_of(-1) > 0 else None, None, "prefix_group needs a prefix_tokens column")
    shared = pd.to_numeric(df["prefix_tokens"], errors="coerce").fillna(-1).to_numpy()
    bad = (groups >= 0) & ((shared < 0) | (shared != np.floor(shared)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _fail(path, line_of(i), "prefix_tokens", f"expected an integer >= 0, got {_show(df['prefix_tokens'].iloc[i])}")
    return np.stack([groups, np.where(groups >= 0, shared, 0)], axis=1).astype(np.int64)


@lru_cache(maxsize=8)
def _load_cached(path: str, fmt: str, mtime_ns: int, prefix_block_tokens: int) -> Trace:
    time_col, unit, prompt_col, output_col = _COLUMNS[fmt]
    df = _read_jsonl(path) if fmt in ("mooncake", "jsonl") else _read_csv(path)
    header = 0 if fmt in ("mooncake", "jsonl") else 1
    line_of = lambda i: i + 1 + header  # noqa: E731  (file line of data row i; no multi-line cells)
    arrival = _arrival_s(df, time_col, unit, path, line_of)
    prompts = _int_column(df, prompt_col, path, line_of, minimum=0)
    outputs = _int_column(df, output_col, path, line_of, minimum=0)
    max_new = _int_column(df, "max_new_tokens", path, line_of) if "max_new_tokens" in df.columns else None
    if max_new is not None and (max_new < outputs).any():
        i = int(np.flatnonzero(max_new < outputs)[0])
        _fail(path, line_of(i), "max_new_tokens", f"{max_new[i]} < output_tokens {outputs[i]}")
    ids = _prefix_ids(df, fmt, path, line_of)
    groups = _prefix_groups(df, fmt, path, line_of)
    keep = (prompts > 0) & (outputs > 0)  # BurstGPT logs failed requests with 0 response tokens
    order = np.argsort(arrival[keep], kind="stable")
    idx = np.flatnonzero(keep)[order]
    if not len(idx):
        _fail(path, None, None, "no request with positive prompt and output lengths")
    t = arrival[idx]
    return Trace(path, fmt, t - t[0], prompts[idx], outputs[idx], None if max_new is None else max_new[idx],
                 None if ids is None else tuple(ids[i] for i in idx), None if groups is None else groups[idx],
                 prefix_block_tokens, num_dropped=int((~keep).sum()))


def load_trace(path: str, fmt: str, prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Read and validate a trace file (cached per path and modification time)."""
    if fmt not in FORMATS:
        raise WorkloadError(f"workload.trace.format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    try:
        mtime_ns = os.stat(path).st_mtime_ns
    except OSError:
        raise WorkloadError(f"{path}: no such trace file") from None
    if os.path.isdir(path):
        raise WorkloadError(f"{path}: is a folder, not a trace file")
    if not os.path.isfile(path):   # a pipe or a device would block the read
        raise WorkloadError(f"{path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise WorkloadError(f"{path}: cannot read the trace file (permission denied)")
    return _load_cached(os.path.abspath(path), fmt, mtime_ns, prefix_block_tokens)


def engine_block_ids(ids: tuple[int, ...], num_prompt_tokens: int, source_block_tokens: int,
                     block_size: int) -> tuple[int, ...]:
    """Map a prompt's source-block ids (e.g. Mooncake's 512-token hash_ids) onto the engine's blocks.

    Engine block k (tokens [k*bs, (k+1)*bs)) is named by the source block holding its last token and its
    position k; the chained hash over all earlier ids makes it equal for two prompts exactly when every
    source block it overlaps is equal. Only full engine blocks inside the named tokens get an id."""
    covered = min(num_prompt_tokens, len(ids) * source_block_tokens)
    out = []
    for k in range(covered // block_size):
        src = ids[((k + 1) * block_size - 1) // source_block_tokens]
        out.append(src * 2**20 + k % 2**20 if src >= 0 else src * 2**20 - k % 2**20)
    return tuple(out)


# ---- the sweep's `workload: {trace: {...}}` ----

@dataclass(frozen=True)
class TraceWorkload:
    """Replay of a trace file. Open loop: request i arrives at (t_i - start_s) / time_scale. Closed loop
    (`concurrency` set): the lengths in trace order, sent by `concurrency` users as in synthetic closed-loop
    traffic; times are ignored. `max_new_tokens`: the client's max_tokens for every request (at least its
    output length), where the trace has none."""
    path: str
    format: str
    time_scale: float = 1.0
    start_s: float = 0.0
    end_s: float | None = None
    num_requests: int | None = None
    concurrency: int | None = None
    think_time_s: float = 0.0
    max_new_tokens: int | None = None
    prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    long_prompts: str = "reject"  # or "clip" (workloads/requests.py LONG_PROMPTS)

    @property
    def arrival(self):
        if self.concurrency is not None:
            return Arrival("closed", concurrency=self.concurrency, think_time_s=self.think_time_s)
        return Arrival("trace")

    def load(self) -> Trace:
        return load_trace(self.path, self.format, self.prefix_block_tokens).select(
            self.start_s, self.end_s, self.num_requests)


_TRACE_KEYS = {f.name for f in dataclasses.fields(TraceWorkload)}


def parse_trace_workload(spec, key: str = "workload.trace") -> TraceWorkload:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping with path and format")
    check_keys(key, spec, _TRACE_KEYS)
    for k in ("path", "format"):
        if not isinstance(spec.get(k), str) or not spec[k]:
            raise WorkloadError(f"{key}.{k}: required (a string)")
    if spec["format"] not in FORMATS:
        raise WorkloadError(f"{key}.format: expected one of {', '.join(FORMATS)}, got {spec['format']!r}")
    out = {"path": spec["path"], "format": spec["format"]}
    if "long_prompts" in spec:
        out["long_prompts"] = parse_long_prompts(spec["long_prompts"], f"{key}.long_prompts")
    for k in ("time_scale", "start_s", "end_s", "think_time_s"):
        if spec.get(k) is not None:
            out[k] = finite_number(f"{key}.{k}", spec[k], strict=k == "time_scale")
    for k in ("num_requests", "concurrency", "max_new_tokens", "prefix_block_tokens"):
        if spec.get(k) is not None:
            out[k] = finite_number(f"{key}.{k}", spec[k], minimum=1, integer=True)
    if out.get("end_s") is not None and out["end_s"] <= out.get("start_s", 0.0):
        raise WorkloadError(f"{key}.end_s: must be after start_s")
    if "think_time_s" in out and "concurrency" not in out:
        raise WorkloadError(f"{key}.think_time_s: only for closed-loop replay (set concurrency)")
    return TraceWorkload(**out)


def trace_specs(w: TraceWorkload, max_model_len: int, block_size: int = DEFAULT_BLOCK_SIZE):
    """The trace's requests as RequestSpecs (ids = row order after selection), fitted only to the model's
    hard limits (and counted; a too-long prompt is left for the engine to reject unless long_prompts: clip), with prefix ids mapped to `block_size`-token engine blocks."""
    tr = w.load()
    if not len(tr):
        raise WorkloadError(f"{w.path}: no request in the selected window")
    times = np.zeros(len(tr)) if w.concurrency is not None else tr.arrival_s / w.time_scale
    prompts, outputs, clipped_p, clipped_o = clip_to_model(tr.prompt_tokens, tr.output_tokens, max_model_len,
                                                           w.long_prompts)
    if tr.max_new_tokens is not None:
        max_new = tr.max_new_tokens
    elif w.max_new_tokens is not None:
        max_new = np.maximum(w.max_new_tokens, outputs)
    else:
        max_new = None
    specs = []
    for i in range(len(tr)):
        ids = tr.prefix_ids[i] if tr.prefix_ids is not None else None
        if ids is not None:
            ids = engine_block_ids(ids, int(prompts[i]), tr.prefix_block_tokens, block_size)
        elif tr.prefix_groups is not None and tr.prefix_groups[i, 0] >= 0:  # a shared system prompt
            g, shared = tr.prefix_groups[i]
            ids = prefix_block_ids(int(prompts[i]), block_size, int(g), int(shared), None)
        mn = None if max_new is None else int(min(max_new[i], max(1, max_model_len - prompts[i])))
        specs.append(RequestSpec(i, float(times[i]), int(prompts[i]), int(outputs[i]),
                                 None if mn is None else max(mn, int(outputs[i])), prefix_block_ids=ids))
    return GeneratedRequests(tuple(specs), int(clipped_p.sum()), int(clipped_o.sum()))

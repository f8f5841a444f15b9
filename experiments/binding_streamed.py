"""What bound a run whose iteration rows were streamed to its tables folder (experiments/simulate.py: one
engine or a cluster): experiments/binding.py's keys, and the prefill share of GPU time, from the iterations
table read back in chunks, so that a day of tens of replicas (tens of millions of steps) never holds its
rows at once. Three passes: the first finds where each replica's run drains (`admission_window`) and
counts the busy steps; the second classifies each step (`step_limits`, the same rules, row by row; one
byte a step kept); the third sums durations as numpy sums whole columns (simcore.pairwise), so every key
equals the in-memory analysis' bit for bit.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.binding import (DEMAND, LIMITS, STEP_COLUMNS, admission_limits, binding_name, lookup_by_replica,
                                 sampled_bounds, sampled_busy_steps, step_limits)
from experiments.tables import iter_table
from simcore.pairwise import StreamedSum

CHUNK_ROWS = 1 << 18   # steps read back at a time (about 23 MB as a frame; a Parquet row group)


def iteration_chunks(tables_dir, columns=STEP_COLUMNS):
    """The iterations table of `tables_dir` as frames of up to CHUNK_ROWS rows, in order."""
    yield from iter_table(Path(tables_dir), "iterations", list(columns), CHUNK_ROWS)


def _replica(chunk: pd.DataFrame) -> np.ndarray:
    return chunk["replica_id"].to_numpy() if "replica_id" in chunk else np.zeros(len(chunk), dtype=np.int64)


def _ordinals(replica: np.ndarray, seen: dict) -> np.ndarray:
    """Each row's place among its replica's rows so far (`seen`: rows per replica before this chunk, updated)."""
    out = np.empty(len(replica), dtype=np.int64)
    for r in np.unique(replica).tolist():
        idx = np.flatnonzero(replica == r)
        out[idx] = seen.get(r, 0) + np.arange(len(idx))
        seen[r] = seen.get(r, 0) + len(idx)
    return out


def _windows(tables_dir, drained: dict, columns=STEP_COLUMNS):
    """(chunk, its rows in the window: each replica's rows up to its drained step) in order."""
    seen: dict = {}
    for chunk in iteration_chunks(tables_dir, columns):
        replica = _replica(chunk)
        place = _ordinals(replica, seen)
        if drained:   # replica ids are small: a lookup array
            limit = np.full(max(int(replica.max()), max(drained)) + 1, np.iinfo(np.int64).max, dtype=np.int64)
            limit[list(drained)] = list(drained.values())
            yield chunk, place <= limit[replica]
        else:
            yield chunk, np.ones(len(chunk), dtype=bool)


def streamed_binding_keys(policy, requests: pd.DataFrame, tables_dir, num_blocks: int, block_size: int,
                          roofline=None, fell_behind: bool = False) -> dict:
    """experiments.binding.binding_keys, and `prefill_time_share`, over the streamed iterations table."""
    # the served requests' columns as numpy views, not a frame copied (a day's millions of requests)
    served = np.flatnonzero((requests["status"] != "rejected").to_numpy())
    arrival_s = requests["arrival_s"].to_numpy(float)
    last_arrival_s = float(arrival_s[served].max()) if len(served) else math.inf
    # pass 1: each replica's first step that starts after the last arrival and leaves nothing waiting
    # (admission_window: its later steps only drain), and the busy and prefill steps
    seen: dict = {}
    drained: dict = {}
    num_rows = num_busy = num_prefill = 0
    for chunk in iteration_chunks(tables_dir, ["start_s", "num_waiting", "prefill_tokens", "decode_tokens",
                                               "replica_id"]):
        replica = _replica(chunk)
        place = _ordinals(replica, seen)
        done = (chunk["start_s"].to_numpy(float) >= last_arrival_s) & (chunk["num_waiting"].to_numpy() == 0)
        for k in np.flatnonzero(done).tolist():
            drained.setdefault(int(replica[k]), int(place[k]))
        num_busy += int(((chunk["prefill_tokens"] + chunk["decode_tokens"]).to_numpy() > 0).sum())
        num_prefill += int((chunk["prefill_tokens"].to_numpy() > 0).sum())
        num_rows += len(chunk)
    if not num_rows or not len(served):   # binding_keys has nothing to say; the prefill share still
        all_s, prefill_s = StreamedSum(num_rows), StreamedSum(num_prefill)
        for chunk in iteration_chunks(tables_dir, ["duration_s", "prefill_tokens"]):
            dur = chunk["duration_s"].to_numpy(float)
            all_s.add(dur)
            prefill_s.add(dur[chunk["prefill_tokens"].to_numpy() > 0])
        busy_s = all_s.total()
        return {"prefill_time_share": prefill_s.total() / busy_s if busy_s > 0 else math.nan}
    # pass 2: each step of the window classified (one byte a step kept), the roofline's sampled steps
    limits = admission_limits(policy)
    watermark = int(getattr(policy, "watermark", 0.0) * num_blocks)   # vLLM V0 keeps 1% free at admission
    lookup = lookup_by_replica(requests["replica_id"].to_numpy(), arrival_s, requests["admitted_s"].to_numpy(float),
                               requests["finish_s"].to_numpy(float), requests["prompt_tokens"].to_numpy(),
                               requests["output_tokens"].to_numpy(), (requests["status"] == "finished").to_numpy(),
                               block_size, served)
    want = sampled_busy_steps(num_busy) if roofline is not None and num_busy else np.zeros(0, dtype=np.int64)
    sampled, busy_seen, codes = [], 0, []
    rows_by_replica: dict = {}
    first_start: dict = {}
    last_end: dict = {}
    for chunk, in_window in _windows(tables_dir, drained):
        if len(want):
            busy = np.flatnonzero((chunk["prefill_tokens"] + chunk["decode_tokens"]).to_numpy() > 0)
            pick = busy[np.isin(busy_seen + np.arange(len(busy)), want)]
            busy_seen += len(busy)
            if len(pick):
                sampled.append(chunk.iloc[pick])
        window = chunk if in_window.all() else chunk[in_window]   # (no copy of a whole chunk)
        if not len(window):
            continue
        codes.append(step_limits(window, None, limits, num_blocks, block_size, watermark, lookup))
        wrep = _replica(window)
        start = window["start_s"].to_numpy(float)
        end = start + window["duration_s"].to_numpy(float)
        for r in np.unique(wrep).tolist():
            m = wrep == r
            rows_by_replica[r] = rows_by_replica.get(r, 0) + int(m.sum())
            first_start[r] = min(first_start.get(r, math.inf), float(start[m].min()))
            last_end[r] = max(last_end.get(r, -math.inf), float(end[m].max()))
    codes = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int8)
    # pass 3: the durations summed as numpy sums whole columns (simcore.pairwise), by limit, by replica
    steps_by_limit = np.bincount(codes, minlength=len(LIMITS))
    all_s, prefill_s, window_s = StreamedSum(num_rows), StreamedSum(num_prefill), StreamedSum(len(codes))
    by_limit = [StreamedSum(int(k)) for k in steps_by_limit]
    by_replica = {r: StreamedSum(k) for r, k in rows_by_replica.items()}
    done = 0
    for chunk, in_window in _windows(tables_dir, drained, ["duration_s", "prefill_tokens", "replica_id"]):
        dur = chunk["duration_s"].to_numpy(float)
        all_s.add(dur)
        prefill_s.add(dur[chunk["prefill_tokens"].to_numpy() > 0])
        wdur = dur[in_window]
        window_s.add(wdur)
        c = codes[done:done + len(wdur)]
        done += len(wdur)
        for i, acc in enumerate(by_limit):
            acc.add(wdur[c == i])
        wrep = _replica(chunk)[in_window]
        for r, acc in by_replica.items():
            acc.add(wdur[wrep == r])
    idle_s = 0.0
    for r in sorted(by_replica):   # experiments.binding.idle_time_s
        idle_s += max(0.0, float(last_end[r] - first_start[r] - by_replica[r].total()))
    # experiments.binding.limit_fractions
    total = window_s.total() + idle_s
    out = {}
    for i, name in enumerate(LIMITS):
        out[f"bind_{name}_steps"] = float((codes == i).sum()) / max(1, len(codes))
        t = by_limit[i].total() + (idle_s if i == DEMAND else 0.0)
        out[f"bind_{name}_time"] = t / total if total > 0 else float("nan")
    if sampled:
        out.update(sampled_bounds(roofline, pd.concat(sampled), block_size))
    out["binding"] = binding_name(out, fell_behind)
    busy_s = all_s.total()
    out["prefill_time_share"] = prefill_s.total() / busy_s if busy_s > 0 else math.nan
    return out

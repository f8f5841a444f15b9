"""Run every point of a sweep (in parallel across local cores), saving each as soon as it finishes.

Output folder layout:
  results.csv                       one row per point and seed (rewritten after every finished point)
  sweep.yaml                        the sweep as given
  points/<point_id>/summary.json    that row, plus a hash of the point's configuration
  points/<point_id>/requests.parquet    per-request table
  points/<point_id>/iterations.parquet  per-iteration table
  points/<point_id>/itl.parquet         every inter-token gap of the run, pooled, as (gap_ms, count) samples
  points/<point_id>/config.yaml         the resolved configuration (defaults filled in)
(the three tables as .csv with `--tables csv`; experiments/tables.py writes and reads them).
A rerun into the same folder skips every point whose summary.json matches its configuration, so an
interrupted sweep loses nothing.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from commandline.interrupts import raise_if_interrupted
from commandline.files import content_hash, write_csv_atomic, write_json_atomic
from experiments.answer_basis import vllm_version_column
from experiments.executors import open_executor
from experiments.offload_report import with_offload_columns
from experiments.config import Point, expand
from experiments.simulate import SimResult, simulate
from experiments.tables import write_run_tables
from simcore.metrics import untrusted_notes

SUMMARY_COLUMNS = ["offered_rate_per_s", "throughput_rps", "output_tok_per_s", "ttft_p50_ms", "ttft_p99_ms",
                   "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
                   "num_preemptions", "mean_running", "kv_usage_max", "num_rejected", "unstable"]


@dataclass
class SweepResult:
    results: pd.DataFrame                       # one row per point and seed
    points: dict[str, SimResult] = field(default_factory=dict)  # per point id, when kept in memory
    num_skipped: int = 0


RESULTS_VERSION = 2  # bump when a point's results change meaning (2: long prompts rejected, load flags)


def point_hash(point: Point) -> str:
    return content_hash({"raw": point.raw, "seed": point.seed, "version": RESULTS_VERSION})


def flatten(values: dict, prefix: str = "") -> dict:
    """Grid values as dotted columns; a mapping swept whole (e.g. `engine: [{policy: tgi}, ...]`) becomes
    one column per key."""
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _row(point: Point, summary: dict) -> dict:
    row = {"point": point.point_id, **flatten(point.grid_values), "seed": point.seed,
           "policy": point.config.policy.name, **vllm_version_column(point.config.policy)}
    row.update(summary)
    return row


def _run_point(point: Point, tables_dir: Path | None = None,
               table_format: str = "parquet") -> tuple[Point, SimResult, float]:
    """One point; with `tables_dir`, a fast-path run streams its tables there (memory stays bounded)."""
    t0 = time.perf_counter()
    result = simulate(point.config, point.seed, tables_dir=tables_dir, table_format=table_format)
    return point, result, time.perf_counter() - t0


def _save_point(out_dir: Path, point: Point, result: SimResult, wall_s: float,
                table_format: str = "parquet") -> None:
    d = out_dir / "points" / point.point_id
    if not result.tables_saved:
        write_run_tables(d, result.requests, result.iterations, result.itl_gaps_s, table_format, result.replicas)
    (d / "config.yaml").write_text(yaml.safe_dump(result.resolved, sort_keys=False))
    summary = {**_row(point, result.summary), "wall_s": round(wall_s, 3), "config_hash": point_hash(point)}
    write_json_atomic(d / "summary.json", summary)   # a point is either finished or absent


def _load_finished(out_dir: Path, point: Point) -> dict | None:
    f = out_dir / "points" / point.point_id / "summary.json"
    try:
        s = json.loads(f.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return s if s.get("config_hash") == point_hash(point) else None


def run_sweep(sweep: dict, out_dir: str | Path | None = None, jobs: int | None = None,
              progress: bool | str = True, keep_in_memory: bool | None = None,
              dask_address: str | None = None, table_format: str = "parquet") -> SweepResult:
    """Run a sweep mapping (as loaded from YAML). With `out_dir`, every finished point is saved and a rerun
    resumes; without it, everything stays in memory (`SweepResult.points`), as a notebook wants.
    `dask_address` runs the points on that Dask scheduler's workers instead of local processes;
    `table_format` ('parquet' or 'csv') is how each point's big tables are saved."""
    points = expand(sweep)
    out = Path(out_dir) if out_dir is not None else None
    keep = keep_in_memory if keep_in_memory is not None else out is None
    rows: dict[str, dict] = {}
    todo = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
        for p in points:
            done = _load_finished(out, p)
            if done is not None:
                rows[p.point_id] = done
            else:
                todo.append(p)
    else:
        todo = list(points)
    result = SweepResult(pd.DataFrame(), num_skipped=len(points) - len(todo))
    bar = _progress_bar(len(points), result.num_skipped, progress)

    def stream_args(point: Point) -> tuple:
        """Where a point's tables go as it runs: its folder, when they are saved and not kept in memory
        (not through Dask, whose workers may not share this file system)."""
        if out is None or keep or dask_address is not None:
            return ()
        return out / "points" / point.point_id, table_format

    def finish(point: Point, sim: SimResult, wall_s: float) -> None:
        rows[point.point_id] = {**_row(point, sim.summary), "wall_s": round(wall_s, 3)}
        if out is not None:
            _save_point(out, point, sim, wall_s, table_format)
            _write_results(out, points, rows)
        if keep:
            result.points[point.point_id] = sim
        if bar is not None:
            bar.update(1)
        raise_if_interrupted()   # one swallowed inside the save (commandline/interrupts.py) stops here

    try:
        if todo:
            with open_executor(jobs, dask_address, len(todo)) as (pool, slots):
                pending = set()
                for i, p in enumerate(todo):
                    if bar is not None and slots == 1:  # the inline executor runs the point right here
                        bar.set_postfix_str(f"1 running ({p.point_id}), {len(todo) - i - 1} queued")
                    f = pool.submit(_run_point, p, *stream_args(p))
                    if f.done():
                        finish(*f.result())
                    else:
                        pending.add(f)
                while pending:
                    raise_if_interrupted()
                    if bar is not None:
                        running = min(slots, len(pending))
                        bar.set_postfix_str(f"{running} running, {len(pending) - running} queued")
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        finish(*f.result())
    finally:  # also on Ctrl-C: results.csv lists every point saved so far
        if bar is not None:
            bar.set_postfix_str(f"{result.num_skipped} skipped as finished" if result.num_skipped else "")
            bar.close()
        if out is not None:
            for p in points:  # exactly the points saved: an interrupt may land between a save and its row
                saved = (out / "points" / p.point_id / "summary.json").exists()
                if p.point_id in rows and not saved:
                    del rows[p.point_id]
                elif p.point_id not in rows and saved:
                    done = _load_finished(out, p)
                    if done is not None:
                        rows[p.point_id] = done
            _write_results(out, points, rows)
    result.results = _frame(points, rows)
    return result


def _frame(points: list[Point], rows: dict[str, dict]) -> pd.DataFrame:
    return pd.DataFrame([rows[p.point_id] for p in points if p.point_id in rows])


def _write_results(out: Path, points: list[Point], rows: dict[str, dict]) -> None:
    df = _frame(points, rows).drop(columns=["config_hash"], errors="ignore")
    write_csv_atomic(out / "results.csv", df)


def _progress_bar(total: int, initial: int, progress):
    """`progress`: a commandline.progress mode (auto, bar, plain, none) or True/False (auto/none)."""
    from commandline.progress import progress_bar
    return progress_bar(progress, total, "sweep", "points", initial)


def summary_table(results: pd.DataFrame, grid_keys: list[str]) -> str:
    """The readable table printed at the end of a run."""
    keys = [c for c in results.columns if any(c == k or c.startswith(k + ".") for k in grid_keys)]
    cols = ["point"] + [k for k in keys if k != "engine.policy"] + ["seed", "policy"]
    cols += [c for c in SUMMARY_COLUMNS if c in results.columns]
    results, offload = with_offload_columns(results)   # KV offload runs: hit rate, bytes moved, recomputed
    cols += offload
    df = results[[c for c in cols if c in results.columns]].copy()
    rename = {c: c.replace("workload.", "").replace("engine.", "").replace("arrival.", "") for c in df.columns}
    return df.rename(columns=rename).to_string(index=False, float_format=lambda v: f"{v:,.1f}")


def untrusted_lines(results: pd.DataFrame, grid_keys: list[str] | None = None) -> list[str]:
    """One line per results row that cannot be taken at face value: rejected or clipped requests, an
    unstable (past-saturation) run; see `simcore.metrics.untrusted_notes`."""
    lines = []
    for _, r in results.iterrows():
        notes = untrusted_notes(r)
        if notes:
            where = ", ".join(f"{k.split('.')[-1]}={r[k]}" for k in (grid_keys or []) if k in r and k != "engine.policy")
            lines.append(f"  {r['point']} ({r['policy']}{', ' + where if where else ''}): " + "; ".join(notes))
    return lines

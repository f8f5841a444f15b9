"""Drive one SLO search per grid point, in-process over `simulate`, with every simulation saved and reused.

Output folder layout (next to the sweep's own files):
  search.csv                          one row per grid point: the answer, its throughput, the first failure
  search_points.csv                   one row per simulation the searches ran (load, seed, metrics, verdict)
  search/<gid>/<load>-seed<s>.json    that row, plus a hash of the configuration; a rerun reuses it
  search/<gid>/detail-<load>/         a full run (requests, iterations and itl tables, Parquet or CSV:
                                      experiments/tables.py) at the answer, for plots
Simulations of all grid points and seeds run at once on the executor (local processes or Dask); the
driver alone writes files, so Dask workers need no shared disk.
"""
from __future__ import annotations

import copy
import json
import math
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from commandline.interrupts import raise_if_interrupted
from commandline.files import content_hash, write_json_atomic
from experiments.answer_basis import vllm_version_column
from experiments.executors import open_executor
from experiments.config import ConfigError, Point, expand, set_dotted
from experiments.search import (Outcome, SearchSpec, bracket_then_bisect, parse_search, pretty_metric,
                                steady_state_metrics)
from costmodels.basis import cost_model_basis
from experiments.simulate import SimResult, point_cost_model, simulate
from experiments.tables import write_run_tables
from simcore.engine import SimulationError
from simcore.metrics import API_SERVER_BUSY_LIMIT
from workloads.errors import WorkloadError
from workloads.synthetic import OPEN_LOOP_PROCESSES

METRICS_VERSION = 5  # bump when steady_state_metrics or RUN_COLUMNS change, so saved evaluations are redone
GANTT_USERS = 16
RUN_COLUMNS = ("num_requests", "num_rejected", "rejected_reasons", "num_clipped_prompts", "num_preemptions",
               "mean_running", "mean_waiting", "kv_usage_max", "ttft_p99_ms", "throughput_rps", "output_tok_per_s",
               "offered_rate_per_s", "achieved_rate_per_s", "waiting_at_end_frac", "unstable", "api_server_busy",
               "api_server_wait_mean_ms", "flags")


@dataclass
class SearchResult:
    spec: SearchSpec
    searches: pd.DataFrame            # search.csv
    points: pd.DataFrame              # search_points.csv
    outcomes: dict[int, Outcome]      # grid index -> outcome
    grid_points: list[Point]
    details: dict[tuple[int, float], Path] = field(default_factory=dict)  # (grid index, load) -> folder
    num_reused: int = 0


def load_config(raw: dict, spec: SearchSpec, value: float) -> dict:
    """The point's mapping at one load: the load set, and closed-loop runs long enough to measure."""
    raw = copy.deepcopy(raw)
    v = int(value) if spec.is_integer else float(value)
    set_dotted(raw, spec.over, v)
    if spec.is_integer:
        w = raw["workload"]
        w["num_requests"] = max(int(w["num_requests"]), spec.min_requests_per_user * v)
    return raw


def evaluate_load(raw: dict, spec: SearchSpec, value: float, seed: int) -> dict:
    """One simulation of the search (runs on a worker): steady-state metrics plus whole-run context."""
    t0 = time.perf_counter()
    cfg = load_config(raw, spec, value)
    sim = simulate(cfg, seed)
    conc = int(value) if spec.is_integer else None
    row = steady_state_metrics(sim.requests, sim.itl_gaps_s, sim.itl_end_s, conc, spec.warmup, sim.iterations)
    row.update({f"run_{k}": sim.summary.get(k, math.nan) for k in RUN_COLUMNS})   # a wait only with a queue
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def run_detail(raw: dict, spec: SearchSpec, value: float, seed: int) -> SimResult:
    return simulate(load_config(raw, spec, value), seed)


def evaluation_key(raw: dict, spec: SearchSpec, seed: int, kind: str) -> str:
    """The key a saved evaluation is stored with: a rerun reuses it only if the configuration, seed, kind of
    run ('search', 'detail', 'capacity-check'), warm-up rule and metrics version are all the same."""
    return content_hash({"raw": raw, "seed": seed, "kind": kind, "warmup": spec.warmup, "metrics": METRICS_VERSION})


def _label(spec: SearchSpec, value: float) -> str:
    return f"c{int(value)}" if spec.is_integer else f"r{value:.6g}"


def grid_points(sweep: dict, spec: SearchSpec) -> tuple[list[Point], list[int]]:
    """One resolved point per grid combination, with the searched key set to the range's low end; and the
    seeds (every load is simulated once per seed)."""
    grid = sweep.get("grid") or {}
    if spec.over in grid:
        raise ConfigError(f"grid.{spec.over}: this key is what search.over searches; drop it from the grid")
    process = ((sweep.get("workload") or {}).get("arrival") or {}).get("process")
    if spec.is_integer and process != "closed":
        raise ConfigError(f"search.over: {spec.over} needs workload.arrival.process closed, got {process!r}")
    if not spec.is_integer and process not in OPEN_LOOP_PROCESSES:
        raise ConfigError(f"search.over: {spec.over} needs workload.arrival.process "
                          f"{', '.join(OPEN_LOOP_PROCESSES)}, got {process!r}")
    base = copy.deepcopy(sweep)
    set_dotted(base, spec.over, int(spec.lo) if spec.is_integer else spec.lo)
    expanded = expand(base)
    seeds = list(dict.fromkeys(p.seed for p in expanded))
    return [p for p in expanded if p.seed == seeds[0]], seeds


def run_search(sweep: dict, out_dir: str | Path | None = None, jobs: int | None = None, progress: bool | str = True,
               dask_address: str | None = None, table_format: str = "parquet") -> SearchResult:
    """Search every grid point of `sweep` (which has a `search:` block); see the module docstring.
    `table_format`: how the detail runs' tables are saved ('parquet' or 'csv')."""
    spec = parse_search(sweep.get("search"))
    points, seeds = grid_points(sweep, spec)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    gens = {p.index: bracket_then_bisect(spec) for p in points}
    by_index = {p.index: p for p in points}
    results: dict[tuple[int, float], dict[int, dict]] = {}
    order: list[tuple[int, float]] = []
    outcomes: dict[int, Outcome] = {}
    rows: list[dict] = []
    todo: deque = deque()
    num_reused = 0

    def ask(gi: int, value: float | None) -> None:
        if value is None:
            return
        results[(gi, value)] = {}
        order.append((gi, value))
        todo.extend((gi, value, s) for s in seeds)

    def cache_file(gi: int, value: float, seed: int) -> Path | None:
        return None if out is None else out / "search" / f"g{gi:03d}" / f"{_label(spec, value)}-seed{seed}.json"

    def tell(gi: int, value: float, seed: int, row: dict, reused: bool) -> None:
        results[(gi, value)][seed] = {**row, "reused": reused}
        if len(results[(gi, value)]) < len(seeds):
            return
        per_seed = [spec.meets_slo(results[(gi, value)][s]) for s in seeds]
        try:
            ask(gi, gens[gi].send(spec.seeds_pass(per_seed)))
        except StopIteration as stop:
            outcomes[gi] = stop.value
            if bar is not None:
                bar.update(1)

    bar = _bar(len(points), progress)
    with open_executor(jobs, dask_address) as (pool, slots):
        for gi, gen in gens.items():
            ask(gi, next(gen))
        pending: dict = {}
        try:
            while todo or pending:
                raise_if_interrupted()   # commandline/interrupts.py
                while todo:
                    gi, value, seed = todo.popleft()
                    raw = load_config(by_index[gi].raw, spec, value)
                    f, h = cache_file(gi, value, seed), evaluation_key(raw, spec, seed, "search")
                    cached = read_saved(f)
                    if cached is not None and cached.get("config_hash") == h:
                        num_reused += 1
                        tell(gi, value, seed, cached["metrics"], True)
                        continue
                    fut = pool.submit(evaluate_load, by_index[gi].raw, spec, value, seed)
                    pending[fut] = (gi, value, seed, f, h)
                    if fut.done():
                        break  # inline executor: handle it before starting the next one
                if bar is not None:
                    running = min(slots, len(pending))
                    bar.set_postfix_str(f"{sum(map(len, results.values()))} sims done, "
                                        f"{running} running, {len(pending) - running + len(todo)} queued")
                done = [f for f in pending if f.done()]
                if not done and pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    gi, value, seed, f, h = pending.pop(fut)
                    try:
                        row = fut.result()
                    except (SimulationError, ConfigError, WorkloadError) as e:  # say which run, keep the class
                        raise type(e)(f"{by_index[gi].config.policy.name} at {spec.over}={value:g}, seed {seed}: "
                                      f"{e}") from None
                    if f is not None:
                        save_evaluation(f, {"config_hash": h, "metrics": row})
                    tell(gi, value, seed, row, False)
        finally:
            if bar is not None:
                bar.set_postfix_str(f"{sum(map(len, results.values()))} sims done, {num_reused} reused")
                bar.close()
        details = _run_details(pool, spec, by_index, outcomes, seeds[0], out, table_format)
    for gi, value in order:
        p = by_index[gi]
        per_seed = {s: spec.meets_slo(r) for s, r in results[(gi, value)].items()}
        verdict = spec.seeds_pass(list(per_seed.values()))
        for s, r in results[(gi, value)].items():
            rows.append({"grid_point": f"g{gi:03d}", **flat(p.grid_values), "policy": p.config.policy.name,
                         **vllm_version_column(p.config.policy), spec.over.split(".")[-1]: value, "seed": s,
                         "meets_slo": per_seed[s],
                         "load_passes": verdict, **r})
    points_df = pd.DataFrame(rows)
    searches = _summary_rows(spec, points, outcomes, results, seeds)
    searches["cost_model_basis"] = [point_basis(p) for p in points]
    if out is not None:
        points_df.to_csv(out / "search_points.csv", index=False)
        searches.to_csv(out / "search.csv", index=False)
    return SearchResult(spec, searches, points_df, outcomes, points, details, num_reused)


def _summary_rows(spec: SearchSpec, points: list[Point], outcomes: dict[int, Outcome], results: dict,
                  seeds: list[int]) -> pd.DataFrame:
    rows = []
    for p in points:
        o = outcomes[p.index]
        row = {"grid_point": f"g{p.index:03d}", **flat(p.grid_values), "policy": p.config.policy.name,
               **vllm_version_column(p.config.policy), "over": spec.over, "unit": spec.unit, "slo": spec.slo_text,
               "rule": spec.rule_text,
               "seeds": len(seeds), "status": o.status,
               "max_value": math.nan if o.best is None else o.best,
               "first_fail": math.nan if o.first_fail is None else o.first_fail,
               "non_monotone": " ".join(f"{v:g}" for v in o.non_monotone), "num_loads": len(o.evaluated),
               "max_num_seqs": getattr(p.config.policy, "max_num_seqs", math.nan),
               "note": o.message}
        at = results.get((p.index, o.best), {}) if o.best is not None else {}
        for k in ("throughput_rps", "input_tok_per_s", "output_tok_per_s", "prefill_time_share",
                  "run_mean_running", "run_kv_usage_max"):
            row[k.replace("run_", "")] = float(np.mean([r.get(k, math.nan) for r in at.values()])) if at else math.nan
        row.update(seed_spread(spec, p.index, results, seeds))
        row["saturation_rps"] = saturation_rps(p.index, results)
        for m, _ in spec.slo_ms:  # the worst seed at the answer: the figure the rule vouches for
            row[f"{m}_at_max"] = float(np.max([r[m] for r in at.values()])) if at else math.nan
        if o.status == "infeasible":  # say by how much the lowest load misses
            low = results[(p.index, spec.lo)].values()
            row["note"] += " (worst seed at the lowest load: " + ", ".join(
                f"{pretty_metric(m)} {np.max([r[m] for r in low]):,.0f} ms" for m, _ in spec.slo_ms) + ")"
        row["unstable_at_max"] = bool(any(r.get("run_unstable") for r in at.values()))
        rejecting = sorted(v for (gi, v), rs in results.items() if gi == p.index
                           and any(r.get("run_num_rejected", 0) for r in rs.values()))
        row["loads_with_rejections"] = " ".join(f"{v:g}" for v in rejecting)
        if rejecting:
            row["note"] += ("; " if row["note"] else "") + (
                f"requests were rejected at {row['loads_with_rejections']}, so those loads fail")
        if row["unstable_at_max"]:
            row["note"] += ("; " if row["note"] else "") + "the run at the answer was unstable (backlog growing)"
        busy = [r.get("run_api_server_busy", math.nan) for r in at.values()]
        row["api_server_busy_at_max"] = float(np.nanmax(busy)) if busy and not np.all(np.isnan(busy)) else math.nan
        if row["api_server_busy_at_max"] >= API_SERVER_BUSY_LIMIT:
            row["note"] += ("; " if row["note"] else "") + (
                f"at the answer the API server would be busy {row['api_server_busy_at_max']:.0%} of the time: its "
                "queue, not simulated, would lower it (engine.frontend.api_server_count adds processes)")
        rows.append(row)
    return pd.DataFrame(rows)


def seed_spread(spec: SearchSpec, gi: int, results: dict, seeds: list[int]) -> dict:
    """How far each seed alone would go: per seed, the highest load the search ran that this seed passes
    with every lower load it ran also passing. The rule's answer is what all seeds (or the confidence
    rule) agree on; this is the spread behind it, among the loads the search happened to run."""
    loads = sorted(v for (g, v) in results if g == gi)
    best = []
    for s in seeds:
        top = math.nan
        for v in loads:
            r = results[(gi, v)].get(s)
            if r is None or not spec.meets_slo(r):
                break
            top = v
        best.append(top)
    finite = [b for b in best if not math.isnan(b)]
    return {"seed_max_low": min(finite) if finite else math.nan, "seed_max_high": max(finite) if finite else math.nan}


def saturation_rps(gi: int, results: dict) -> float:
    """The knee: the most requests per second any load of the search finished (mean over seeds), whether
    or not it met the SLO. Past it, more load only lengthens the queue."""
    rates = [np.mean([r["throughput_rps"] for r in rs.values()]) for (g, _), rs in results.items() if g == gi and rs]
    return float(max(rates)) if rates else math.nan


def point_basis(point: Point) -> str:
    """What the point's answers rest on: its cost model, in one line (costmodels/basis.py)."""
    return cost_model_basis(point_cost_model(point.config))


def _run_details(pool, spec: SearchSpec, by_index: dict, outcomes: dict, seed: int, out: Path | None,
                 table_format: str = "parquet") -> dict:
    """Full runs for plots: each grid point at its answer (or the low end, when infeasible); and all grid
    points at two shared loads, so the slot timeline (`gantt_load`) and the engine-state plot
    (`comparison_load`) compare policies on identical traffic."""
    if out is None:
        return {}
    wanted = {(gi, o.best if o.best is not None else spec.lo) for gi, o in outcomes.items()}
    static = [gi for gi, p in by_index.items() if p.config.policy.name == "static"]
    shared = {comparison_load(spec, outcomes, by_index)} | {gantt_load(spec, outcomes[gs]) for gs in static[:1]}
    wanted |= {(gi, v) for gi in by_index for v in shared}
    found, futures = {}, {}
    for gi, value in sorted(wanted):
        d = out / "search" / f"g{gi:03d}" / f"detail-{_label(spec, value)}"
        h = evaluation_key(load_config(by_index[gi].raw, spec, value), spec, seed, "detail")
        if (read_saved(d / "summary.json") or {}).get("config_hash") == h:
            found[(gi, value)] = d
        else:
            futures[pool.submit(run_detail, by_index[gi].raw, spec, value, seed)] = (gi, value, d, h)
    for fut, (gi, value, d, h) in futures.items():
        sim = fut.result()
        write_run_tables(d, sim.requests, sim.iterations, sim.itl_gaps_s, table_format)
        save_evaluation(d / "summary.json", {**sim.summary, "config_hash": h, "seed": seed,
                                         "policy": by_index[gi].config.policy.name, "value": value})
        found[(gi, value)] = d
    return found


def gantt_load(spec: SearchSpec, static: Outcome) -> float:
    """The load a static-vs-others slot timeline is drawn at: 16 users (enough slots to see static's
    padding, few enough to read), else the rate where static first fails, else its answer."""
    if spec.is_integer:
        return float(min(spec.hi, max(spec.lo, GANTT_USERS)))
    if static.first_fail is not None:
        return static.first_fail
    return static.best if static.best is not None else spec.lo


def comparison_load(spec: SearchSpec, outcomes: dict, by_index: dict) -> float:
    """The load at which every policy's engine state is plotted: the lowest answer among the policies other
    than static (static's answer when it is the only one; the range's low end when nothing passes)."""
    others = [o.best for gi, o in outcomes.items() if o.best is not None and by_index[gi].config.policy.name != "static"]
    anyone = [o.best for o in outcomes.values() if o.best is not None]
    return min(others or anyone or [spec.lo])


def _not_policy(grid_values: dict) -> dict:
    return {k: v for k, v in grid_values.items() if k not in ("engine.policy", "engine")}


def flat(grid_values: dict) -> dict:
    """Grid values for a table: a swept mapping (e.g. a whole `engine:`) becomes 'key=value ...' text."""
    return {k: " ".join(f"{kk}={vv}" for kk, vv in v.items()) if isinstance(v, dict) else v
            for k, v in grid_values.items()}


def read_saved(f: Path | None) -> dict | None:
    """A saved evaluation, or None when there is none (or it is unreadable: it is then redone)."""
    if f is None:
        return None
    try:
        return json.loads(f.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def save_evaluation(f: Path, data: dict) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(f, data)   # an evaluation is either saved or absent


def _bar(total: int, progress):
    """`progress`: a commandline.progress mode (auto, bar, plain, none) or True/False (auto/none)."""
    from commandline.progress import progress_bar
    return progress_bar(progress, total, "search", "searches")

"""The search path of `python -m experiments.run`: SLO search per grid point, then the capacity plan (with a
`capacity:` block) and its check on a simulated cluster, then figures and summary.md; returns the text
printed at the end."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd

from experiments.capacity_over_time import verify_over_time
from experiments.capacity_plan import CapacitySpec, parse_capacity, plan
from experiments.executors import open_executor
from experiments.answer_basis import point_router_bases, point_vllm_versions, schedules_line
from experiments.report import answer_sentence, grid_labels, md_table, search_bases, search_report
from costmodels.basis import rests_on
from experiments.search import parse_search
from experiments.search_run import SearchResult, evaluate_load, evaluation_key, read_saved, run_search, save_evaluation


def run_and_report(sweep: dict, out: Path, jobs: int | None = None, progress: bool | str = True,
                   dask_address: str | None = None, make_plots: bool = True, table_format: str = "parquet") -> str:
    parse_search(sweep.get("search"))  # fail on a bad block before any work
    cap_spec = parse_capacity(sweep["capacity"]) if "capacity" in sweep else None
    res = run_search(sweep, out, jobs=jobs, progress=progress, dask_address=dask_address, table_format=table_format)
    grid_keys = list((sweep.get("grid") or {}).keys())
    cap = None
    if cap_spec is not None:
        tp = {f"g{p.index:03d}": p.config.tensor_parallel_size for p in res.grid_points}
        cap = plan(res.searches, res.spec.over, tp, cap_spec, [k for k in grid_keys if k != "engine.policy"])
        cap = verify_plan(res, cap, cap_spec, out, jobs, dask_address)
        cap.to_csv(out / "capacity.csv", index=False)
    if make_plots:
        search_report(sweep, out, res, cap, cap_spec)
    labels = grid_labels(res.grid_points, grid_keys)
    lines = [f"{res.spec.rule_text}; {len(res.points)} simulations"
             + (f" ({res.num_reused} reused from an earlier run)" if res.num_reused else "")]
    lines += [answer_sentence(r, res.spec, labels[r.grid_point]).replace("**", "") for r in res.searches.itertuples()]
    lines.append(f"rests on the {rests_on(search_bases(res, labels))}")
    lines.append(schedules_line([p.config.policy.name for p in res.grid_points], point_vllm_versions(res.grid_points),
                                point_router_bases(res.grid_points)))
    if cap is not None:
        show = [c for c in ("configuration", "capacity_rps_per_replica", "replicas", "gpus",
                            "cost_per_hour", "cost_per_million_input_tokens", "cost_per_million_output_tokens",
                            "cost_per_million_total_tokens", "gpu_hours_peak", "gpu_hours_mean",
                            "gpu_hours_following", "check_autoscaled_gpu_hours", "check_autoscaled_slo_attainment",
                            "check_peak_gpu_hours", "check_peak_slo_attainment", "check_mean_gpu_hours",
                            "check_mean_slo_attainment", "check_meets_slo")
                if c in cap.columns or c == "configuration"]
        table = cap.assign(configuration=[labels[g] for g in cap["grid_point"]])   # the answers' own labels
        lines += ["", "capacity plan:", md_table(table[show])]
    lines.append(f"\nresults in {out}/search.csv, search_points.csv"
                 + (", capacity.csv" if cap is not None else "") + (", summary.md, plots/" if make_plots else ""))
    return "\n".join(lines)


def verify_plan(res: SearchResult, cap: pd.DataFrame, spec: CapacitySpec, out: Path, jobs: int | None,
                dask_address: str | None) -> pd.DataFrame:
    """Simulate each planned cluster (its replicas behind `spec.router`, open loop at the target rate, the
    same traffic shape, as many requests per replica as the search used) and check it against the SLO.
    Saved under capacity/ and reused on a rerun, like search points."""
    if not spec.verify or not res.spec.over.endswith("rate_per_s"):
        return cap
    if spec.target_profile is not None:   # a time-varying target: three fleets over one span
        return verify_over_time(res, cap, spec, out, jobs, dask_address)
    by_id = {f"g{p.index:03d}": p for p in res.grid_points}
    seed = int(res.points["seed"].iloc[0])
    tasks, found = {}, {}
    for i, r in cap.iterrows():
        if r["replicas"] is None or pd.isna(r["replicas"]):
            continue
        n = int(r["replicas"])
        raw = copy.deepcopy(by_id[r["grid_point"]].raw)
        raw["cluster"] = {"num_replicas": n, "router": spec.router}
        raw["workload"]["num_requests"] = int(raw["workload"]["num_requests"]) * n
        f = out / "capacity" / f"{r['grid_point']}-x{n}-{spec.router}.json"
        h = evaluation_key({**raw, "rate": spec.target_rps}, res.spec, seed, "capacity-check")
        cached = read_saved(f)
        if cached is not None and cached.get("config_hash") == h:
            found[i] = cached["metrics"]
        else:
            tasks[i] = (raw, f, h)
    if tasks:
        with open_executor(jobs, dask_address, len(tasks)) as (pool, _):
            futures = {i: pool.submit(evaluate_load, raw, res.spec, spec.target_rps, seed)
                       for i, (raw, _, _) in tasks.items()}
            for i, fut in futures.items():
                found[i] = fut.result()
                save_evaluation(tasks[i][1], {"config_hash": tasks[i][2], "metrics": found[i]})
    cap = cap.copy()
    cap["check_router"] = [spec.router if i in found else None for i in cap.index]
    cap["check_meets_slo"] = [res.spec.meets_slo(found[i]) if i in found else None for i in cap.index]
    for m, _ in res.spec.slo_ms:
        cap[f"check_{m}"] = [found[i][m] if i in found else math.nan for i in cap.index]
    return cap

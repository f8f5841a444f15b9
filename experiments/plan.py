"""The search path of `python -m experiments.run`: SLO search per grid point, then the capacity plan (with a
`capacity:` block), then figures and summary.md; returns the text printed at the end."""
from __future__ import annotations

from pathlib import Path

from experiments.capacity import parse_capacity, plan
from experiments.report import answer_sentence, label_of, md_table, search_report
from experiments.search import parse_search
from experiments.search_run import run_search


def run_and_report(sweep: dict, out: Path, jobs: int | None = None, progress: bool = True,
                   dask_address: str | None = None, make_plots: bool = True) -> str:
    parse_search(sweep.get("search"))  # fail on a bad block before any work
    cap_spec = parse_capacity(sweep["capacity"]) if "capacity" in sweep else None
    res = run_search(sweep, out, jobs=jobs, progress=progress, dask_address=dask_address)
    grid_keys = list((sweep.get("grid") or {}).keys())
    cap = None
    if cap_spec is not None:
        tp = {f"g{p.index:03d}": p.config.tensor_parallel_size for p in res.grid_points}
        cap = plan(res.searches, res.spec.over, tp, cap_spec, [k for k in grid_keys if k != "engine.policy"])
        cap.to_csv(out / "capacity.csv", index=False)
    if make_plots:
        search_report(sweep, out, res, cap, cap_spec)
    labels = {f"g{p.index:03d}": label_of(p.grid_values, p.config.policy.name, grid_keys) for p in res.grid_points}
    lines = [f"{res.spec.rule_text}; {len(res.points)} simulations"
             + (f" ({res.num_reused} reused from an earlier run)" if res.num_reused else "")]
    lines += [answer_sentence(r, res.spec, labels[r.grid_point]).replace("**", "") for r in res.searches.itertuples()]
    if cap is not None:
        show = [c for c in ("grid_point", "policy", "capacity_rps_per_replica", "replicas", "gpus",
                            "cost_per_hour", "cost_per_million_output_tokens") if c in cap.columns]
        lines += ["", "capacity plan:", md_table(cap[show])]
    lines.append(f"\nresults in {out}/search.csv, search_points.csv"
                 + (", capacity.csv" if cap is not None else "") + (", summary.md, plots/" if make_plots else ""))
    return "\n".join(lines)

"""Compare real runs with the simulator: each run's exact requests replayed through our engine.

    python -m fidelity.compare RUN [RUN ...] [--config POINT.yaml] [--profile P] [--out DIR]

RUN is any real run fidelity/realruns.py reads (a fidelity.vllm_run folder, vllm bench serve or GuideLLM
JSON, a per-request CSV, an LLMServingSim run folder). Each run's exact requests (same send times, same lengths) are replayed through our
engine with the point's configuration (--config, else the one vllm_run recorded) and cost model (--profile,
else the point's own `profile:` or the automatic choice), and the report gives per point the real runs'
median and range (min-max over the repeats) and the simulated median of p50/p99 TTFT, ITL, TPOT, E2E and
throughput, whether the simulation lies inside the real range and its error to the real median, and, where
the engine recorded its steps, the error of the cost model's price of every real step (where it kept only
vLLM's 1 s stat ticks, as LLMServingSim's runs do, of every decode-only second's step, and of every second
that carried prefill, priced whole: fidelity/run_ticks.py), outside any scheduling. Writes compare.csv
and compare.md under --out. (Two cost models against each other: python -m calibration.compare A B.)
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import pandas as pd

from commandline.exits import refuse, run_main
from commandline.outputs import OutputError, out_dir
from commandline.parser import Parser
from costmodels.catalog import CatalogError
from experiments.config import ConfigError, load_sweep_file
from experiments.simulate import as_scheduled, point_cost_model
from fidelity.fit_engine import step_errors
from fidelity.realruns import RealRunError, read_runs, replay, replay_config
from fidelity.run_ticks import busy_tick_errors, tick_errors
from fidelity.runchecks import failed_requests_line

RUN_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
               "e2e_p50_ms", "e2e_p99_ms", "throughput_rps")


def compare_runs(runs, point: dict | None, profile: str | None):
    """Per point and metric: real median, min, max over the repeats; simulated median; inside the range;
    error to the real median. And the step-time error over all recorded steps."""
    rows, step_rows = [], []
    by_point: dict[str, list] = {}
    for r in runs:
        by_point.setdefault(r.point, []).append(r)
    for label, group in by_point.items():
        cfg = replay_config(group[0], point)
        if profile is not None:
            cfg = dataclasses.replace(cfg, profile=profile)
        cost = point_cost_model(cfg)
        real = [g.summary for g in group]
        sim = [replay(g, replay_config(g, point), cost_model=cost).summary for g in group]
        for m in RUN_METRICS:
            rv = np.array([x.get(m, np.nan) for x in real], dtype=float)
            sv = np.array([x.get(m, np.nan) for x in sim], dtype=float)
            if not np.isfinite(rv).any():
                continue
            med, s_med = float(np.nanmedian(rv)), float(np.nanmedian(sv))
            rows.append({"point": label, "metric": m, "repeats": int(np.isfinite(rv).sum()), "real_median": med,
                         "real_min": float(np.nanmin(rv)), "real_max": float(np.nanmax(rv)), "sim_median": s_med,
                         "in_range": bool(np.nanmin(rv) <= s_med <= np.nanmax(rv)),
                         "err_to_median_pct": (s_med / med - 1) * 100 if med else np.nan,
                         "real_spread_pct": (np.nanmax(rv) - np.nanmin(rv)) / med * 100 if med else np.nan})
        e = step_errors(cost, group)
        if e:
            step_rows.append({"point": label, "from": "engine log", **e})
        dp = cfg.deployment.data_parallel_size if cfg.deployment else 1
        e = tick_errors(as_scheduled(cfg, cost), group, dp)
        if e:   # runs that kept only the stat logger's 1 s ticks: their decode-only steps
            step_rows.append({"point": label, "from": "1 s ticks, decode-only", **e})
        budget = getattr(cfg.policy, "max_num_batched_tokens", None)
        e = busy_tick_errors(as_scheduled(cfg, cost), group, budget) if dp == 1 and budget else None
        if e:   # ... and the seconds that carried prefill, each priced whole against its length
            step_rows.append({"point": label, "from": "1 s ticks, with prefill (whole ticks)", **e})
        cost_kind = cost.describe().get("kind", "?")
    return pd.DataFrame(rows), pd.DataFrame(step_rows), cost_kind


def main_runs(args) -> int:
    try:
        point = load_sweep_file(args.config) if args.config else None
        if point is not None and point.get("grid"):
            raise ConfigError(f"--config {args.config}: give one point (no grid)")
        runs = [r for path in args.targets for r in read_runs(path)]
        out = out_dir(args.out) if args.out else None   # checked before the replays, not after
        metrics, steps, kind = compare_runs(runs, point, args.profile)
    except (RealRunError, ConfigError, CatalogError, OutputError) as e:
        return refuse(e)
    text = run_report(metrics, steps, kind, args)
    failed = failed_requests_line(runs)
    if failed:
        text += "\n" + failed + "\n"
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        metrics.to_csv(out / "compare.csv", index=False)
        if len(steps):
            steps.to_csv(out / "compare_steps.csv", index=False)
        (out / "compare.md").write_text(text)
    return 0


def run_report(metrics, steps, kind: str, args) -> str:
    lines = [f"Real runs vs simulation (cost model: {kind}{', ' + args.profile if args.profile else ''})", "",
             "| point | metric | repeats | real median | real range | sim | in range | err % |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in metrics.iterrows():
        lines.append(f"| {r['point']} | {r['metric']} | {r['repeats']} | {r['real_median']:.4g} | "
                     f"{r['real_min']:.4g}-{r['real_max']:.4g} | {r['sim_median']:.4g} | "
                     f"{'yes' if r['in_range'] else 'no'} | {r['err_to_median_pct']:+.1f} |")
    if len(metrics):
        lines += ["", f"{int(metrics['in_range'].sum())} of {len(metrics)} simulated values inside the real range; "
                      f"{int((metrics['err_to_median_pct'].abs() <= 5).sum())} within 5% of the real median."]
    if len(steps):
        lines += ["", "| point | steps from | steps | step error median | p90 | total time | noise floor median | p90 |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['point']} | {r['from']} | {r['steps']} | {r['median_ape_pct']}% | {r['p90_ape_pct']}% | "
                  f"{r['total_time_err_pct']:+}% | {_pct(r.get('noise_floor_median_ape_pct'))} | "
                  f"{_pct(r.get('noise_floor_p90_ape_pct'))} |" for _, r in steps.iterrows()]
        lines += ["", "Noise floor: each step against the median of its run's steps of the same shape (seen 5+ "
                      "times), the error of a model that knew every shape's typical time. Steps from 1 s ticks: "
                      "the seconds in which the engine only decoded, each one step's time; with prefill: the "
                      "seconds that carried prompt chunks, each priced whole against its length, a tick counted "
                      "as a step (fidelity/run_ticks.py)."]
    return "\n".join(lines) + "\n"


def _pct(v) -> str:
    return "" if v is None or pd.isna(v) else f"{v}%"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = Parser(prog="python -m fidelity.compare", description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+", metavar="RUN")
    ap.add_argument("--config", help="POINT.yaml (default: the configuration vllm_run recorded)")
    ap.add_argument("--profile", help="cost model to simulate with (default: the point's own)")
    ap.add_argument("--out", help="folder for compare.csv and compare.md")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if len(args.targets) == 2 and not (args.config or args.out) and _both_cost_models(args.targets):
        from calibration import compare as cost_models   # two cost models, not runs: that command's work
        return cost_models.main(argv)
    return main_runs(args)


def _both_cost_models(targets: list[str]) -> bool:
    from calibration.compare import _looks_like_run
    from costmodels.selection import PROFILES_DIR
    return all(t == "roofline" or (PROFILES_DIR / f"{t}.json").exists() or
               (t.endswith(".json") and not _looks_like_run(t)) for t in targets)


if __name__ == "__main__":
    run_main(main, (RealRunError, ConfigError, CatalogError), kept="nothing written (compare writes at the end)")

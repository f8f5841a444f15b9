"""What a simulated day at scale costs: examples/autoscaling_day_70b.yaml (2,592,000 requests over 24 h of
diurnal chat traffic, 30 req/s mean, Llama-3.1-70B FP8 on H200 replicas autoscaled between 4 and 48: tens of
replicas) or, with `--example autoscaling_day.yaml`, the Llama-3-8B / H100 day (2 to 5 replicas), run as a
user runs it, `python -m experiments.run SWEEP --jobs 1 --quiet`, in a child process: its wall time, user and
system CPU (the child's own rusage, as /usr/bin/time reports them), peak resident memory, and the day's answer
from results.csv (replicas, GPU-hours, cost, SLO attainment).

    python -m benchmarks.autoscaling_day                 # the whole day (about an hour of CPU: 2.6 M requests)
    python -m benchmarks.autoscaling_day --hours 6       # the same curve compressed into six hours (1/4 of it)
    python -m benchmarks.autoscaling_day --hours 1       # ... into one hour (1/24 of it)
    python -m benchmarks.autoscaling_day --repeats 3     # the median of three runs
    python -m benchmarks.autoscaling_day --example autoscaling_day.yaml   # the Llama-3-8B / H100 day

On a shared machine wall time depends on what else runs; the CPU times do much less.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from commandline.timed_run import ROOT, run_sweep
from commandline.argtypes import positive_float, positive_int
from commandline.exits import run_main
from commandline.parser import Parser

EXAMPLES = ROOT / "examples"
EXAMPLE = "autoscaling_day_70b.yaml"
ANSWER = ("num_requests", "num_finished", "replicas_peak", "replicas_mean", "gpu_hours", "cost", "slo_attainment",
          "ttft_p99_ms", "num_scale_ups", "num_scale_downs", "num_iterations")


def sweep(hours: float, mean_rps: float | None = None, example: str = EXAMPLE) -> dict:
    """The example (a file in examples/), its diurnal period compressed to `hours` and its mean rate set to
    `mean_rps` (None: the example's), with one period's requests."""
    cfg = yaml.safe_load((EXAMPLES / example).read_text())
    diurnal = cfg["workload"]["arrival"]["rate_per_s"]["diurnal"]
    diurnal["period_s"] = hours * 3600
    if mean_rps is not None:
        diurnal["mean"] = mean_rps
    cfg["workload"]["num_requests"] = int(round(diurnal["mean"] * hours * 3600))
    return cfg


def run_once(hours: float, mean_rps: float | None = None, example: str = EXAMPLE) -> dict:
    """One `experiments.run` of the day in a child process: its times, peak memory and results row."""
    with tempfile.TemporaryDirectory() as tmp:
        wall_s, usage = run_sweep(sweep(hours, mean_rps, example), Path(tmp), "day.yaml")
        row = pd.read_csv(Path(tmp) / "out" / "results.csv").iloc[0]
    fleet = [int(step.split(":")[1]) for step in str(row["replica_timeline"]).split()]
    return {"wall_s": wall_s, "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024,
            "replicas_min": min(fleet), **{k: row[k] for k in ANSWER}}


def main(argv=None) -> int:
    parser = Parser(prog="python -m benchmarks.autoscaling_day", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=positive_float, default=24.0,
                        help="the diurnal period in hours (default 24: the example as shipped)")
    parser.add_argument("--mean-rps", type=positive_float, default=None,
                        help="the diurnal curve's mean rate, requests/s (default: the example's, 30)")
    parser.add_argument("--repeats", type=positive_int, default=1, help="runs, one at a time (default 1)")
    parser.add_argument("--example", default=EXAMPLE,
                        help=f"the day's sweep file in examples/ (default {EXAMPLE}; autoscaling_day.yaml: the 8B day)")
    args = parser.parse_args(argv)
    if not (EXAMPLES / args.example).is_file():
        parser.error(f"--example: no such file examples/{args.example}")
    runs = [run_once(args.hours, args.mean_rps, args.example) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "user_s", "sys_s", "peak_mb")}
    last = runs[-1]
    print(f"{args.hours:g} h of diurnal traffic, {int(last['num_requests']):,} requests, {args.repeats} run(s), median:")
    print(f"  wall {med['wall_s']:.1f} s, user CPU {med['user_s']:.1f} s, system CPU {med['sys_s']:.1f} s, "
          f"peak RSS {med['peak_mb']:,.0f} MB")
    print(f"  finished {int(last['num_finished']):,} ({int(last['num_iterations']):,} engine steps); replicas "
          f"{int(last['replicas_min'])} to {int(last['replicas_peak'])}, mean "
          f"{last['replicas_mean']:.2f}; {int(last['num_scale_ups'])} scale-ups, {int(last['num_scale_downs'])} "
          f"scale-downs; {last['gpu_hours']:.1f} GPU-hours, cost {last['cost']:.2f}; SLO attainment "
          f"{last['slo_attainment']:.1%}; p99 TTFT {last['ttft_p99_ms']:,.0f} ms")
    return 0


if __name__ == "__main__":
    run_main(main)

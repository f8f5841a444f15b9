"""Simulator speed where users feel it: the command a user runs, not only the engine.

    python -m benchmarks.speed                      # all four sections (about 4 minutes on an idle core)
    python -m benchmarks.speed --sections 24 --policies chunked_prefill

Traffic: Llama-3-8B on one H100-SXM, Poisson arrivals at 11 req/s (about 80% of what chunked prefill
sustains here), Azure-conversation-like lengths as in examples/quickstart.yaml: prompts lognormal (median
1020, sigma 1.0, max 8000), outputs lognormal (median 129, sigma 0.86, max 2048). Every measurement runs in
a fresh child process, one at a time (one core each): "cpu" is that child's own CPU time, "peak MB" its
maximum resident set.

1. End to end against the engine alone, 100k requests, default cost model (no `profile:` key: the shipped
   measured H100 profile). Engine alone = the `experiments.simulate.simulate()` call, timed inside its child.
   End to end = `python -m experiments.run SWEEP --jobs 1 --quiet` as a whole process (interpreter start,
   imports, simulation, Parquet tables, plots, summary.md). The two alternate; each repeat gives a ratio.
2. The measured profile against the roofline prior: the engine alone with each, alternating.
3. 1M requests end to end (`--jobs 1`): wall, CPU and peak memory.
4. One max-concurrency search as the README runs it (examples/max_concurrency.yaml, chunked prefill only:
   3 seeds, p99 TTFT <= 200 ms, closed loop), in one process (jobs=1), tables and plots not written.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from commandline.timed_run import run_sweep
from commandline.argtypes import positive_int
from commandline.exits import run_main
from commandline.parser import Parser

ROOT = Path(__file__).resolve().parents[1]
TRAFFIC = {
    "model": "llama-3-8b", "hardware": "h100-sxm",
    "workload": {"arrival": {"process": "poisson", "rate_per_s": 11.0},
                 "prompt_tokens": {"dist": "lognormal", "median": 1020, "sigma": 1.0, "max": 8000},
                 "output_tokens": {"dist": "lognormal", "median": 129, "sigma": 0.86, "max": 2048}},
}
BENCHMARKED_POLICIES = ("continuous", "chunked_prefill")


def config(policy: str, num_requests: int, profile: str | None = None, fast_path: str = "auto") -> dict:
    """The point simulated; `profile` None = the default cost model (what a user gets with no key)."""
    cfg = {**TRAFFIC, "engine": {"policy": policy, "fast_path": fast_path},
           "workload": {**TRAFFIC["workload"], "num_requests": num_requests}}
    return cfg if profile is None else {**cfg, "profile": profile}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux reports KiB


def engine_run(policy: str, num_requests: int, profile: str | None, fast_path: str = "auto") -> dict:
    """In a child: `simulate()` alone, its wall and CPU time, the process's peak memory."""
    from experiments.simulate import simulate
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(config(policy, num_requests, profile, fast_path), seed=0)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    s = result.summary
    return {"wall_s": wall_s, "cpu_s": cpu_s, "peak_mb": peak_rss_mb(), "iterations": s["num_iterations"],
            "cost_model": s["cost_model"], "ttft_p99_ms": s["ttft_p99_ms"]}


def search_run() -> dict:
    """In a child: examples/max_concurrency.yaml's search for chunked prefill alone, jobs=1."""
    from experiments.search_run import run_search
    sweep = yaml.safe_load((ROOT / "examples" / "max_concurrency.yaml").read_text())
    sweep["grid"] = {"engine.policy": ["chunked_prefill"]}
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_search(sweep, out_dir=None, jobs=1, progress=False)
    return {"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu_start,
            "peak_mb": peak_rss_mb(), "max_users": int(result.searches.iloc[0]["max_value"]),
            "num_simulations": len(result.points), "seeds": len(sweep["seeds"])}


def in_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.speed", "--child", *args], check=True, cwd=ROOT,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def end_to_end(policy: str, num_requests: int) -> dict:
    """`python -m experiments.run` on the point as a whole child process: wall, CPU (its own rusage), peak."""
    with tempfile.TemporaryDirectory() as tmp:
        wall_s, usage = run_sweep({"name": "speed", "seeds": [0], **config(policy, num_requests)}, Path(tmp),
                                  "point.yaml")
        files = sorted(p.name for p in (Path(tmp) / "out" / "points").glob("*/*"))
        size_mb = sum(p.stat().st_size for p in (Path(tmp) / "out" / "points").glob("*/*")) / 1e6
    return {"wall_s": wall_s, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024,
            "files": files, "tables_mb": size_mb}


def _row(*cells) -> str:
    return "".join(f"{c:>{w}}" if not isinstance(c, str) or w > 0 else f"{c:<{-w}}" for c, w in cells)


def compare_e2e(policies, num_requests: int, repeats: int) -> None:
    print(f"\n1. end to end vs engine alone, {num_requests:,} requests, default cost model, {repeats} repeats "
          "(alternating); ratio = end-to-end / engine, per repeat, median")
    print(_row(("policy", -17), ("engine wall", 12), ("cpu", 7), ("e2e wall", 10), ("cpu", 7), ("peak MiB", 9),
               ("ratio wall", 11), ("ratio cpu", 10), ("tables MB", 10)))
    for policy in policies:
        eng, e2e = [], []
        for _ in range(repeats):
            eng.append(in_child("engine", policy, str(num_requests), "default"))
            e2e.append(end_to_end(policy, num_requests))
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        rw = statistics.median(b["wall_s"] / a["wall_s"] for a, b in zip(eng, e2e))
        rc = statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in zip(eng, e2e))
        print(_row((policy, -17), (f"{med(eng, 'wall_s'):.2f}", 12), (f"{med(eng, 'cpu_s'):.2f}", 7),
                   (f"{med(e2e, 'wall_s'):.2f}", 10), (f"{med(e2e, 'cpu_s'):.2f}", 7), (f"{med(e2e, 'peak_mb'):.0f}", 9),
                   (f"{rw:.2f}x", 11), (f"{rc:.2f}x", 10), (f"{e2e[0]['tables_mb']:.1f}", 10)), flush=True)
        print(f"   ({eng[0]['cost_model']} cost model; wall ratios per repeat "
              + ", ".join(f"{b['wall_s'] / a['wall_s']:.2f}" for a, b in zip(eng, e2e))
              + "; files per point: " + ", ".join(e2e[0]["files"]) + ")", flush=True)


def compare_cost_models(policies, num_requests: int, repeats: int) -> None:
    print(f"\n2. engine alone, measured profile vs roofline prior, {num_requests:,} requests, {repeats} repeats "
          "(alternating); ratio = profile / roofline, per repeat, median")
    print(_row(("policy", -17), ("roofline cpu", 13), ("profile cpu", 12), ("ratio cpu", 10), ("ratio wall", 11),
               ("roofline iters", 15), ("profile iters", 14)))
    for policy in policies:
        roof, prof = [], []
        for _ in range(repeats):
            roof.append(in_child("engine", policy, str(num_requests), "roofline"))
            prof.append(in_child("engine", policy, str(num_requests), "llama-3-8b__h100-sxm__tp1__bf16"))
        rc = statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in zip(roof, prof))
        rw = statistics.median(b["wall_s"] / a["wall_s"] for a, b in zip(roof, prof))
        print(_row((policy, -17), (f"{statistics.median(r['cpu_s'] for r in roof):.2f}", 13),
                   (f"{statistics.median(r['cpu_s'] for r in prof):.2f}", 12), (f"{rc:.2f}x", 10), (f"{rw:.2f}x", 11),
                   (roof[0]["iterations"], 15), (prof[0]["iterations"], 14)), flush=True)


SECTIONS = "1234"


def _sections(text: str) -> str:
    # --sections: digits of sections this benchmark has, e.g. 24
    if not text or any(c not in SECTIONS for c in text):
        raise argparse.ArgumentTypeError(f"expected digits among {SECTIONS} (e.g. 24), got {text!r}")
    return text


def main(argv=None) -> int:
    ap = Parser(prog="python -m benchmarks.speed", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=positive_int, default=100_000, help="size of sections 1 and 2 (default 100,000)")
    ap.add_argument("--large", type=positive_int, default=1_000_000, help="size of section 3 (default 1,000,000)")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--policies", nargs="+", default=list(BENCHMARKED_POLICIES), choices=BENCHMARKED_POLICIES)
    ap.add_argument("--sections", type=_sections, default=SECTIONS, help="which sections to run (default: 1234)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "engine":
            res = engine_run(rest[0], int(rest[1]), None if rest[2] == "default" else rest[2])
        else:
            res = search_run()
        print(json.dumps(res))
        return 0
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall = elapsed, "
          "cpu = the child's own CPU time; they agree on an idle core)")
    if "1" in args.sections:
        compare_e2e(args.policies, args.requests, args.repeats)
    if "2" in args.sections:
        compare_cost_models(args.policies, args.requests, args.repeats)
    if "3" in args.sections:
        r = end_to_end("continuous", args.large)
        print(f"\n3. {args.large:,} requests end to end (continuous, default cost model, --jobs 1): "
              f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s cpu, peak {r['peak_mb']:.0f} MiB "
              f"({r['peak_mb'] * 1.048576 / 1000:.2f} GB), tables {r['tables_mb']:.0f} MB", flush=True)
    if "4" in args.sections:
        r = in_child("search")
        print(f"\n4. max-concurrency search (examples/max_concurrency.yaml, chunked_prefill, {r['seeds']} seeds, "
              f"jobs=1): {r['max_users']} users, {r['num_simulations']} simulations in {r['wall_s']:.2f} s wall, "
              f"{r['cpu_s']:.2f} s cpu, peak {r['peak_mb']:.0f} MiB", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main, kept="the sections printed above")

"""Simulator speed on heavy-tailed chat traffic (issue 6).

    python -m benchmarks.speed --sizes 10000 100000 1000000

Llama-3-8B on one H100-SXM (roofline cost model), Poisson arrivals at 11 req/s (about 80% of what
chunked prefill sustains here), Azure-conversation-like lengths: prompts lognormal (median 1020, sigma 1.0,
max 8000), outputs lognormal (median 129, sigma 0.86, max 2048). For each policy and size it prints wall
time, simulated requests and iterations per second and peak memory (each run in a fresh process, so the
peak is that run's), and times one max-concurrency search end to end (experiments.search_run, one core):
the largest closed-loop concurrency whose steady-state TTFT p99 stays <= 200 ms in every one of 3 seeds,
5,000 requests per evaluation. `--check N` also runs the SimPy engine (fast_path: off) on N requests and compares.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

TRAFFIC = {
    "model": "llama-3-8b", "hardware": "h100-sxm",
    "workload": {"arrival": {"process": "poisson", "rate_per_s": 11.0},
                 "prompt_tokens": {"dist": "lognormal", "median": 1020, "sigma": 1.0, "max": 8000},
                 "output_tokens": {"dist": "lognormal", "median": 129, "sigma": 0.86, "max": 2048}},
}
POLICIES = ("chunked_prefill", "continuous", "static")


def config(policy: str, num_requests: int, fast_path: str = "auto", arrival: dict | None = None,
           profile: str = "roofline") -> dict:
    workload = {**TRAFFIC["workload"], "num_requests": num_requests}
    if arrival is not None:
        workload["arrival"] = arrival
    return {**TRAFFIC, "profile": profile, "engine": {"policy": policy, "fast_path": fast_path},
            "workload": workload}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux reports KiB


def one_run(policy: str, num_requests: int, fast_path: str, profile: str) -> dict:
    """Run in this process (the parent starts a fresh one per run): wall time, CPU time, peak memory."""
    from experiments.simulate import simulate
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(config(policy, num_requests, fast_path, profile=profile), seed=0)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    s = result.summary
    return {"policy": policy, "num_requests": num_requests, "fast_path": fast_path, "wall_s": wall_s, "cpu_s": cpu_s,
            "requests_per_s": num_requests / wall_s, "iterations": s["num_iterations"],
            "iterations_per_s": s["num_iterations"] / wall_s, "peak_rss_mb": peak_rss_mb(),
            "simulated_s": s["duration_s"], "ttft_p99_ms": s["ttft_p99_ms"], "itl_p50_ms": s["itl_p50_ms"],
            "throughput_rps": s["throughput_rps"]}


def search(policy: str = "chunked_prefill", profile: str = "roofline", seeds=(0, 1, 2), num_requests: int = 5000,
           ttft_p99_ms: float = 200.0) -> dict:
    """One max-concurrency search end to end with experiments.search_run (issue 4): the largest number of
    closed-loop users whose steady-state TTFT p99 meets the SLO in every seed, on one core (jobs=1)."""
    from experiments.search_run import run_search
    sweep = {**config(policy, num_requests, arrival={"process": "closed", "concurrency": 1}, profile=profile),
             "seeds": list(seeds),
             "search": {"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": ttft_p99_ms},
                        "range": [1, 1024], "confidence": "all"}}
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_search(sweep, out_dir=None, jobs=1, progress=False)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    pts = result.points
    return {"policy": policy, "max_concurrency": int(result.searches.iloc[0]["max_value"]),
            "wall_s": wall_s, "cpu_s": cpu_s, "num_simulations": len(pts),
            "evaluations": [(int(r.concurrency), int(r.seed), float(r.ttft_p99_ms)) for r in pts.itertuples()],
            "peak_rss_mb": peak_rss_mb()}


def in_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.speed", "--child", *args], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--static-max", type=int, default=10_000,
                    help="largest size run for static batching (it is overloaded at 11 req/s: the queue grows)")
    ap.add_argument("--check", type=int, default=0, metavar="N",
                    help="also time the SimPy engine on N requests per policy (and check equal results)")
    ap.add_argument("--profile", default="roofline",
                    help="cost model: roofline (default), or a shipped measured profile name / path")
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        res = one_run(rest[0], int(rest[1]), rest[2], rest[3]) if kind == "run" else search(profile=rest[0])
        print(json.dumps(res))
        return
    print(f"cost model: {args.profile}; wall = elapsed time, cpu = this process's CPU time (equal on an idle core)")
    print(f"{'policy':<16}{'path':>6}{'requests':>10}{'wall s':>9}{'cpu s':>8}{'req/s':>10}{'iters':>10}"
          f"{'iters/s':>10}{'peak MB':>9}{'TTFT p99 ms':>13}")
    for policy in args.policies:
        runs = [(n, "auto") for n in args.sizes if policy != "static" or n <= args.static_max]
        if args.check:
            runs.insert(0, (args.check, "off"))
        for n, path in runs:
            r = in_child("run", policy, str(n), path, args.profile)
            print(f"{policy:<16}{'simpy' if path == 'off' else 'fast':>6}{n:>10}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}"
                  f"{r['requests_per_s']:>10.0f}{r['iterations']:>10}{r['iterations_per_s']:>10.0f}"
                  f"{r['peak_rss_mb']:>9.0f}{r['ttft_p99_ms']:>13.1f}", flush=True)
    if not args.no_search:
        r = in_child("search", args.profile)
        print(f"max-concurrency search (experiments.search_run, {r['policy']}, TTFT p99 <= 200 ms, 3 seeds x 5000 "
              f"requests, closed loop, jobs=1): "
              f"{r['max_concurrency']} users, {r['num_simulations']} simulations in {r['wall_s']:.1f} s "
              f"wall, {r['cpu_s']:.1f} s cpu, peak {r['peak_rss_mb']:.0f} MB", flush=True)
        print("  evaluations (concurrency, seed, TTFT p99 ms): "
              + ", ".join(f"({c}, {sd}, {p:.0f})" for c, sd, p in r["evaluations"]), flush=True)


if __name__ == "__main__":
    main()

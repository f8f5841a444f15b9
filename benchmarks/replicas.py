"""Several replicas on the fast path against the SimPy engine: a cluster behind a router and a
prefill/decode disaggregated deployment, the engine alone (`simulate()`), each run in a fresh child process
on one core, fast and SimPy alternating; the results must be identical (checked on the summary here,
bitwise on every table by tests/test_fastcluster.py and tests/test_fastdisagg.py).

    python -m benchmarks.replicas                       # 20,000 requests, 3 repeats (about 4 minutes idle)
    python -m benchmarks.replicas --num-requests 5000 --repeats 1

Traffic: benchmarks.speed's (Llama-3-8B on H100 SXM, Azure-conversation-like lengths, the default cost
model), at 11 req/s for one replica (the reference), 4 x 11 req/s for a 4-replica cluster (least
outstanding) and 2 x 11 req/s for 1 prefill + 2 decode replicas.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.speed import ROOT, config, peak_rss_mb
from commandline.argtypes import positive_int
from commandline.exits import run_main
from commandline.parser import Parser

DEPLOYMENTS = {
    "single": ({}, 11.0),   # the reference: one replica, whose fast engine prices quiet stretches in bulk
    "cluster-4": ({"cluster": {"num_replicas": 4, "router": "least_outstanding"}}, 4 * 11.0),
    "disagg-1p2d": ({"disaggregation": {"num_prefill_replicas": 1, "num_decode_replicas": 2}}, 2 * 11.0),
}


def point(name: str, num_requests: int, fast_path: str) -> dict:
    extra, rate = DEPLOYMENTS[name]
    cfg = config("continuous", num_requests, fast_path=fast_path)
    cfg["workload"]["arrival"]["rate_per_s"] = rate
    return {**cfg, **extra}


def child(name: str, num_requests: int, fast_path: str) -> None:
    from experiments.simulate import simulate
    start, cpu_start = time.perf_counter(), time.process_time()
    s = simulate(point(name, num_requests, fast_path), seed=0).summary
    print(json.dumps({"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu_start,
                      "peak_mb": peak_rss_mb(), "summary": {k: v for k, v in s.items() if isinstance(v, (int, float))}}))


def in_child(name: str, num_requests: int, fast_path: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.replicas", "--child", name, str(num_requests), fast_path],
                         check=True, cwd=ROOT, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m benchmarks.replicas", description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=positive_int, default=20_000)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return 0
    print(f"{args.num_requests:,} requests, {args.repeats} repeats alternating, CPU seconds of the engine alone "
          "(medians); speed-up = SimPy / fast per repeat, median")
    print(f"{'deployment':<13}{'fast cpu':>9}{'SimPy cpu':>10}{'speed-up':>9}{'iterations':>11}  identical")
    for name in DEPLOYMENTS:
        fast, slow = [], []
        for _ in range(args.repeats):
            fast.append(in_child(name, args.num_requests, "on"))
            slow.append(in_child(name, args.num_requests, "off"))
        ratio = statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in zip(fast, slow))
        identical = all(same(a["summary"], b["summary"]) for a, b in zip(fast, slow))
        print(f"{name:<13}{statistics.median(r['cpu_s'] for r in fast):>9.2f}"
              f"{statistics.median(r['cpu_s'] for r in slow):>10.2f}{ratio:>8.1f}x"
              f"{fast[0]['summary']['num_iterations']:>11,}  {'yes' if identical else 'NO'}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main, kept="the deployments printed above")

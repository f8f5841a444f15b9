"""Peak memory of a whole `python -m experiments.run` (one fast-path point, --jobs 1, Parquet tables and
plots) against the number of requests, on benchmarks.speed's traffic (continuous batching, default cost
model): the peak resident set of the child process, and the slope per request between the sizes given.

    python -m benchmarks.memory 100000 300000 1000000
"""
from __future__ import annotations

from benchmarks.speed import end_to_end
from commandline.argtypes import positive_int
from commandline.exits import run_main
from commandline.parser import Parser
from policies import POLICIES


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m benchmarks.memory", description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="+", type=positive_int, help="numbers of requests, one run each")
    ap.add_argument("--policy", default="continuous", choices=sorted(POLICIES))
    args = ap.parse_args(argv)
    print(f"{'requests':>10} {'peak MiB':>9} {'wall s':>7} {'cpu s':>6} {'tables MB':>10}")
    rows = []
    for n in args.sizes:
        r = end_to_end(args.policy, n)
        rows.append((n, r["peak_mb"]))
        print(f"{n:>10,} {r['peak_mb']:>9.0f} {r['wall_s']:>7.1f} {r['cpu_s']:>6.1f} {r['tables_mb']:>10.1f}", flush=True)
    for (n0, m0), (n1, m1) in zip(rows, rows[1:]):
        if n1 != n0:
            print(f"slope {n0:,} -> {n1:,}: {(m1 - m0) * 2**20 / (n1 - n0):,.0f} bytes per request")
    return 0


if __name__ == "__main__":
    run_main(main, kept="the sizes printed above")

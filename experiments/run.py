"""`python -m experiments.run SWEEP.yaml [--out DIR] [--jobs N]`: run a sweep and print its summary table."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from costmodels.catalog import CatalogError
from experiments.config import ConfigError, load_sweep_file
from experiments.sweep import run_sweep, summary_table
from simcore.engine import SimulationError
from workloads.errors import WorkloadError

USER_ERRORS = (ConfigError, CatalogError, WorkloadError, SimulationError)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.run", description=__doc__)
    ap.add_argument("sweep", help="sweep YAML file")
    ap.add_argument("--out", help="output folder (default: results/<name>); rerunning into it resumes")
    ap.add_argument("--jobs", type=int, default=None, help="parallel worker processes (default: all cores)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        sweep = load_sweep_file(args.sweep)
        out = Path(args.out) if args.out else Path("results") / str(sweep.get("name") or Path(args.sweep).stem)
        result = run_sweep(sweep, out, jobs=args.jobs, progress=not args.quiet)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished points are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    print(summary_table(result.results, list((sweep.get("grid") or {}).keys())))
    skipped = f" ({result.num_skipped} finished earlier, skipped)" if result.num_skipped else ""
    print(f"\n{len(result.results)} points{skipped}; results in {out}/results.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m experiments.run SWEEP.yaml [--out DIR] [--jobs N] [--dask ADDRESS] [--tables csv]`: run a
sweep (or, with a `search:` block, an SLO search per grid point, plus a capacity plan with a `capacity:`
block), print its summary, and write plots and summary.md into the output folder."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def imports_frozen():
    """For imports of long-lived modules: no cyclic garbage collection inside, then every object made so far
    moved out of the collector's sight (`gc.freeze`). pandas, pyarrow and matplotlib create some 150,000
    objects that live as long as the process; the collector, triggered every 700 allocations, would walk
    them again and again, and once more all at once when re-enabled (0.3 s of CPU at 100k requests, 0.13 s
    at 2,000, measured side by side; see docs/speed.md). Reference counting still frees what
    is dropped."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


# The simulator's numpy work is small arrays in one thread per process (--jobs runs processes): OpenBLAS's
# own threads, one per core, would only spin idle once started, costing CPU in every process and worker.
# Read when numpy loads, so set before the imports below; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

with imports_frozen():
    from commandline.interrupts import raise_if_interrupted, remember_interrupts
    from commandline.progress import PROGRESS_MODES
    from costmodels.basis import rests_on
    from experiments.answer_basis import router_bases_of, schedules_line, seeds_line, vllm_versions_of
    from commandline.argtypes import positive_int
    from commandline.outputs import OutputError, out_dir
    from commandline.parser import Parser
    from costmodels.catalog import CatalogError
    from experiments.config import ConfigError, expand, load_sweep_file
    from experiments.config_warnings import point_warnings
    from experiments.simulate import check_runnable, point_cost_model
    from experiments.sweep import run_sweep, summary_table, untrusted_lines
    from experiments.tables import TABLE_FORMATS
    from simcore.engine import SimulationError
    from workloads.errors import WorkloadError

USER_ERRORS = (ConfigError, CatalogError, WorkloadError, SimulationError)


def check_out_dir(out: Path) -> None:
    """The output folder must be a folder we can write (created if missing): one line if not."""
    try:
        out_dir(out, create=True)
    except OutputError as e:
        raise ConfigError(str(e)) from None


def validate(sweep: dict) -> None:
    """Resolve the whole sweep file (points, and the search and capacity blocks) and check each point's
    memory plan and cost model, without running anything; print a warning line (stderr) for each setting
    that runs but may not mean what it seems (experiments/config_warnings.py)."""
    if "search" in sweep:
        from experiments.capacity_plan import parse_capacity
        from experiments.search import parse_search
        from experiments.search_run import grid_points
        points = grid_points(sweep, parse_search(sweep.get("search")))[0]
        if "capacity" in sweep:
            parse_capacity(sweep["capacity"])
    else:
        points = expand(sweep)
    warned = []
    for cfg in {id(p.config): p.config for p in points}.values():
        check_runnable(cfg)
        for line in point_warnings(cfg, point_cost_model(cfg).describe()):
            if line not in warned:
                warned.append(line)
    for line in warned:
        print(f"warning: {line}", file=sys.stderr)


def point_bases(results) -> dict:
    """point -> the cost-model line its results rest on (results.csv's cost_model_basis)."""
    if "cost_model_basis" not in results:
        return {}
    return dict(zip(results["point"], results["cost_model_basis"]))


def _run(args, progress: str) -> str:
    """The command's work: the sweep (or search and plan) run and reported; the text to print."""
    sweep = load_sweep_file(args.sweep)
    out = Path(args.out) if args.out else Path("results") / str(sweep.get("name") or Path(args.sweep).stem)
    validate(sweep)  # every point resolved (any bad key named) before the output folder is touched
    check_out_dir(out)
    if "search" in sweep:
        with imports_frozen():
            from experiments.search_and_plan import run_and_report
        text = run_and_report(sweep, out, args.jobs, progress, args.dask, not args.no_plots, args.tables)
    else:
        if "capacity" in sweep:
            raise ConfigError("capacity: needs a search block (search.over: workload.arrival.rate_per_s) "
                              "to find each replica's SLO-limited capacity")
        result = run_sweep(sweep, out, jobs=args.jobs, progress=progress, dask_address=args.dask,
                           table_format=args.tables)
        skipped = f" ({result.num_skipped} finished earlier, skipped)" if result.num_skipped else ""
        text = (summary_table(result.results, list((sweep.get("grid") or {}).keys()))
                + f"\n\n{len(result.results)} points{skipped}; results in {out}/results.csv")
        if not args.no_plots:
            with imports_frozen():
                from experiments.report_sweep import sweep_report
            sweep_report(sweep, out, result.results)
            text += f"; plots and summary.md in {out}"
        schedules = schedules_line(result.results['policy'], vllm_versions_of(result.results),
                                   router_bases_of(result.results))
        text += (f"\nrests on the {rests_on(point_bases(result.results))}\n"
                 f"{schedules}; {seeds_line(result.results['seed'].nunique())}")
        notes = untrusted_lines(result.results, list((sweep.get("grid") or {}).keys()))
        if notes:
            text += (f"\n\nWARNING: {len(notes)} of {len(result.results)} results cannot be taken at face "
                     "value:\n" + "\n".join(notes))
    raise_if_interrupted()   # a Ctrl-C that landed where Python could only print it (commandline/interrupts.py)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m experiments.run", description=__doc__)
    ap.add_argument("sweep", help="sweep YAML file")
    ap.add_argument("--out", help="output folder (default: results/<name>); rerunning into it resumes")
    ap.add_argument("--jobs", type=positive_int, default=None, help="parallel worker processes (default: all cores)")
    ap.add_argument("--dask", metavar="ADDRESS", help="run on a Dask distributed scheduler (e.g. tcp://host:8786)")
    ap.add_argument("--no-plots", action="store_true", help="skip plots and summary.md")
    ap.add_argument("--tables", choices=TABLE_FORMATS, default="parquet",
                    help="format of each run's requests, iterations and itl tables (default: parquet; "
                         "results.csv is always CSV)")
    ap.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                    help="how progress is shown: a bar, plain lines (every ~10 s or 10%%, for logs), or none; "
                         "auto (the default): a bar on a terminal, plain lines otherwise")
    ap.add_argument("--quiet", action="store_true", help="no progress output (the same as --progress none)")
    args = ap.parse_args(argv)
    progress = "none" if args.quiet else args.progress
    try:
        with remember_interrupts():
            text = _run(args, progress)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the disk, not the simulator: full, unwritable, removed under us
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished points are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    try:
        print(text, flush=True)
    except BrokenPipeError:   # the reader stopped early (`| head`): the results are on disk, nothing failed
        pass
    return 0


if __name__ == "__main__":
    rc = main()
    # Every file is written and closed, the workers and any Dask client are gone (main's `with` blocks saw
    # to that; on Ctrl-C, what finished is on disk): skip the interpreter's teardown, which frees every
    # imported module one by one, work nobody waits for.
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(rc)

"""A sweep run as a user runs it, `python -m experiments.run SWEEP --jobs 1 --quiet`, in a child process, timed
from outside: its wall time and its own rusage (user and system CPU, peak resident memory, as /usr/bin/time
reports them). Shared by the benchmarks that time whole runs (benchmarks.speed, benchmarks.autoscaling_day)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_sweep(sweep: dict, tmp: Path, name: str = "sweep.yaml"):
    """Writes `sweep` to `tmp`/`name` and runs it into `tmp`/out; returns (wall seconds, resource usage).
    A failed run exits with its stderr's tail."""
    path = tmp / name
    path.write_text(yaml.safe_dump(sweep))
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "experiments.run", str(path), "--out", str(tmp / "out"),
                             "--jobs", "1", "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except KeyboardInterrupt:   # the child is stopped before its temporary folder is removed under it
        proc.kill()
        proc.wait()
        raise
    wall_s = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"experiments.run failed ({code}): {proc.stderr.read().decode()[-2000:]}")
    proc.stderr.close()
    return wall_s, usage

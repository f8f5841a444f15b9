"""Ctrl-C and kill -9 during a sweep, with the real command in its own process group (as a terminal runs
it): Ctrl-C at the default --jobs exits 130 within a second, keeps every finished point and stops the
workers; after either, a rerun into the same folder reuses what was saved and loses nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments.config import load_sweep_file
from experiments.sweep import run_sweep

SWEEP = {"name": "interrupt", "model": "llama-3-8b", "hardware": "h100-sxm",
         "engine": {"policy": "chunked_prefill", "fast_path": "off"},   # the SimPy engine: points take a while
         "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate_per_s": 4},
                      "prompt_tokens": {"dist": "lognormal", "median": 512, "sigma": 1.0, "max": 4096},
                      "output_tokens": {"dist": "lognormal", "median": 128, "sigma": 0.8, "max": 1024}},
         "grid": {"workload.arrival.rate_per_s": [1, 2, 3, 4, 5, 6, 7, 8]}}

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump(SWEEP))
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "experiments.run", str(f), "--out", str(out), "--no-plots", "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         cwd=Path(__file__).resolve().parents[1])
    return p, out


def _saved(out: Path) -> dict[str, dict]:
    return {f.parent.name: json.loads(f.read_text()) for f in (out / "points").glob("*/summary.json")}


def _wait_for_a_point(p: subprocess.Popen, out: Path, timeout_s: float = 90.0) -> None:
    t0 = time.monotonic()
    while not _saved(out):
        if p.poll() is not None or time.monotonic() - t0 > timeout_s:
            p.kill()
            pytest.fail(f"no point finished (exit {p.returncode}): {p.stderr.read() if p.stderr else ''}")
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_ctrl_c_at_default_jobs_exits_130_within_a_second_keeping_finished_points(tmp_path):
    p, out = _start(tmp_path)
    _wait_for_a_point(p, out)
    workers = _children(p.pid)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)   # a terminal sends Ctrl-C to the whole foreground group
    rc = p.wait(timeout=30)
    took = time.monotonic() - t0
    err = p.stderr.read()
    assert rc == 130, err
    assert took < 1.0, f"exit took {took:.2f} s"
    assert "interrupted" in err and "Traceback" not in err
    saved = _saved(out)
    assert 1 <= len(saved) < len(SWEEP["grid"]["workload.arrival.rate_per_s"])
    assert set(pd.read_csv(out / "results.csv")["point"]) == set(saved)  # results.csv holds the finished ones
    time.sleep(0.2)
    alive = [w for w in workers if Path(f"/proc/{w}").exists()
             and "zombie" not in Path(f"/proc/{w}/status").read_text().lower()]
    assert not alive, f"workers still running after the exit: {alive}"


def test_sigkill_then_rerun_loses_nothing(tmp_path):
    p, out = _start(tmp_path)
    _wait_for_a_point(p, out)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    before = _saved(out)
    assert before
    again = run_sweep(load_sweep_file(tmp_path / "sweep.yaml"), out, jobs=1, progress=False)
    n = len(SWEEP["grid"]["workload.arrival.rate_per_s"])
    assert again.num_skipped == len(before) and len(again.results) == n
    after = _saved(out)
    for pid, row in before.items():  # what was saved before the kill is reused as it was
        assert after[pid] == row


class _TakesCtrlC:
    """An object whose finalizer is running when Ctrl-C arrives: Python can only print that interrupt."""
    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def test_a_ctrl_c_that_a_finalizer_swallowed_is_raised_again_at_the_next_check(monkeypatch):
    from commandline.interrupts import raise_if_interrupted, remember_interrupts
    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    carried_on = False
    with pytest.raises(KeyboardInterrupt):
        with remember_interrupts():
            _TakesCtrlC()          # made and dropped: its __del__ takes the signal
            carried_on = True      # ... and the program carries on, as it would mid-sweep
            raise_if_interrupted()
    assert swallowed == [KeyboardInterrupt] and carried_on
    raise_if_interrupted()         # outside the block the interrupt is spent: nothing is raised

"""Sweeps: rerunning into the same folder skips finished points; per-point ITL gaps are saved."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import experiments.sweep as sweep_mod
from experiments.simulate import simulate
from experiments.sweep import run_sweep
from experiments.tables import read_itl_ms, read_table

SWEEP = {
    "name": "resume", "seeds": [0, 1], "model": "llama-3-8b", "hardware": "h100-sxm",
    "engine": {"policy": "continuous"},
    "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate_per_s": 4},
                 "prompt_tokens": {"dist": "uniform", "min": 16, "max": 128},
                 "output_tokens": {"dist": "uniform", "min": 4, "max": 16}},
    "grid": {"engine.policy": ["static", "continuous"]},
}


def test_rerun_skips_every_finished_point(tmp_path, monkeypatch):
    first = run_sweep(SWEEP, tmp_path, jobs=1, progress=False)
    assert len(first.results) == 4 and first.num_skipped == 0

    def boom(point, *_):
        raise AssertionError(f"{point.point_id} ran again")
    monkeypatch.setattr(sweep_mod, "_run_point", boom)
    again = run_sweep(SWEEP, tmp_path, jobs=1, progress=True)
    assert again.num_skipped == 4
    cols = list(first.results.columns.drop("wall_s"))
    pd.testing.assert_frame_equal(again.results[cols], first.results[cols],
                                  check_dtype=False)


def test_interrupted_sweep_runs_only_the_missing_points(tmp_path, monkeypatch):
    run_sweep(SWEEP, tmp_path, jobs=1, progress=False)
    (tmp_path / "points" / "p001-seed1" / "summary.json").unlink()   # as if killed mid-point
    ran = []
    real = sweep_mod._run_point
    monkeypatch.setattr(sweep_mod, "_run_point", lambda p, *rest: ran.append(p.point_id) or real(p, *rest))
    again = run_sweep(SWEEP, tmp_path, jobs=1, progress=False)
    assert ran == ["p001-seed1"] and again.num_skipped == 3 and len(again.results) == 4


def test_pooled_itl_gaps_are_saved_per_point(tmp_path):
    run_sweep({**SWEEP, "seeds": [0], "grid": {"engine.policy": ["continuous"]}}, tmp_path, jobs=1, progress=False)
    d = tmp_path / "points" / "p000-seed0"
    gaps_ms, counts = read_itl_ms(d)
    req = read_table(d, "requests")
    assert (d / "itl.parquet").exists() and int(counts.sum()) == int((req["output_tokens"] - 1).sum())
    assert np.all(np.diff(gaps_ms) > 0)   # distinct gaps, sorted
    sim = simulate({k: v for k, v in SWEEP.items() if k not in ("grid", "seeds")}, 0)
    expanded = np.repeat(gaps_ms, counts)
    assert np.percentile(expanded, 99) == pytest.approx(sim.summary["itl_p99_ms"], rel=1e-12)
    assert np.percentile(expanded, 99) == pytest.approx(np.percentile(sim.itl_gaps_s * 1e3, 99), rel=1e-12)
    assert len(sim.itl_end_s) == len(sim.itl_gaps_s) and np.all(np.diff(sim.itl_end_s) >= 0)


def test_a_cluster_point_saves_its_replicas_table(tmp_path):
    cluster = {**SWEEP, "seeds": [0], "grid": {"cluster.num_replicas": [2, 1]}, "cluster": {"num_replicas": 2}}
    run_sweep(cluster, tmp_path, jobs=1, progress=False)
    replicas = read_table(tmp_path / "points" / "p000-seed0", "replicas")
    sim = simulate({k: v for k, v in cluster.items() if k not in ("grid", "seeds")}, 0)
    pd.testing.assert_frame_equal(replicas, sim.replicas, check_dtype=False)
    assert replicas["num_requests"].sum() == 12
    assert not (tmp_path / "points" / "p001-seed0" / "replicas.parquet").exists()   # one replica: none

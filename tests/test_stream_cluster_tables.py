"""A cluster's tables streamed as it runs (simcore/fast/cluster.py with an iteration sink, the binding analysis
read back in chunks: experiments/binding_streamed.py) against the in-memory ones: the same rows in every
table (replicas included), the same summary bit for bit, fixed and autoscaled, with several chunks."""
from __future__ import annotations

import pandas as pd
import pytest

import experiments.binding_streamed as binding_streamed_mod
import experiments.tables as tables_mod
import simcore.fast.log as fastlog_mod

from experiments.simulate import simulate
from experiments.tables import TABLES, read_table
from tests.test_stream_tables import POINT, same_summary

CLUSTER = {**POINT, "workload": {**POINT["workload"], "arrival": {"process": "poisson", "rate_per_s": 90}},
           "cluster": {"num_replicas": 3, "router": "least_outstanding"}}
AUTOSCALED = {**CLUSTER, "cluster": {"router": "least_outstanding"},
              "autoscaling": {"min_replicas": 1, "max_replicas": 4, "signal": "waiting_per_replica",
                              "scale_up_above": 1.0, "scale_down_below": 0.2, "window_s": 1, "startup_s": 0.5,
                              "interval_s": 0.25, "cooldown_s": 0.5}}


@pytest.fixture
def small_chunks(monkeypatch):
    """Several streamed chunks, Parquet row groups and read-back chunks even in a small run."""
    monkeypatch.setattr(fastlog_mod, "ITERATION_CHUNK_ROWS", 37)
    monkeypatch.setattr(tables_mod, "ROWS_PER_SLICE", 50)
    monkeypatch.setattr(binding_streamed_mod, "CHUNK_ROWS", 61)


@pytest.mark.parametrize("point", [CLUSTER, AUTOSCALED], ids=["fixed", "autoscaled"])
def test_a_streamed_cluster_equals_it_in_memory(tmp_path, small_chunks, point):
    mem = simulate(point, seed=3)
    assert mem.summary["num_iterations"] > 5 * 37 and mem.iterations["replica_id"].nunique() > 1
    assert "bind_kv_time" in mem.summary
    streamed = simulate(point, seed=3, tables_dir=tmp_path)
    assert streamed.tables_saved and not len(streamed.iterations)
    same_summary(mem.summary, streamed.summary)
    pd.testing.assert_frame_equal(streamed.replicas, mem.replicas, check_exact=True)
    pd.testing.assert_frame_equal(read_table(tmp_path, "iterations"), mem.iterations, check_exact=True)
    pd.testing.assert_frame_equal(read_table(tmp_path, "replicas"), mem.replicas, check_exact=True)
    on_disk = read_table(tmp_path, "requests")
    pd.testing.assert_frame_equal(on_disk, mem.requests[on_disk.columns], check_exact=True)
    for name in TABLES:
        assert (tmp_path / f"{name}.parquet").exists()

"""Streamed tables (a fast-path point saved while it runs: experiments/tables.TableWriter) against the
in-memory ones: the same rows in every table, the same summary, the same results.csv row; and the fast
engine keeps no record of a finished request."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import experiments.tables as tables_mod
import simcore.fast.log as fastlog_mod
from experiments.simulate import simulate
from experiments.sweep import run_sweep
from experiments.tables import TABLES, read_table, write_run_tables
from simcore.engine import EngineLimits, SimulationError
from simcore.fast.engine import FastEngine
from simcore.costmodel import ConstantCost
from simcore.request import RequestSpec
from policies import Continuous

# Tight KV (preemptions), prompts past max_model_len (rejections), priority classes, an SLO column.
POINT = {
    "model": "llama-3-8b", "hardware": "h100-sxm",
    "engine": {"policy": "chunked_prefill", "num_gpu_blocks": 90, "max_num_batched_tokens": 512},
    "workload": {"num_requests": 300, "arrival": {"process": "poisson", "rate_per_s": 40},
                 "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 1.2, "max": 9000},
                 "output_tokens": {"dist": "uniform", "min": 1, "max": 60}},
    "slo": {"ttft_ms": 500, "tpot_ms": 30},
}


def same_summary(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        same = a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k]))
        assert same, (k, a[k], b[k])


@pytest.fixture
def small_chunks(monkeypatch):
    """Several streamed chunks and Parquet row groups even in a small run."""
    monkeypatch.setattr(fastlog_mod, "ITERATION_CHUNK_ROWS", 37)
    monkeypatch.setattr(tables_mod, "ROWS_PER_SLICE", 50)


@pytest.mark.parametrize("table_format", ["parquet", "csv"])
def test_streamed_tables_and_summary_equal_in_memory(tmp_path, small_chunks, table_format):
    mem = simulate(POINT, seed=3)
    s = mem.summary
    assert s["num_rejected"] > 0 and s["num_preemptions"] > 0 and s["num_iterations"] > 3 * 37
    write_run_tables(tmp_path / "mem", mem.requests, mem.iterations, mem.itl_gaps_s, table_format)
    streamed = simulate(POINT, seed=3, tables_dir=tmp_path / "stream", table_format=table_format)
    assert streamed.tables_saved and not len(streamed.requests) and not len(streamed.iterations)
    same_summary(mem.summary, streamed.summary)
    for name in TABLES:
        assert (tmp_path / "stream" / f"{name}.{table_format}").exists()
        pd.testing.assert_frame_equal(read_table(tmp_path / "stream", name), read_table(tmp_path / "mem", name),
                                      check_exact=True)
    if table_format == "parquet":   # written as it ran: one row group per streamed chunk
        import pyarrow.parquet as pq
        assert pq.ParquetFile(tmp_path / "stream" / "iterations.parquet").num_row_groups > 3


def test_sweep_saved_to_disk_streams_and_gives_the_same_row(tmp_path, small_chunks):
    sweep = {"name": "stream", "seeds": [3], **POINT, "grid": {"engine.policy": ["chunked_prefill"]}}
    in_memory = run_sweep(sweep, None, jobs=1, progress=False)
    on_disk = run_sweep(sweep, tmp_path, jobs=1, progress=False)
    assert not on_disk.points   # nothing kept: the tables went to the point folder as it ran
    cols = list(in_memory.results.columns.drop("wall_s"))
    pd.testing.assert_frame_equal(on_disk.results[cols], in_memory.results[cols], check_exact=True)
    sim = next(iter(in_memory.points.values()))
    d = tmp_path / "points" / in_memory.results["point"][0]
    pd.testing.assert_frame_equal(read_table(d, "requests"), sim.requests, check_exact=True)
    pd.testing.assert_frame_equal(read_table(d, "iterations"), sim.iterations, check_exact=True)


def test_no_iterations_gives_an_empty_table_with_the_columns(tmp_path):
    point = {**POINT, "workload": {**POINT["workload"], "num_requests": 3,
                                   "prompt_tokens": {"dist": "uniform", "min": 9000, "max": 9000}}}
    mem = simulate(point, seed=0)
    streamed = simulate(point, seed=0, tables_dir=tmp_path)
    assert mem.summary["num_rejected"] == 3 and mem.summary["num_iterations"] == 0
    same_summary(mem.summary, streamed.summary)
    pd.testing.assert_frame_equal(read_table(tmp_path, "iterations"), mem.iterations, check_dtype=False)


def test_finished_requests_are_released():
    specs = [RequestSpec(i, 0.01 * i, 20, 5) for i in range(50)]
    seen = []
    engine = FastEngine(Continuous(), ConstantCost(0.01, 0.0), EngineLimits(100, 16, 512), specs,
                        iteration_sink=lambda f, i: seen.append(len(f)))
    log = engine.simulate()
    assert engine.requests == {} and log.num_unfinished == 0 and (log.status == fastlog_mod.FINISHED).all()
    assert sum(seen) > 0 and len(log.iteration_floats) == 0   # every row went to the sink


def test_duplicate_ids_are_still_refused():
    specs = [RequestSpec(1, 0.0, 20, 5), RequestSpec(1, 0.5, 20, 5)]
    with pytest.raises(SimulationError, match="duplicate request id 1"):
        FastEngine(Continuous(), ConstantCost(0.01, 0.0), EngineLimits(100, 16, 512), specs)


@pytest.mark.parametrize("num_distinct", [500, 100_000])   # gaps repeat within and across chunks, or hardly
def test_itl_samples_gathered_chunk_by_chunk_equal_all_at_once(num_distinct):
    from simcore.metrics import ItlSamples, itl_samples
    rng = np.random.default_rng(0)
    pool = rng.random(num_distinct)
    chunks = [(pool[rng.integers(0, num_distinct, 300)], rng.integers(1, 50, 300)) for _ in range(7)]
    acc = ItlSamples()
    for values, counts in chunks + [(np.zeros(0), np.zeros(0, dtype=np.int64))]:
        acc.add(values, counts)
    got = acc.finish()
    want = itl_samples((np.concatenate([v for v, _ in chunks]), np.concatenate([c for _, c in chunks])))
    assert got[1].dtype == np.int64 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert [len(a) for a in ItlSamples().finish()] == [0, 0]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 128, 129, 255, 1000, 4097, 100_003])
def test_pairwise_column_sums_equal_numpy_whatever_the_chunks(n):
    """simcore.pairwise: numpy's float64 sum of a column, bit for bit, from chunks of any size (a
    streamed run's time-weighted means depend on it)."""
    from simcore.pairwise import column_sums
    rng = np.random.default_rng(n)
    x = rng.random((n, 3)) * rng.integers(0, 500, (n, 3))
    want = [float(x[:, j].copy().sum()) for j in range(3)]
    for size in (37, 1000, 1 << 18):
        assert column_sums([x[i:i + size] for i in range(0, n, size)], n, 3) == want

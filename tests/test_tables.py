"""Per-run tables on disk (experiments/tables.py) and the plots' reductions of big data (experiments/plots.py):
Parquet and CSV round trips, slice-by-slice writing, the older .npy ITL file, `--tables csv`, CDFs from
quantiles and binned engine-state series."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import experiments.tables as tables
from experiments.plots import binned_series, cdf_points
from experiments.tables import itl_frame, read_itl_ms, read_table, write_run_tables, write_table

ROOT = Path(__file__).resolve().parents[1]


def frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"request_id": np.arange(n), "ttft_s": rng.random(n), "status": ["finished"] * n,
                         "reject_reason": np.full(n, None, object), "tpot_s": np.where(rng.random(n) < 0.1, np.nan, 1.0)})


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_tables_round_trip_in_slices(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(tables, "ROWS_PER_SLICE", 7)   # several slices (row groups) for 50 rows
    df = frame(50)
    path = write_table(df, tmp_path / "requests", fmt)
    assert path.name == f"requests.{fmt}"
    back = read_table(tmp_path, "requests")
    pd.testing.assert_frame_equal(back.drop(columns="reject_reason"), df.drop(columns="reject_reason"))
    assert back["reject_reason"].isna().all()
    assert list(read_table(tmp_path, "requests", ["ttft_s", "not_there"]).columns) == ["ttft_s"]
    if fmt == "parquet":
        import pyarrow.parquet as pq
        assert pq.ParquetFile(path).num_row_groups == 8


def test_an_empty_table_round_trips(tmp_path):
    write_table(frame(0), tmp_path / "iterations")
    assert len(read_table(tmp_path, "iterations")) == 0


def test_itl_is_saved_as_weighted_samples_with_the_same_percentiles(tmp_path):
    gaps_s = np.random.default_rng(1).choice([0.01, 0.02, 0.025, 0.3], size=1000)
    write_run_tables(tmp_path, frame(3), frame(3), gaps_s)
    values_ms, counts = read_itl_ms(tmp_path)
    assert values_ms.tolist() == sorted(set((gaps_s * 1e3).tolist())) and counts.sum() == 1000
    for p in (50, 90, 99):
        assert np.percentile(np.repeat(values_ms, counts), p) == np.percentile(gaps_s * 1e3, p)
    # the fast path's lazily expanded gaps are read as (values, counts), never expanded
    from experiments.fast import Repeated
    lazy = Repeated(np.array([0.02, 0.01, 0.02]), np.array([3, 1, 2]))
    assert itl_frame(lazy).to_dict("list") == {"gap_ms": [10.0, 20.0], "count": [1, 5]}


def test_a_rewrite_in_the_other_format_leaves_one_version(tmp_path):
    np.save(tmp_path / "itl_gaps_ms.npy", np.array([1.0, 2.0, 2.0], dtype=np.float32))   # older layout
    assert read_itl_ms(tmp_path)[1].tolist() == [1, 2]
    write_run_tables(tmp_path, frame(3), frame(3), np.array([0.001]), "csv")
    write_run_tables(tmp_path, frame(3), frame(3), np.array([0.001]), "parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iterations.parquet", "itl.parquet", "requests.parquet"]


def test_cdf_points_are_exact_for_small_data_and_quantiles_for_big():
    x, y = cdf_points([3.0, 1.0, 2.0, np.nan])
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == [1 / 3, 2 / 3, 1.0]
    v = np.random.default_rng(2).lognormal(size=200_000)
    x, y = cdf_points(v)
    assert len(x) <= 1200 and y[-1] == 1.0 and x[-1] == v.max()
    for q in (0.5, 0.99, 0.999):   # the drawn line passes within a pixel of the data's quantiles
        assert np.interp(q, y, x) == pytest.approx(np.quantile(v, q), rel=2e-3)
    xw, yw = cdf_points([2.0, 1.0], [3, 1])   # weighted
    assert xw.tolist() == [1.0, 2.0] and yw.tolist() == [0.25, 1.0]


def test_binned_series_keeps_each_bins_extremes():
    t = np.arange(100_000) * 0.01
    y = np.zeros(100_000)
    y[54_321] = 7.0   # one spike
    b = binned_series(pd.Series(t), pd.Series(y), num_bins=100)
    assert len(b) == 100 and b["max"].max() == 7.0 and b["min"].min() == 0.0
    assert b.index[0] == 0.0 and b["mean"].sum() == pytest.approx(7.0 / 1000)
    shuffle = np.random.default_rng(0).permutation(len(t))   # rows out of time order bin the same
    pd.testing.assert_frame_equal(binned_series(pd.Series(t[shuffle]), pd.Series(y[shuffle]), num_bins=100), b)


def test_command_line_tables_csv(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\nengine: {policy: continuous}\nworkload:\n  num_requests: 20\n"
                     "  arrival: {process: poisson, rate_per_s: 5}\n"
                     "  prompt_tokens: {dist: fixed, value: 64}\n  output_tokens: {dist: fixed, value: 8}\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "experiments.run", str(sweep), "--out", str(out), "--jobs", "1",
                        "--quiet", "--tables", "csv"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = out / "points" / "p000-seed0"
    assert {p.name for p in d.iterdir()} >= {"requests.csv", "iterations.csv", "itl.csv"}
    assert len(pd.read_csv(d / "requests.csv")) == 20 and (out / "plots" / "latency_cdf.png").exists()
    bad = subprocess.run([sys.executable, "-m", "experiments.run", str(sweep), "--tables", "xlsx"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: argument --tables")


def test_binned_chunks_equal_binned_series(tmp_path, monkeypatch):
    """The engine-state plot of a long run bins its table slice by slice (never whole in memory): the same
    bins, extremes and (up to rounding) means as binning the whole table."""
    from experiments.plots import binned_chunks
    from experiments.tables import iter_table, table_num_rows, write_table
    monkeypatch.setattr(tables, "ROWS_PER_SLICE", 1000)
    rng = np.random.default_rng(0)
    n = 10_000
    df = pd.DataFrame({"start_s": np.sort(rng.uniform(0, 50, n)), "num_waiting": rng.integers(0, 9, n),
                       "num_running": rng.integers(0, 300, n), "kv_blocks_used": rng.integers(0, 5000, n),
                       "replica_id": np.zeros(n, dtype=np.int64)})
    for fmt in ("parquet", "csv"):
        (tmp_path / fmt).mkdir()
        write_table(df, tmp_path / fmt / "iterations", fmt)
        assert table_num_rows(tmp_path / fmt, "iterations") == n
        chunks = [c for c in iter_table(tmp_path / fmt, "iterations", ["start_s", "num_running"])]
        assert len(chunks) > 1 and sum(map(len, chunks)) == n
        got = binned_chunks(chunks, df["start_s"].min(), df["start_s"].max(), ["num_running"], num_bins=300)
        want = binned_series(df["start_s"], df["num_running"], num_bins=300)
        pd.testing.assert_frame_equal(got["num_running"], want, check_exact=False, rtol=1e-12)

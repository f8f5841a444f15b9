"""One run's big tables on disk: per-request rows, per-iteration rows and the pooled inter-token gaps.

Parquet by default (pyarrow: typed columns, compressed: a 100k-request run's tables in 27 MB instead of the
134 MB of CSV and .npy, read back column by column); CSV on request (`--tables csv`). Both are written in
slices of rows, so writing adds at most one slice to a run's memory however many rows it has. The gaps are
stored as weighted samples (`gap_ms`, `count`: every distinct gap and how many tokens had it), from which
every percentile and CDF equals the expanded data's (simcore.metrics.weighted_percentiles); the time order
of the gaps is not kept. Readers accept either format, and the older `itl_gaps_ms.npy` (every gap, float32).
A table can also be written as it is produced (`TableWriter`: the fast engine streams its iteration rows).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simcore.metrics import itl_samples

TABLE_FORMATS = ("parquet", "csv")
ROWS_PER_SLICE = 262_144   # Parquet row group / CSV write slice: bounds the memory a write adds
TABLES = ("requests", "iterations", "itl")


class TableWriter:
    """One table written piece by piece (`write(frame)` as rows come, then `close()`), so its rows never
    need to be in memory together; every piece has the first one's columns and types. Closing a writer that
    got no rows writes an empty table with `empty`'s columns."""

    def __init__(self, path: Path, table_format: str = "parquet", empty: pd.DataFrame | None = None):
        if table_format not in TABLE_FORMATS:
            raise ValueError(f"table format {table_format!r}: expected one of {', '.join(TABLE_FORMATS)}")
        self.path = Path(path).with_suffix(f".{table_format}")
        self.table_format, self.empty = table_format, empty
        self._parquet = self._schema = None
        self.num_rows = 0

    def write(self, df: pd.DataFrame) -> None:
        if self.table_format == "csv":
            df.to_csv(self.path, index=False, mode="w" if self._schema is None else "a",
                      header=self._schema is None, chunksize=max(1, ROWS_PER_SLICE // 10))
            self._schema = True
            self.num_rows += len(df)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq
        if self._schema is None:
            self._schema = pa.Schema.from_pandas(df, preserve_index=False)
            # dictionary pages for counts and strings only: float columns (times) hardly repeat, and trying
            # them costs about half the write time for nothing (files a little smaller, as measured)
            dictionary = [f.name for f in self._schema if not pa.types.is_floating(f.type)]
            self._parquet = pq.ParquetWriter(self.path, self._schema, use_dictionary=dictionary)
        for start in range(0, max(len(df), 1), ROWS_PER_SLICE):
            part = pa.Table.from_pandas(df.iloc[start:start + ROWS_PER_SLICE], schema=self._schema,
                                        preserve_index=False)
            self._parquet.write_table(part, row_group_size=ROWS_PER_SLICE)
        self.num_rows += len(df)

    def close(self) -> Path:
        if self._schema is None:
            self.write(self.empty if self.empty is not None else pd.DataFrame())
        if self._parquet is not None:
            self._parquet.close()
        return self.path


def write_table(df: pd.DataFrame, path: Path, table_format: str = "parquet") -> Path:
    """`df` at `path` with the format's suffix, written slice by slice; returns the file written."""
    writer = TableWriter(path, table_format)
    writer.write(df)
    return writer.close()


def itl_frame(itl_gaps_s) -> pd.DataFrame:
    """Pooled ITL gaps as weighted samples in ms: a flat sequence of gaps (the SimPy engine's), `(values,
    counts)`, or the fast path's lazily expanded gaps (experiments.fast.Repeated, never expanded here)."""
    if hasattr(itl_gaps_s, "values") and hasattr(itl_gaps_s, "counts"):
        itl_gaps_s = (itl_gaps_s.values, itl_gaps_s.counts)
    values_s, counts = itl_samples(itl_gaps_s)
    return pd.DataFrame({"gap_ms": np.asarray(values_s, dtype=float) * 1e3,
                         "count": counts.astype(np.int64, copy=False)}, copy=False)   # millions of rows: no copies


def write_run_tables(d: Path, requests: pd.DataFrame, iterations: pd.DataFrame | None, itl_gaps_s,
                     table_format: str = "parquet", replicas: pd.DataFrame | None = None) -> None:
    """requests, iterations, itl (weighted ITL samples) and, for several replicas (a cluster, a disaggregated
    deployment), replicas (one row per replica) into folder `d`, in `table_format`; a table of the other
    format, or a replicas table left there by an earlier run, is removed, so a folder never holds two
    versions. `iterations` None: that table was already streamed there (a TableWriter in the same format)."""
    d.mkdir(parents=True, exist_ok=True)
    for name, df in (("requests", requests), ("iterations", iterations), ("itl", itl_frame(itl_gaps_s)),
                     ("replicas", replicas)):
        if df is not None:
            write_table(df, d / name, table_format)
        elif name == "replicas":
            (d / f"{name}.{table_format}").unlink(missing_ok=True)
        for other in TABLE_FORMATS:
            if other != table_format:
                (d / f"{name}.{other}").unlink(missing_ok=True)
    (d / "itl_gaps_ms.npy").unlink(missing_ok=True)


def table_path(d: Path, name: str) -> Path | None:
    """The file holding table `name` in folder `d` (Parquet first), or None."""
    for fmt in TABLE_FORMATS:
        p = Path(d) / f"{name}.{fmt}"
        if p.exists():
            return p
    return None


def has_table(d: Path, name: str) -> bool:
    return table_path(d, name) is not None


def read_table(d: Path, name: str, columns: list[str] | None = None) -> pd.DataFrame:
    """Table `name` ('requests', 'iterations') from folder `d`, either format; `columns`: only those of
    them the table has (a folder saved by an older version may lack some)."""
    p = table_path(d, name)
    if p is None:
        raise FileNotFoundError(2, "no such table (.parquet or .csv)", str(Path(d) / name))
    if p.suffix == ".parquet":
        if columns is not None:
            import pyarrow.parquet as pq
            have = set(pq.read_schema(p).names)
            columns = [c for c in columns if c in have]
        return pd.read_parquet(p, columns=columns)
    return pd.read_csv(p, usecols=None if columns is None else (lambda c: c in set(columns)))


def table_num_rows(d: Path, name: str) -> int:
    """Rows of table `name` in folder `d` (Parquet: from its footer, nothing read; CSV: one pass)."""
    p = table_path(d, name)
    if p is None:
        raise FileNotFoundError(2, "no such table (.parquet or .csv)", str(Path(d) / name))
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.ParquetFile(p).metadata.num_rows
    return sum(len(c) for c in pd.read_csv(p, usecols=[0], chunksize=ROWS_PER_SLICE))


def iter_table(d: Path, name: str, columns: list[str], rows: int | None = None):
    """Table `name` from folder `d` as frames of at most `rows` rows (default ROWS_PER_SLICE), in order (a
    table too long to hold whole); `columns`: those of them the table has. What it holds is one chunk, not
    what it has read."""
    rows = rows or ROWS_PER_SLICE
    p = table_path(d, name)
    if p is None:
        raise FileNotFoundError(2, "no such table (.parquet or .csv)", str(Path(d) / name))
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        # pre-buffering keeps every column chunk read until the file is closed: a million-request run's
        # iteration table grew the resident set by about 130 MB over one pass
        f = pq.ParquetFile(p, pre_buffer=False)
        have, pool = set(f.schema_arrow.names), pa.default_memory_pool()
        for batch in f.iter_batches(batch_size=rows, columns=[c for c in columns if c in have]):
            frame = batch.to_pandas()
            del batch
            # arrow's allocator (mimalloc) keeps the pages of each row group read: give them back once the
            # chunk is a frame
            pool.release_unused()
            yield frame
        return
    yield from pd.read_csv(p, usecols=lambda c: c in set(columns), chunksize=rows)


def read_itl_ms(d: Path) -> tuple[np.ndarray, np.ndarray]:
    """The pooled ITL gaps saved in folder `d` as (distinct gaps in ms, sorted; how many of each); empty
    arrays when none were saved. Reads itl.parquet / itl.csv, or an older itl_gaps_ms.npy."""
    if has_table(d, "itl"):
        df = read_table(d, "itl")
        return df["gap_ms"].to_numpy(float), df["count"].to_numpy(np.int64)
    npy = Path(d) / "itl_gaps_ms.npy"
    if npy.exists():
        return np.unique(np.load(npy).astype(float), return_counts=True)
    return np.zeros(0), np.zeros(0, dtype=np.int64)

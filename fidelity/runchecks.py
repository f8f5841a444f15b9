"""What a real run's per-request records may say, checked as they are read (fidelity/realruns.py): values of
the right type and unit, in the range a served request can have, timestamps in causal order. An impossible
value is a one-line RealRunError naming the file, the field and the row; a request that failed in the real
run (no token times) is borderline, counted and stated by the commands that report on runs."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

# No served model has a context beyond 10M tokens (Llama 4 Scout's advertised maximum, the largest of any
# released model): a longer prompt or output is a unit or column mix-up, not a request.
MAX_TOKENS = 10_000_000
# One run's requests span minutes or hours: a span beyond 30 days is milliseconds (or nanoseconds) read
# as seconds, e.g. epoch milliseconds in a send-time column.
MAX_SPAN_S = 30 * 86400.0
# Epoch seconds reach 1e11 in the year 5138: a larger send time is epoch milliseconds or nanoseconds.
MAX_TIME_S = 1e11
# Clients and engines round timestamps to the microsecond: a first token 1 us "before" its send is rounding.
CLOCK_SLACK_S = 1e-6


class RealRunError(ValueError):
    """A real-run file that cannot be read; the message names it and fits on one line."""


def request_row(i: int) -> str:
    return f"request {i}"


def csv_line(i: int) -> str:
    return f"line {i + 2}"   # line 1 is the header


def numbers(path, field: str, values, row: Callable[[int], str] = request_row, missing_ok: bool = True,
            unit: str = "a number") -> np.ndarray:
    """`values` (a list, array or column) as floats. A value that is not a real number (a string such as
    an ISO date, a boolean, a list) names its row; a missing one (None, NaN, empty) is NaN when
    `missing_ok`, else an error too."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "fiu":
        return values.astype(float)
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise RealRunError(f"{path}: {field}: expected a list with one value per request, got "
                           f"{type(values).__name__} {str(values)[:40]!r}")
    out = np.empty(len(values), dtype=float)
    for i, v in enumerate(values):
        if v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip()):
            if not missing_ok:
                raise RealRunError(f"{path}: {row(i)}: {field} is missing")
            out[i] = math.nan
            continue
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise RealRunError(f"{path}: {row(i)}: {field}: expected {unit}, got {str(v)[:40]!r}")
        out[i] = float(v)
    return out


def check_requests(path, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, first: np.ndarray,
                   last: np.ndarray, row: Callable[[int], str] = request_row) -> int:
    """Refuse what no served request can be; return how many requests failed in the real run (no first-
    or last-token time). Times in seconds, any origin; token counts as read."""
    def bad(mask: np.ndarray, what: str, values: np.ndarray | None = None):
        i = int(np.flatnonzero(mask)[0])
        shown = "" if values is None else f", got {values[i]:g}"
        raise RealRunError(f"{path}: {row(i)}: {what}{shown} ({int(mask.sum())} such row(s))")

    if not np.isfinite(arrival).all():
        bad(~np.isfinite(arrival), "send/arrival time missing or infinite")
    if (np.abs(arrival) > MAX_TIME_S).any():
        bad(np.abs(arrival) > MAX_TIME_S, "send time: expected seconds; epoch milliseconds or nanoseconds given "
            "as seconds?", arrival)
    span = float(arrival.max() - arrival.min()) if len(arrival) else 0.0
    if span > MAX_SPAN_S:
        raise RealRunError(f"{path}: send times span {span:.3g} s ({span / 86400:.0f} days): expected seconds; "
                           "milliseconds or nanoseconds given as seconds?")
    for name, x, low in (("prompt tokens", prompt, 1), ("output tokens", output, 0)):
        if not np.isfinite(x).all():
            bad(~np.isfinite(x), f"{name} missing or not a number")
        if (x != np.round(x)).any():
            bad(x != np.round(x), f"{name}: expected a whole number", x)
        if (x < low).any():
            bad(x < low, f"{name}: expected at least {low}", x)
        if (x > MAX_TOKENS).any():
            bad(x > MAX_TOKENS, f"{name}: more than {MAX_TOKENS:,} (no model serves that many)", x)
    finished = np.isfinite(first) & np.isfinite(last)
    ttft = first - arrival
    if (finished & (ttft < -CLOCK_SLACK_S)).any():
        bad(finished & (ttft < -CLOCK_SLACK_S), "first token before the request was sent (TTFT s)", ttft)
    if (finished & (last < first - CLOCK_SLACK_S)).any():
        bad(finished & (last < first - CLOCK_SLACK_S), "last token before the first (s)", last - first)
    if (finished & (output < 1)).any():
        bad(finished & (output < 1), "finished with no output tokens", output)
    if (np.isinf(first) | np.isinf(last)).any():
        bad(np.isinf(first) | np.isinf(last), "token time infinite")
    return int((~finished).sum())


def check_gaps(path, field: str, gaps: np.ndarray, row: Callable[[int], str] = request_row) -> None:
    """Inter-token gaps (s) are finite and not negative (tokens arrive in order)."""
    wrong = ~np.isfinite(gaps) | (gaps < -CLOCK_SLACK_S)
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise RealRunError(f"{path}: {row(i)}: {field}: a gap of {gaps[i]:g} s (tokens out of order or not "
                           f"a number)")


def csv_numbers(path, frame, column: str, row: Callable[[int], str] = csv_line) -> np.ndarray:
    """A table column as floats; a cell that is not a number (an ISO date where seconds belong, a word)
    names its row and column. Empty cells are NaN."""
    import pandas as pd
    raw = frame[column]
    if raw.dtype.kind in "fiu":
        return raw.to_numpy(dtype=float)
    num = pd.to_numeric(raw, errors="coerce")
    wrong = num.isna() & raw.notna() & (raw.astype(str).str.strip() != "")
    if wrong.any():
        i = int(np.flatnonzero(wrong.to_numpy())[0])
        unit = "seconds" if column.endswith("_s") else "milliseconds" if column.endswith("_ms") else "a number"
        raise RealRunError(f"{path}: {row(i)}: {column}: expected {unit}, got {str(raw.iloc[i])[:40]!r}")
    return num.to_numpy(dtype=float)


def failed_requests_line(runs) -> str | None:
    """The report's statement of requests that failed in the real runs (borderline, not refused): how many,
    in which runs. None when every request finished."""
    failed = {r.name: int((r.requests["status"] != "finished").sum()) for r in runs}
    total = sum(len(r.requests) for r in runs)
    if not any(failed.values()):
        return None
    where = ", ".join(f"{name}: {n}" for name, n in failed.items() if n)
    return (f"{sum(failed.values())} of {total} real requests failed (no token times; {where}): left out of the "
            "real latency percentiles, replayed as ordinary requests in the simulation.")

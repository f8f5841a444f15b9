"""Pure functions from an engine log to per-request and per-iteration tables and a summary.

Definitions follow the benchmark tools (docs/engines.md, section 9): TTFT = first token -
arrival (queueing and every prefill chunk included); ITL = every gap between consecutive tokens, pooled
over requests (vllm bench serve); TPOT = (e2e - TTFT) / (output tokens - 1) per request; E2E = finish -
arrival. Throughput divides by the whole run (t = 0 to the last completion), as vllm bench serve does.
Request concurrency, running sequences, iteration batch, token budget and queue depth stay distinct:
`mean_running` counts sequences holding KV, `mean_batch_seqs`/`mean_batch_tokens` what one forward ran,
`mean_waiting` the queue.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simcore import pairwise
from simcore.log import ITERATION_COLUMNS, REQUEST_COLUMNS, EngineLog

PERCENTILES = (50, 90, 95, 99)


def requests_frame(log: EngineLog) -> pd.DataFrame:
    df = pd.DataFrame.from_records(log.requests, columns=list(REQUEST_COLUMNS))
    for c in TIME_COLUMNS:   # floats even when every value is absent (None) or SimPy's clock was an int 0
        if df[c].dtype != np.float64:
            df[c] = df[c].astype(np.float64)
    return _with_latencies(df)


TIME_COLUMNS = ("arrival_s", "admitted_s", "first_token_s", "finish_s")


def requests_frame_from_columns(columns: dict) -> pd.DataFrame:
    """The same table from per-request columns (REQUEST_COLUMNS keys), as the fast path logs them. The
    arrays become the frame's columns as they are (not copied: a 10M-request table is 1.4 GB): the caller
    hands them over."""
    return _with_latencies(pd.DataFrame({k: columns[k] for k in REQUEST_COLUMNS}, copy=False))


def _with_latencies(df: pd.DataFrame) -> pd.DataFrame:
    if not df["request_id"].is_monotonic_increasing:   # usually already in id order: no copy of every column
        df = df.sort_values("request_id", kind="stable").reset_index(drop=True)
    elif not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        df = df.reset_index(drop=True)
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    df["queue_s"] = df["admitted_s"] - df["arrival_s"]
    decode_steps = df["output_tokens"] - 1
    df["tpot_s"] = ((df["finish_s"] - df["first_token_s"]) / decode_steps).where(decode_steps > 0)
    return df


def client_view(requests: pd.DataFrame, latency_s, finish_latency_s=None) -> pd.DataFrame:
    """The request table as the client sees it when a fixed `latency_s` per request lies outside the engine
    (a cost model's `request_latency_s`): tokens arrive that much later; TTFT and E2E grow by it, TPOT
    and ITL do not. `arrival_s` stays the time the request reached the engine. `latency_s` is one number
    for every request or an array, one per row (a front end whose time depends on the prompt);
    `finish_latency_s`, where the last token's differs (the API server's queue), the same for the finish."""
    finish_latency_s = latency_s if finish_latency_s is None else finish_latency_s
    if np.ndim(latency_s) == 0 and not latency_s and np.ndim(finish_latency_s) == 0 and not finish_latency_s:
        return requests
    out = requests.copy(deep=False)   # the shifted columns are new arrays; the rest are shared, not copied
    out["first_token_s"] = out["first_token_s"] + latency_s
    out["finish_s"] = out["finish_s"] + finish_latency_s
    return _with_latencies(out)


def engine_core_view(requests: pd.DataFrame, iterations: pd.DataFrame) -> pd.DataFrame:
    """The request table as vLLM's engine core stamps it in its own stats (`RequestStateStats.queued_ts`):
    its busy loop takes new requests from its input queue only between iterations (`EngineCoreProc.
    run_busy_loop`: `_process_input_queue`, then one engine step), so a request that reaches it while a step
    runs is queued, and its clock starts, when that step ends; one that reaches an idle engine at once.
    `arrival_s` becomes that time (on the request's replica, from `iterations`' `start_s`, `duration_s` and
    `replica_id`), and TTFT, E2E and the queue time count from it; TPOT and ITL do not move. Runs whose
    times are vLLM's engine-core stamps (LLMServingSim's) are compared with this view."""
    if not len(requests) or not len(iterations):
        return requests
    arrival = requests["arrival_s"].to_numpy(float)
    taken = arrival.copy()
    req_replica = requests["replica_id"].to_numpy() if "replica_id" in requests else np.zeros(len(arrival), int)
    it_replica = iterations["replica_id"].to_numpy() if "replica_id" in iterations else np.zeros(len(iterations), int)
    for r in np.unique(req_replica):
        steps = iterations[it_replica == r]
        order = np.argsort(steps["start_s"].to_numpy(float), kind="stable")
        start = steps["start_s"].to_numpy(float)[order]
        end = start + steps["duration_s"].to_numpy(float)[order]
        mine = np.nonzero(req_replica == r)[0]
        k = np.searchsorted(start, arrival[mine], side="left") - 1   # the last step begun before the arrival
        inside = (k >= 0) & (arrival[mine] < end[np.maximum(k, 0)])
        taken[mine[inside]] = end[k[inside]]
    out = requests.copy(deep=False)
    out["arrival_s"] = taken
    return _with_latencies(out)


def iterations_frame(log: EngineLog) -> pd.DataFrame:
    df = pd.DataFrame.from_records(log.iterations, columns=list(ITERATION_COLUMNS))
    if not len(df):   # no step at all (a gateway ended every request): typed as a run with steps
        df = df.astype({c: np.float64 if c.endswith("_s") else np.int64 for c in ITERATION_COLUMNS})
    return df


def stats_ms(prefix: str, values_s) -> dict:
    v = np.asarray(values_s, dtype=float)
    v = v[~np.isnan(v)]
    out = {f"{prefix}_mean_ms": float(v.mean() * 1e3) if v.size else float("nan")}
    pcts = np.percentile(v, PERCENTILES) * 1e3 if v.size else [float("nan")] * len(PERCENTILES)
    out.update({f"{prefix}_p{p}_ms": float(x) for p, x in zip(PERCENTILES, pcts)})
    return out


def weighted_percentiles(values: np.ndarray, counts: np.ndarray, percentiles=PERCENTILES) -> list[float]:
    """`np.percentile(np.repeat(values, counts), percentiles)` (linear method) without expanding: `values`
    sorted ascending, `counts` positive integers. Same index arithmetic and interpolation as numpy."""
    ends = np.cumsum(counts)  # sorted position of the last copy of each value, + 1
    n = int(ends[-1])
    out = []
    for p in percentiles:
        virtual = (n - 1) * (p / 100)
        lo = int(np.floor(virtual))
        gamma = virtual - lo
        a = values[np.searchsorted(ends, lo, side="right")]
        b = values[np.searchsorted(ends, min(lo + 1, n - 1), side="right")]
        diff = b - a
        out.append(float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma))
    return out


def itl_samples(itl_gaps_s) -> tuple[np.ndarray, np.ndarray]:
    """Pooled ITL gaps in canonical form: sorted distinct values and how often each occurs. Accepts a flat
    sequence of gaps (the SimPy engine's log) or `(values, counts)` weighted samples (the fast path's,
    where every sequence of a decode batch shares one gap); equal multisets give identical arrays."""
    if isinstance(itl_gaps_s, tuple):
        values, counts = (np.asarray(a) for a in itl_gaps_s)
        if counts.dtype == np.int64 and len(values) and (values[1:] > values[:-1]).all():
            return values, counts   # canonical already (ItlSamples'): no sorted copies of millions
        return _canonical(values, counts, kind="stable")
    return np.unique(np.asarray(itl_gaps_s, dtype=float), return_counts=True)


def _canonical(values: np.ndarray, counts: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values, each with its total count (int64). Any sort `kind` gives the same arrays:
    equal values are merged and integer sums do not depend on the order ("stable" is fastest on a few
    sorted runs, the default quicksort, SIMD-accelerated, on anything else)."""
    order = np.argsort(values, kind=kind)
    values, counts = values[order], counts[order]
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    starts = np.flatnonzero(keep)
    return values[starts], np.add.reduceat(counts.astype(np.int64), starts) if len(starts) else counts


class ItlSamples:
    """Pooled ITL gaps gathered chunk by chunk (a streamed fast-path run hands them over as it goes): each
    chunk's gaps are merged (sorted, equal gaps' counts summed) and kept in 12 bytes a distinct gap (count
    int32: a chunk's counts sum to less than 2**31), against 24 bytes a logged sample with its end time;
    `finish` merges the chunks into `itl_samples`' canonical form."""

    def __init__(self):
        self._values: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []

    def add(self, values: np.ndarray, counts: np.ndarray) -> None:
        if len(values):
            v, c = _canonical(np.asarray(values, dtype=float), np.asarray(counts), kind="quicksort")
            self._values.append(v)
            self._counts.append(c.astype(np.int32))

    def finish(self, num_slices: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """(values, counts int64) over every chunk, canonical (call once, after the last chunk). Merged a
        range of values at a time (`num_slices` ranges cut at quantiles of the largest chunk), so the merge
        adds about 1/num_slices of the samples' size, not twice it."""
        values, counts = self._values, self._counts
        self._values, self._counts = [], []
        if not values:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        largest = max(values, key=len)
        cuts = np.r_[-np.inf, np.unique(largest[(np.arange(1, num_slices) * len(largest)) // num_slices]), np.inf]
        # the ranges' results written into one array sized for every chunk's gaps (at most that many are
        # distinct), not gathered in a list and concatenated: a day's tens of millions of gaps once, not twice
        total = sum(len(v) for v in values)
        out_v, out_c, n = np.empty(total), np.empty(total, dtype=np.int64), 0
        for lo, hi in zip(cuts[:-1], cuts[1:]):   # [lo, hi): equal gaps of every chunk fall in one range
            parts = [(np.searchsorted(v, lo), np.searchsorted(v, hi)) for v in values]
            v, c = _canonical(np.concatenate([v[i:j] for v, (i, j) in zip(values, parts)]),
                              np.concatenate([c[i:j] for c, (i, j) in zip(counts, parts)]), kind="quicksort")
            out_v[n:n + len(v)], out_c[n:n + len(v)] = v, c
            n += len(v)
        if n < total // 2:   # many equal gaps across chunks: keep only what is used
            return out_v[:n].copy(), out_c[:n].copy()
        return out_v[:n], out_c[:n]


def _weighted_stats_ms(prefix: str, values: np.ndarray, counts: np.ndarray) -> dict:
    if not len(values):
        return stats_ms(prefix, [])
    # numpy's own sum, not np.dot: OpenBLAS would split this one dot product over every core, whose threads
    # then spin idle for a while (CPU spent on nothing), and its last bits would depend on how many cores
    # the machine has
    mean_s = float((values * counts).sum() / counts.sum())
    out = {f"{prefix}_mean_ms": mean_s * 1e3}
    out.update({f"{prefix}_p{p}_ms": x * 1e3
                for p, x in zip(PERCENTILES, weighted_percentiles(values, counts))})
    return out


class IterationTotals:
    """What `summarize` needs from the iteration rows, gathered chunk by chunk (a streamed run never holds
    the table): exact integer sums and maxima, and the time-weighted sums (duration, and queue, running
    and KV blocks times duration), which must equal numpy's pairwise float sums over whole columns bit for
    bit. For those the columns are kept (duration float64; the counts each in the smallest type that holds
    the chunk: about 14 bytes an iteration) or, with `spill` (experiments/fast.py: a temporary file), handed
    to it as they come and summed by simcore.pairwise on the way back (nothing kept per iteration)."""

    def __init__(self, spill=None):
        self.num_iterations, self.end_s = 0, 0.0
        self.num_tokens = self.num_padding_tokens = self.num_seqs = self.max_waiting = self.max_kv_blocks = 0
        self.spill = spill   # .write(duration, waiting, running, kv_blocks) and .chunks() of those, in order
        self._parts: list[tuple] = []

    def add(self, it: pd.DataFrame) -> None:
        if not len(it):
            return
        dur = it["duration_s"].to_numpy(float)
        self.num_iterations += len(it)
        self.end_s = max(self.end_s, float((it["start_s"].to_numpy(float) + dur).max()))
        self.num_tokens += int(it["prefill_tokens"].sum() + it["decode_tokens"].sum())
        self.num_padding_tokens += int(it["padding_tokens"].sum())
        self.num_seqs += int(it["num_seqs"].sum())
        self.max_waiting = max(self.max_waiting, int(it["num_waiting"].max()))
        self.max_kv_blocks = max(self.max_kv_blocks, int(it["kv_blocks_used"].max()))
        counts = [_narrow(it[c].to_numpy()) for c in ("num_waiting", "num_running", "kv_blocks_used")]
        if self.spill is not None:
            self.spill.write(dur, *counts)
        else:
            self._parts.append((dur.copy(), *counts))

    def finish(self) -> IterationTotals:
        """The time-weighted sums (call once, after the last chunk): `busy_s` (sum of durations),
        `waiting_s`, `running_s`, `kv_block_s` (each count times duration, summed)."""
        if self.spill is not None:
            blocks = (np.column_stack((d, w * d, r * d, k * d)) for d, w, r, k in self.spill.chunks())
            self.busy_s, self.waiting_s, self.running_s, self.kv_block_s = pairwise.column_sums(
                blocks, self.num_iterations, 4)
            return self
        cols = list(zip(*self._parts)) or [[np.zeros(0)], *[[np.zeros(0, np.int32)]] * 3]
        dur, waiting, running, kv = (np.concatenate(c) for c in cols)
        self._parts = []
        self.busy_s, self.waiting_s, self.running_s, self.kv_block_s = (
            float(dur.sum()), float((waiting * dur).sum()), float((running * dur).sum()), float((kv * dur).sum()))
        return self


def _narrow(counts: np.ndarray) -> np.ndarray:
    """Non-negative counts in the smallest unsigned type that holds them (np.concatenate widens parts)."""
    if not len(counts) or counts.min() < 0:
        return counts.astype(np.int64)
    return counts.astype(np.min_scalar_type(int(counts.max())))


def iteration_totals(iterations: pd.DataFrame) -> IterationTotals:
    totals = IterationTotals()
    totals.add(iterations)
    return totals.finish()


def summarize(requests: pd.DataFrame, iterations, itl_gaps_s, num_gpu_blocks: int) -> dict:
    """The results row. `iterations`: the iterations frame, or its IterationTotals (a streamed run)."""
    it = iterations if isinstance(iterations, IterationTotals) else iteration_totals(iterations)
    # only the columns used below (a 10M-row table is not copied whole for the finished rows)
    fin = requests.loc[requests["status"] == "finished", ["finish_s", "output_tokens", "prompt_tokens", "ttft_s",
                                                          "tpot_s", "e2e_s", "queue_s"]]
    end_s = float(max(fin["finish_s"].max() if len(fin) else 0.0, it.end_s))
    duration_s = end_s if end_s > 0 else float("nan")
    out_tokens = int(fin["output_tokens"].sum())
    in_tokens = int(fin["prompt_tokens"].sum())
    s = {
        "num_requests": len(requests),
        "num_finished": len(fin),
        "num_rejected": int((requests["status"] == "rejected").sum()),
        "duration_s": duration_s,
        "throughput_rps": len(fin) / duration_s,
        "output_tok_per_s": out_tokens / duration_s,
        "total_tok_per_s": (in_tokens + out_tokens) / duration_s,
    }
    s.update(stats_ms("ttft", fin["ttft_s"]))
    s.update(_weighted_stats_ms("itl", *itl_samples(itl_gaps_s)))
    s.update(stats_ms("tpot", fin["tpot_s"]))
    s.update(stats_ms("e2e", fin["e2e_s"]))
    s.update(stats_ms("queue", fin["queue_s"]))
    s["num_preemptions"] = int(requests["num_preemptions"].sum())
    s.update(_iteration_keys(it, duration_s, num_gpu_blocks))
    s.update(per_priority_stats(requests))
    return s


def _iteration_keys(it: IterationTotals, duration_s: float, num_gpu_blocks: int) -> dict:
    """Integer sums are exact, so means from them equal pandas' float means of the columns (< 2**53)."""
    n = it.num_iterations
    batch_tokens = it.num_tokens + it.num_padding_tokens
    return {
        "num_iterations": n,
        # time-weighted over the whole run (idle stretches count as zero)
        "mean_waiting": float(it.waiting_s / duration_s) if n else 0.0,
        "max_waiting": it.max_waiting,
        "mean_running": float(it.running_s / duration_s) if n else 0.0,
        "mean_batch_tokens": float(batch_tokens) / n if n else 0.0,
        "mean_batch_seqs": float(it.num_seqs) / n if n else 0.0,
        "kv_usage_mean": float(it.kv_block_s / duration_s / num_gpu_blocks) if n else 0.0,
        "kv_usage_max": float(np.int64(it.max_kv_blocks) / num_gpu_blocks) if n else 0.0,
        "padding_waste": float(it.num_padding_tokens / max(1, batch_tokens)),
        "busy_fraction": float(it.busy_s / duration_s) if n else 0.0,
    }


def replicas_frame(requests: pd.DataFrame, iterations: pd.DataFrame, num_gpu_blocks: int,
                   num_replicas: int) -> pd.DataFrame:
    """One row per replica of a cluster: its share of the traffic and its own latency and load, over the
    cluster's whole run (so a replica's busy fraction and throughput compare directly). `iterations`: the
    iterations frame, or a streamed run's IterationTotals with `by_replica` (each replica's own)."""
    fin_all = requests[requests["status"] == "finished"]
    streamed = isinstance(iterations, IterationTotals)
    steps_end_s = iterations.end_s if streamed else (
        (iterations["start_s"] + iterations["duration_s"]).max() if len(iterations) else 0.0)
    end_s = float(max(fin_all["finish_s"].max() if len(fin_all) else 0.0, steps_end_s))
    duration_s = end_s if end_s > 0 else float("nan")
    rows = []
    for rid in range(num_replicas):
        req = requests[requests["replica_id"] == rid]
        fin = req[req["status"] == "finished"]
        it = iterations.by_replica.get(rid) if streamed else iteration_totals(
            iterations[iterations["replica_id"] == rid])
        has_steps = it is not None and it.num_iterations > 0
        row = {"replica_id": rid, "num_requests": len(req), "num_finished": len(fin),
               "throughput_rps": len(fin) / duration_s,
               "output_tok_per_s": float(fin["output_tokens"].sum()) / duration_s,
               "busy_fraction": float(it.busy_s / duration_s) if has_steps else 0.0 / duration_s,
               "mean_waiting": float(it.waiting_s / duration_s) if has_steps else 0.0,
               "kv_usage_mean": float(it.kv_block_s / duration_s / num_gpu_blocks) if has_steps else 0.0,
               "kv_usage_max": float(it.max_kv_blocks / num_gpu_blocks) if has_steps else 0.0,
               "num_preemptions": int(req["num_preemptions"].sum())}
        row.update(stats_ms("ttft", fin["ttft_s"]))
        row.update(stats_ms("tpot", fin["tpot_s"]))
        rows.append(row)
    return pd.DataFrame(rows)


def cluster_summary(summary: dict, replicas: pd.DataFrame) -> dict:
    """Cluster-wide keys for the results row. `summary` was computed over all replicas' pooled tables with
    num_gpu_blocks x replicas, so its sums are cluster totals and `kv_usage_mean` the cluster's mean; the
    busy fraction becomes the replicas' mean and `kv_usage_max` the fullest replica's peak."""
    return {"num_replicas": len(replicas),
            "busy_fraction": float(replicas["busy_fraction"].mean()),
            "kv_usage_max": float(replicas["kv_usage_max"].max()),
            "replica_requests_min": int(replicas["num_requests"].min()),
            "replica_requests_max": int(replicas["num_requests"].max()),
            "replica_busy_max": float(replicas["busy_fraction"].max()),
            "replica_ttft_p99_max_ms": float(replicas["ttft_p99_ms"].max())}


def per_priority_stats(requests: pd.DataFrame) -> dict:
    """With more than one priority class: counts and TTFT / TPOT / E2E / queue statistics per class,
    as columns suffixed `_prio{class}` (e.g. `ttft_p99_ms_prio0`). Empty with a single class."""
    if "priority" not in requests or requests["priority"].nunique() < 2:
        return {}
    out = {}
    for prio, group in requests.groupby("priority", sort=True):
        fin = group[group["status"] == "finished"]
        stats = {"num_requests": len(group), "num_finished": len(fin),
                 "num_preemptions": int(group["num_preemptions"].sum())}
        for metric in ("ttft", "tpot", "e2e", "queue"):
            stats.update(stats_ms(metric, fin[f"{metric}_s"]))
        out.update({f"{k}_prio{int(prio)}": v for k, v in stats.items()})
    return out


def meets_slo(requests: pd.DataFrame, ttft_ms: float | None = None, tpot_ms: float | None = None,
              e2e_ms: float | None = None) -> pd.Series:
    """Per request: finished and within every SLO given (vllm bench serve `--goodput`: TPOT counts as 0
    for a one-token output). Rejected requests never meet it."""
    ok = requests["status"] == "finished"
    if ttft_ms is not None:
        ok &= requests["ttft_s"] * 1e3 <= ttft_ms
    if tpot_ms is not None:
        ok &= requests["tpot_s"].fillna(0.0) * 1e3 <= tpot_ms
    if e2e_ms is not None:
        ok &= requests["e2e_s"] * 1e3 <= e2e_ms
    return ok


def goodput_stats(good: pd.Series, duration_s: float, num_gpus: int) -> dict:
    """Goodput = requests meeting every SLO per second of the whole run (DistServe, vLLM, AIPerf); per GPU
    divides by every GPU the deployment uses. `slo_attainment`: the fraction of all requests that are good
    (DistServe's measure; it targets 90%)."""
    n = int(good.sum())
    return {"slo_attainment": n / len(good) if len(good) else float("nan"),
            "goodput_rps": n / duration_s, "goodput_rps_per_gpu": n / duration_s / num_gpus}


# ---- whether a run's numbers can be taken at face value ----

UNSTABLE_GROWTH_FRAC = 0.05  # backlog growth over the second half of the sends (share of all requests)
UNSTABLE_GROWTH_MIN = 5      # ... and at least this many requests, so a short run's noise is not a trend


def _unfinished_at(requests: pd.DataFrame, t: float) -> int:
    """Requests arrived by `t` and neither finished nor rejected by `t`: the backlog at `t` (queued, or
    admitted and still computing)."""
    arrived = requests["arrival_s"].to_numpy(float) <= t
    done = requests["finish_s"].to_numpy(float) <= t  # NaN compares False
    return int((arrived & ~done).sum())


def _queued_at(requests: pd.DataFrame, t: float) -> int:
    """Requests arrived by `t`, not yet admitted and not ended by `t`: the queue at `t`."""
    arrived = requests["arrival_s"].to_numpy(float) <= t
    admitted = requests["admitted_s"].to_numpy(float) <= t   # NaN compares False
    done = requests["finish_s"].to_numpy(float) <= t
    return int((arrived & ~admitted & ~done).sum())


def load_stats(requests: pd.DataFrame, duration_s: float, closed_loop: bool) -> dict:
    """Offered against achieved load, and whether the backlog kept growing (the run is past saturation).

    `offered_rate_per_s`: requests sent per second over the send window, first to last arrival (inf when
    all arrive at once; NaN for closed-loop users, whose sends follow the finishes). `achieved_rate_per_s`:
    finished requests per second of the whole run (= throughput_rps). `waiting_at_end`: requests that had
    arrived but not finished when the last one arrived (queued, or admitted and still running);
    `waiting_at_end_frac` that as a share of all requests. Open loop is `unstable` when this backlog grew
    over the second half of the send window by at least 5% of all requests (and at least 5 requests), to
    more than 1.5x its size at the midpoint: arrivals outpace the engine and latencies grow with the run's
    length instead of settling; or when the queue alone (arrived, not yet admitted) grew so: an engine that
    admits hundreds into running holds a large backlog at the midpoint already, which hides the queue's growth
    from the first test. With every request at t = 0, a backlog of 5% of them suffices. A closed loop cannot
    hold more than its users and is never flagged."""
    n = len(requests)
    arrivals = requests["arrival_s"].to_numpy(float)
    finished = int((requests["status"] == "finished").sum())
    out = {"offered_rate_per_s": math.nan, "achieved_rate_per_s": finished / duration_s if duration_s > 0 else math.nan,
           "waiting_at_end": 0, "waiting_at_end_frac": 0.0, "unstable": False}
    if not n:
        return out
    t0, t1 = float(arrivals.min()), float(arrivals.max())
    end = _unfinished_at(requests, t1)
    out.update(waiting_at_end=end, waiting_at_end_frac=end / n)
    if closed_loop:
        return out
    span = t1 - t0
    out["offered_rate_per_s"] = (n - 1) / span if span > 0 else (math.inf if n > 1 else math.nan)
    mid = _unfinished_at(requests, t0 + span / 2) if span > 0 else 0
    least = max(UNSTABLE_GROWTH_MIN, UNSTABLE_GROWTH_FRAC * n)
    grew = end - mid >= least and end > 1.5 * mid
    if not grew and span > 0:
        q_mid, q_end = _queued_at(requests, t0 + span / 2), _queued_at(requests, t1)
        grew = q_end - q_mid >= least and q_end > 1.5 * q_mid
    out["unstable"] = bool(grew)
    return out


# Above this share of its time, the API server's queue (simcore/api_server.py) holds a request for more than
# its busy periods' length on average (an M/D/1 queue waits rho / (2 (1 - rho)) service times: 2x at 0.8),
# tens of milliseconds behind a step's batch of streamed chunks; its waits are in TTFT, but the engine is
# not held back by it (its back-pressure is not simulated), so there the engine's load is more than it got.
API_SERVER_BUSY_LIMIT = 0.8


def rejected_reasons(requests: pd.DataFrame) -> str:
    """'reason=count' for each reject reason, most frequent first ('' when none was rejected)."""
    r = requests.loc[requests["status"] == "rejected", "reject_reason"]
    return " ".join(f"{k}={v}" for k, v in r.value_counts().items())


def untrusted_notes(row) -> list[str]:
    """What makes a results row misleading if read alone, in words (empty when nothing does). `row` is a
    results row (a mapping with the summary keys); missing keys count as nothing to report."""
    get = lambda k, d=0: d if k not in row or row[k] is None or (isinstance(row[k], float) and math.isnan(row[k])) \
        else row[k]  # noqa: E731
    notes = []
    n, rej, fin = int(get("num_requests")), int(get("num_rejected")), int(get("num_finished"))
    reasons = get("rejected_reasons", "") or "no reason recorded"
    if n and rej == n:
        notes.append(f"all {n} requests were rejected ({reasons}): nothing was served, every latency is empty")
    elif rej:
        notes.append(f"{rej} of {n} requests {'were' if rej > 1 else 'was'} rejected ({reasons}): latencies and "
                     f"throughput describe only "
                     f"the {fin} that finished (survivor bias)")
    if get("unstable", False):
        offered, achieved = float(get("offered_rate_per_s", math.nan)), float(get("achieved_rate_per_s", math.nan))
        frac = f"{float(get('waiting_at_end_frac')):.0%}"
        if math.isinf(offered):
            notes.append(f"every request was sent at t = 0 (rate .inf, a saturation test, {achieved:,.2f} req/s "
                         f"achieved); {frac} of them were unfinished at that moment, so latencies measure the time "
                         "spent in that queue")
        else:
            notes.append(f"UNSTABLE: {offered:,.2f} req/s offered, {achieved:,.2f} achieved; {frac} of the requests "
                         "were still unfinished when the last one arrived and that backlog was growing, so latencies "
                         "grow with the run's length instead of settling")
    if int(get("num_clipped_prompts")):
        k = int(get("num_clipped_prompts"))
        notes.append(f"{k} prompt{'s were' if k > 1 else ' was'} cut to max_model_len - 1 (long_prompts: clip)")
    if _many_outputs_clipped(row, get):
        k = int(get("num_clipped_outputs"))
        notes.append(f"{k} of {n} outputs were cut where prompt + output reached max_model_len")
    busy = float(get("api_server_busy", 0.0))
    if busy >= API_SERVER_BUSY_LIMIT:
        notes.append(f"the API server would be busy {busy:.0%} of the time (the front end's measured CPU per "
                     "request and per streamed chunk, one process per replica): its queue's waits are in TTFT, but "
                     "the engine still got every request on time, as if the server kept up"
                     f"{', and one process cannot stream what the GPU produced: the throughput is more than it serves' if busy >= 1 else ''}"
                     "; more API servers (engine.frontend.api_server_count, vLLM's --api-server-count) or a faster "
                     "host core lower it")
    return notes


CLIPPED_OUTPUTS_FRAC = 0.01  # outputs cut at the context limit change the length distribution beyond this share


def _many_outputs_clipped(row, get) -> bool:
    """Outputs cut at max_model_len (generation stops at the context limit, as a server does) are always
    counted in `num_clipped_outputs`; they are a warning only above 1% of the requests."""
    n = int(get("num_requests"))
    return bool(n and int(get("num_clipped_outputs")) > CLIPPED_OUTPUTS_FRAC * n)


def flag_words(row) -> str:
    """The `flags` column: short words for what `untrusted_notes` explains ('' when the run is clean)."""
    get = lambda k, d=0: row.get(k) or d  # noqa: E731
    words = [w for w, on in (("all_rejected", get("num_requests") and get("num_rejected") == get("num_requests")),
                             ("rejected", 0 < get("num_rejected") < get("num_requests")),
                             ("unstable", get("unstable")),
                             ("clipped", get("num_clipped_prompts") or _many_outputs_clipped(row, get)),
                             ("frontend", (get("api_server_busy") or 0) >= API_SERVER_BUSY_LIMIT)) if on]
    return " ".join(words)

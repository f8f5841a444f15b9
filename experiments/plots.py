"""Capacity-planning figures as PNG files (matplotlib, Agg backend), each titled and labelled with units.

Every function takes plain tables (pandas frames or arrays already loaded) and a path, writes one figure
and returns the path; choosing which runs to show and reading files is `experiments.report`'s job.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import LogFormatter, MaxNLocator  # noqa: E402

from experiments.search import pretty_metric  # noqa: E402

COLORS = {"static": "#d62728", "continuous": "#1f77b4", "chunked_prefill": "#2ca02c"}


# matplotlib's cycle less the three policy colours (C0, C2 and C3 are continuous, chunked prefill and static)
SPARE_COLORS = ("C1", "C4", "C5", "C6", "C7", "C8", "C9")


def _palette(labels) -> dict:
    """A colour per curve: a policy's own colour (the same in every figure) for the first curve of that
    policy, the next spare colour for every other curve, so two curves of one policy (two GPUs, two token
    budgets) never share a colour."""
    out, used, spare = {}, set(), 0
    for label in labels:
        own = next((c for name, c in COLORS.items() if str(label).startswith(name)), None)
        if own is None or own in used:
            own, spare = SPARE_COLORS[spare % len(SPARE_COLORS)], spare + 1
        used.add(own)
        out[label] = own
    return out


class PlainLogFormatter(LogFormatter):
    """Log-axis tick labels as plain numbers (0.5, 1, 10, 1,000) instead of matplotlib's default powers of
    ten: read directly as milliseconds or users, and drawn without the mathtext parser (which the default's
    `$10^{2}$` labels start up, about 0.05 s of every run's report). Which ticks carry a label is
    LogFormatter's rule, as for the default."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:,.0f}" if x >= 1 and x == round(x) else f"{x:g}"


def _log_scale(ax, which: str) -> None:
    """`ax.set_xscale("log")` (which="x") or set_yscale, labelled by PlainLogFormatter."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(PlainLogFormatter())
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def _title(title: str) -> str:
    """Headline, then the setup and what the figure rests on, each wrapped to the figure's width."""
    head, _, rest = title.partition("\n")
    return head + "".join("\n" + "\n".join(textwrap.wrap(part, 100)) for part in rest.split("\n") if part)


def _save(fig, path: Path, title: str, rect=(0, 0, 1, 1)) -> Path:
    fig.suptitle(_title(title), fontsize=10)
    return _write(fig, path, rect)


LONG_LABEL = 60   # characters: a longer legend entry would cover its axes, so the legend goes below them


def _legends(fig, axes, fontsize: int = 8, **where):
    """Each axes' legend (`where`: its loc); or, when an entry is longer than LONG_LABEL (a sweep over
    whole workloads or autoscalers), one legend for the figure below its axes, entries wrapped to the
    figure's width and the figure taller by their lines. Returns the rect _save lays the axes out in."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if not entries or max(map(len, entries)) <= LONG_LABEL:
        for ax in axes:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=fontsize, **where)
        return (0, 0, 1, 1)
    width, height = fig.get_size_inches()
    labels = ["\n".join(textwrap.wrap(label, int(width * 14))) for label in entries]
    extra = 0.15 * sum(label.count("\n") + 1 for label in labels) + 0.15
    fig.set_size_inches(width, height + extra)
    fig.legend(list(entries.values()), labels, loc="lower center", fontsize=fontsize - 1, frameon=False)
    return (0, extra / (height + extra), 1, 1)


def _write(fig, path: Path, rect=(0, 0, 1, 1)) -> Path:
    """Lay `fig` out once and save it. tight_layout leaves a placeholder layout engine behind, which makes
    savefig lay the figure out again in a draw of its own; dropping it gives the same PNG, bytewise, in
    about 15% less time (matplotlib 3.11)."""
    fig.tight_layout(rect=rect)
    fig.set_layout_engine(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _load_label(load_col: str) -> str:
    return "closed-loop concurrency (users)" if load_col.endswith("concurrency") else "arrival rate (requests/s)"


def _load_axis(ax, curves: dict[str, pd.DataFrame], load_col: str) -> None:
    """Log x when the loads span a wide range (bracketing doubles), so low and high loads both show."""
    loads = pd.concat([df[load_col] for df in curves.values()]) if curves else pd.Series(dtype=float)
    if len(loads) and loads.min() > 0 and loads.max() / loads.min() >= 50:
        _log_scale(ax, "x")
    ax.set_xlabel(_load_label(load_col) + (", log scale" if ax.get_xscale() == "log" else ""))


def _by_load(df: pd.DataFrame, load_col: str, col: str) -> pd.DataFrame:
    g = df.groupby(load_col)[col]
    return pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max()}).sort_index()


LINE_STATS = {"max": "worst seed", "median": "median over seeds", "mean": "mean over seeds"}


def latency_vs_load(curves: dict[str, pd.DataFrame], load_col: str, metric: str, path: Path, subtitle: str,
                    slo_ms: float | None = None, answers: dict[str, float | None] | None = None,
                    line: str = "mean") -> Path:
    """One line per policy/configuration, the SLO and each found maximum. `line` says what the line is
    (LINE_STATS: the search draws the seed its rule judges, e.g. the worst one when every seed must pass);
    with several seeds each seed's value is a small dot, so nothing the rule saw is hidden."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    what = LINE_STATS[line]
    many = any(df.groupby(load_col)[metric].size().max() > 1 for df in curves.values() if len(df))
    colors = _palette(curves)
    for label, df in curves.items():
        s = df.groupby(load_col)[metric].agg(line).sort_index()
        c = colors[label]
        ax.plot(s.index, s.values, "o-", ms=3.5, color=c, label=f"{label} ({what})" if many else label)
        if many:
            ax.plot(df[load_col], df[metric], ".", ms=3, color=c, alpha=0.35)
        best = (answers or {}).get(label)
        if best is not None and not math.isnan(best) and best in s.index:
            ax.axvline(best, color=c, ls=":", lw=1)
            ax.plot([best], [s.loc[best]], "*", ms=14, color=c, mec="k",
                    label=f"{label} max: {best:,.4g}")
    if many:
        ax.plot([], [], ".", color="grey", alpha=0.5, label="each seed")
    if slo_ms is not None:
        ax.axhline(slo_ms, color="k", ls="--", lw=1.2, label=f"SLO {pretty_metric(metric)} = {slo_ms:g} ms")
    _log_scale(ax, "y")
    _load_axis(ax, curves, load_col)
    ax.set_ylabel(f"{pretty_metric(metric)} (ms, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    rect = _legends(fig, [ax], 8)
    return _save(fig, path, f"{pretty_metric(metric)} against load\n{subtitle}", rect)


def throughput_vs_load(curves: dict[str, pd.DataFrame], load_col: str, path: Path, subtitle: str,
                       answers: dict[str, float | None] | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    many = any(df.groupby(load_col)["output_tok_per_s"].size().max() > 1 for df in curves.values() if len(df))
    colors = _palette(curves)
    for label, df in curves.items():
        s = _by_load(df, load_col, "output_tok_per_s")
        c = colors[label]
        ax.plot(s.index, s["mean"], "o-", ms=3.5, color=c, label=f"{label} (mean over seeds)" if many else label)
        best = (answers or {}).get(label)
        if best is not None and not math.isnan(best) and best in s.index:
            ax.plot([best], [s.loc[best, "mean"]], "*", ms=14, color=c, mec="k", label=f"{label} at its SLO max")
    _load_axis(ax, curves, load_col)
    ax.set_ylabel("output throughput (tokens/s)")
    ax.grid(True, alpha=0.3)
    rect = _legends(fig, [ax], 8)
    return _save(fig, path, f"Output throughput against load\n{subtitle}", rect)


def throughput_latency(curves: dict[str, pd.DataFrame], load_col: str, slos: list[tuple[str, float | None]],
                       path: Path, subtitle: str) -> Path:
    """The trade-off, one panel per latency metric: each point is one load; right is more work, lower faster."""
    fig, axes = plt.subplots(1, len(slos), figsize=(7.5 * min(len(slos), 2) ** 0.75, 4.6), squeeze=False)
    colors = _palette(curves)
    for ax, (metric, slo_ms) in zip(axes[0], slos):
        for label, df in curves.items():
            x = _by_load(df, load_col, "output_tok_per_s")["mean"]
            y = _by_load(df, load_col, metric)["mean"]
            ax.plot(x.values, y.values, "o-", ms=3.5, color=colors[label], label=label)
        if slo_ms is not None:
            ax.axhline(slo_ms, color="k", ls="--", lw=1.2, label=f"SLO {slo_ms:g} ms")
        _log_scale(ax, "y")
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{pretty_metric(metric)} (ms, log scale)")
        ax.grid(True, which="both", alpha=0.3)
    rect = _legends(fig, list(axes[0]), 7)
    return _save(fig, path, f"Throughput-latency trade-off (one point per load)\n{subtitle}", rect)


CDF_POINTS = 1000        # quantiles drawn per CDF (plus a tail): a 1M-request run draws as fast as a small one
TIMESERIES_BINS = 2000   # time bins of a long engine-state plot: more than the figure has pixel columns


def cdf_points(values, counts=None, num_points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of samples (weighted by `counts` when given) as (x, fraction at or below x).
    Every distinct value when there are at most `num_points`; else the values at `num_points` evenly spaced
    fractions plus 200 log-spaced ones towards 1 - 1e-6, so the tail (p99, p99.9) stays as sharp as the
    full curve's, whose vertices between them lie closer than a pixel."""
    v = np.asarray(values, dtype=float)
    c = np.ones(len(v), dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    keep = ~np.isnan(v)
    v, c = v[keep], c[keep]
    if not v.size:
        return v, v
    order = np.argsort(v, kind="stable")
    v, c = v[order], c[order]
    cum = np.cumsum(c)
    y = cum / cum[-1]
    if v.size <= num_points:
        return v, y
    probs = np.concatenate([np.linspace(0, 1, num_points), 1 - np.logspace(-2, -6, 200)])
    idx = np.unique(np.minimum(np.searchsorted(y, probs, side="left"), v.size - 1))
    return v[idx], y[idx]


def latency_cdfs(runs: dict[str, tuple[np.ndarray, object]], path: Path, subtitle: str) -> Path:
    """`runs`: label -> (TTFT samples in ms, pooled ITL gaps in ms: the gaps, or (distinct gaps, counts)).
    Each curve is drawn from at most about 1,200 quantiles (`cdf_points`)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    colors = _palette(runs)
    for label, (ttft_ms, itl_ms) in runs.items():
        for ax, v in zip(axes, (ttft_ms, itl_ms)):
            x, y = cdf_points(*v) if isinstance(v, tuple) else cdf_points(v)
            if x.size:
                ax.plot(x, y, color=colors[label], label=label)
    for ax, what in zip(axes, ("TTFT (ms, log scale)", "inter-token latency (ms, log scale)")):
        _log_scale(ax, "x")
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of samples at or below")
        ax.axhline(0.99, color="grey", ls=":", lw=1)
        ax.grid(True, which="both", alpha=0.3)
    # (a run that served nothing has no curve; a CDF leaves the lower right empty, and "best" costs seconds
    # on big data)
    rect = _legends(fig, list(axes), 7, loc="lower right")
    axes[0].set_title("time to first token (per request)", fontsize=9)
    axes[1].set_title("gaps between tokens (pooled over requests)", fontsize=9)
    return _save(fig, path, f"Latency distributions (CDF)\n{subtitle}", rect)


def slot_intervals(requests: pd.DataFrame, holds_until_drained: bool) -> pd.DataFrame:
    """Per request: when it held a batch slot, split into prefill wait, decoding and (static) finished-but-held.

    Static batching admits a batch together (same admitted_s) and frees every slot when its longest
    member finishes; continuous batching frees a slot at the request's own finish."""
    r = requests[requests["status"] == "finished"].copy()
    r["release_s"] = r.groupby("admitted_s")["finish_s"].transform("max") if holds_until_drained else r["finish_s"]
    r = r.sort_values(["admitted_s", "request_id"]).reset_index(drop=True)
    free_at: list[float] = []
    slots = []
    for a, rel in zip(r["admitted_s"], r["release_s"]):  # lowest free slot (interval colouring)
        j = next((k for k, t in enumerate(free_at) if t <= a + 1e-12), None)
        if j is None:
            j = len(free_at)
            free_at.append(rel)
        else:
            free_at[j] = rel
        slots.append(j)
    r["slot"] = slots
    return r


def slot_gantt(panels: dict[str, tuple[pd.DataFrame, bool]], window_s: float, path: Path, subtitle: str) -> Path:
    """`panels`: label -> (requests table, holds slots until the batch drains). First `window_s` seconds."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 + 2.2 * len(panels)), sharex=True, squeeze=False)
    parts = (("admitted_s", "first_token_s", "#ff7f0e", "prefill (until first token)"),
             ("first_token_s", "finish_s", "#1f77b4", "decoding"),
             ("finish_s", "release_s", "#d62728", "finished, slot held as padding until batch drains"))
    for ax, (label, (req, drains)) in zip(axes[:, 0], panels.items()):
        # only what the window shows: slots are assigned in admission order, so earlier ones are unchanged
        r = slot_intervals(req[req["admitted_s"] < window_s], drains)
        num_slots = int(r["slot"].max()) + 1 if len(r) else 1
        ax.set_facecolor("#eeeeee")  # grey = idle slot
        for start, end, color, _ in parts:
            w = (r[end].clip(upper=window_s) - r[start]).clip(lower=0)
            ax.barh(r["slot"], w, left=r[start], height=0.85, color=color, lw=0)
        ax.set_ylim(-0.5, num_slots - 0.5)
        ax.invert_yaxis()
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("batch slot")
        busy = r["release_s"].clip(upper=window_s) - r["admitted_s"]
        padded = (r["release_s"].clip(upper=window_s) - r["finish_s"].clip(upper=window_s)).clip(lower=0)
        ax.set_title(f"{label}: {len(r)} requests admitted; slot time held as padding "
                     f"{padded.sum() / max(busy.sum(), 1e-12):.0%}", fontsize=9)
    axes[-1, 0].set_xlim(0, window_s)
    axes[-1, 0].set_xlabel("time since start (s)")
    handles = [Patch(color=c, label=t) for *_, c, t in parts] + [Patch(color="#eeeeee", label="idle slot")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.subplots_adjust(bottom=0.16)
    fig.suptitle(_title(f"Slot occupancy, first {window_s:.3g} s\n{subtitle}"), fontsize=10)
    return _write(fig, path, rect=(0, 0.06, 1, 1))


def time_bins(t, num_bins: int = TIMESERIES_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows by equal time bin: (order that sorts the rows by bin, first sorted row of each non-empty bin,
    each such bin's start time)."""
    t = np.asarray(t, dtype=float)
    edges = np.linspace(t.min(), t.max(), num_bins + 1)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, num_bins - 1)
    order = np.argsort(b, kind="stable")   # already sorted for one replica's steps: a cheap pass
    b = b[order]
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    return order, starts, edges[b[starts]]


def binned_series(t, y, num_bins: int = TIMESERIES_BINS, bins=None) -> pd.DataFrame:
    """Per equal time bin of `t` (bin start as index): min, max and mean of `y` over the rows in it; bins
    without rows are left out. `bins`: `time_bins(t, num_bins)`, when several series share `t`."""
    order, starts, x = bins if bins is not None else time_bins(t, num_bins)
    v = np.asarray(y, dtype=float)[order]
    sizes = np.diff(np.r_[starts, len(v)])
    return pd.DataFrame({"min": np.minimum.reduceat(v, starts), "max": np.maximum.reduceat(v, starts),
                         "mean": np.add.reduceat(v, starts) / sizes}, index=x)


def binned_chunks(chunks, t_min: float, t_max: float, columns: list[str],
                  num_bins: int = TIMESERIES_BINS) -> dict[str, pd.DataFrame]:
    """`binned_series` of each of `columns` against `start_s`, from a table read in chunks (an iterable of
    frames whose `start_s` lies in [t_min, t_max]), so a long run's table is never in memory whole. Min
    and max are exact; a mean may differ from `binned_series`' in the last bits (sums taken per chunk)."""
    edges = np.linspace(t_min, t_max, num_bins + 1)
    lo = {c: np.full(num_bins, np.inf) for c in columns}
    hi = {c: np.full(num_bins, -np.inf) for c in columns}
    total = {c: np.zeros(num_bins) for c in columns}
    count = np.zeros(num_bins, dtype=np.int64)
    for df in chunks:
        if not len(df):
            continue
        b = np.clip(np.searchsorted(edges, df["start_s"].to_numpy(float), side="right") - 1, 0, num_bins - 1)
        order = np.argsort(b, kind="stable")
        b = b[order]
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        where = b[starts]
        count[where] += np.diff(np.r_[starts, len(b)])
        for c in columns:
            v = df[c].to_numpy(float)[order]
            lo[c][where] = np.minimum(lo[c][where], np.minimum.reduceat(v, starts))
            hi[c][where] = np.maximum(hi[c][where], np.maximum.reduceat(v, starts))
            total[c][where] += np.add.reduceat(v, starts)
    keep = count > 0
    return {c: pd.DataFrame({"min": lo[c][keep], "max": hi[c][keep], "mean": total[c][keep] / count[keep]},
                            index=edges[:-1][keep]) for c in columns}


def engine_timeseries(runs: dict[str, tuple[pd.DataFrame, int]], path: Path, subtitle: str) -> Path:
    """`runs`: label -> (iterations table, number of KV blocks). Queue, running sequences, KV use over time.
    A run of more than 2 x TIMESERIES_BINS iterations is drawn per time bin: a band from the bin's minimum
    to its maximum (what its every step would fill at this width) and a line at its mean. The table may
    also come already binned: `binned_chunks`' frames for num_waiting, num_running and kv_blocks_used."""
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    binned = False
    colors = _palette(runs)
    for label, (it, num_blocks) in runs.items():
        c = colors[label]
        if isinstance(it, dict):   # binned while read (experiments.report)
            binned = True
            for ax, col, pct in zip(axes, ("num_waiting", "num_running", "kv_blocks_used"), (False, False, True)):
                b = 100 * it[col] / max(1, num_blocks) if pct else it[col]
                ax.fill_between(b.index, b["min"], b["max"], step="post", color=c, alpha=0.45, lw=0)
                ax.step(b.index, b["mean"], where="post", color=c, lw=0.8, label=label)
            continue
        series = (it["num_waiting"], it["num_running"], 100 * it["kv_blocks_used"] / max(1, num_blocks))
        bins = None
        for ax, y in zip(axes, series):
            if len(it) <= 2 * TIMESERIES_BINS:
                ax.step(it["start_s"], y, where="post", color=c, lw=0.9, label=label)
                continue
            binned = True
            bins = bins if bins is not None else time_bins(it["start_s"])
            b = binned_series(it["start_s"], y, bins=bins)
            ax.fill_between(b.index, b["min"], b["max"], step="post", color=c, alpha=0.45, lw=0)
            ax.step(b.index, b["mean"], where="post", color=c, lw=0.8, label=label)
    for ax, y in zip(axes, ("queue depth (requests waiting)", "running sequences (holding KV)", "KV cache used (%)")):
        ax.set_ylabel(y, fontsize=9)
        ax.grid(True, alpha=0.3)
    rect = _legends(fig, list(axes), 7, loc="upper right")
    axes[2].set_ylim(0, 105)
    axes[2].set_xlabel("simulated time (s)" + (f"; in {TIMESERIES_BINS:,} time bins: band = min..max, "
                                                  "line = mean over the steps in the bin" if binned else ""))
    return _save(fig, path, f"Engine state over time\n{subtitle}", rect)


def capacity_plan(curves: dict[str, tuple[list, list]], target_rps: float, path: Path, subtitle: str,
                  gpus_per_replica: dict[str, int] | None = None, price_per_gpu_hour: float | None = None) -> Path:
    """`curves`: label -> (target loads in requests/s, replicas needed). Cost on a second axis when priced."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = _palette(curves)
    for label, (xs, ys) in curves.items():
        ys = [math.nan if y is None else y for y in ys]
        ax.step(xs, ys, where="post", color=colors[label], label=label)
    ax.axvline(target_rps, color="k", ls="--", lw=1, label=f"target {target_rps:g} requests/s")
    ax.set_xlabel("target load (requests/s)")
    ax.set_ylabel("replicas needed")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    rect = _legends(fig, [ax], 8, loc="upper left")
    if price_per_gpu_hour and gpus_per_replica and len(set(gpus_per_replica.values())) == 1:
        tp = next(iter(gpus_per_replica.values()))
        sec = ax.secondary_yaxis("right", functions=(lambda r: r * tp * price_per_gpu_hour,
                                                     lambda c: c / (tp * price_per_gpu_hour)))
        sec.set_ylabel(f"cost per hour ({tp} GPU/replica x {price_per_gpu_hour:g}/GPU-hour)")
    return _save(fig, path, f"Capacity plan: replicas to serve a load within the SLO\n{subtitle}", rect)


def metric_by_setting(table: pd.DataFrame, x_col: str, y_col: str, y_label: str, path: Path, subtitle: str,
                      line_col: str = "policy", ratio: pd.DataFrame | None = None) -> Path:
    """A sweep without a load axis: one line per policy over the first swept setting (mean over seeds), and
    with `ratio` (columns x_col, 'ratio') a second panel: one policy's throughput over another's."""
    fig, axes = plt.subplots(1, 2 if ratio is not None else 1, figsize=(12 if ratio is not None else 7.5, 4.6),
                             squeeze=False)
    ax = axes[0, 0]
    numeric = pd.api.types.is_numeric_dtype(table[x_col])
    groups = list(table.groupby(line_col, sort=False))
    colors = _palette(str(label) for label, _ in groups)
    for label, df in groups:
        s = df.groupby(x_col)[y_col].mean().sort_index()
        ax.plot(s.index if numeric else [str(v) for v in s.index], s.values, "o-",
                color=colors[str(label)], label=str(label))
    ax.set_ylabel(y_label)
    rect = _legends(fig, [ax], 8)
    if ratio is not None:
        r = ratio.sort_values(x_col)
        axes[0, 1].plot(r[x_col] if numeric else r[x_col].astype(str), r["ratio"], "o-", color="k")
        axes[0, 1].axhline(1, color="grey", ls=":", lw=1)
        axes[0, 1].set_ylabel(ratio.attrs.get("label", "ratio"))
        axes[0, 1].set_ylim(bottom=0)
    for a in axes[0]:
        if numeric and table[x_col].min() > 0 and table[x_col].max() / table[x_col].min() >= 20:
            _log_scale(a, "x")
            a.set_xticks(sorted(table[x_col].unique()), [f"{v:g}" for v in sorted(table[x_col].unique())])
        a.set_xlabel(x_col.split(".", 1)[-1] + (" (log scale)" if a.get_xscale() == "log" else ""))
        a.grid(True, alpha=0.3)
    return _save(fig, path, f"{y_label} by {x_col.split('.', 1)[-1]}\n{subtitle}", rect)

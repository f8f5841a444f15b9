"""The fidelity report of fidelity.validate: per-step error of the cost model on the batches that really
ran (raw and normalised by the machine's speed index), and per policy and load the real runs' range of
each latency/throughput metric against the simulated value. Pure tables in, files out."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
           "e2e_p50_ms", "e2e_p99_ms", "throughput_rps", "output_tok_per_s")
COMPOSITIONS = ("prefill_only", "decode_only", "mixed")
# the metrics whose simulated value should fall inside the real runs' range below saturation
RANGE_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def iteration_errors(runs, cost_model) -> pd.DataFrame:
    """One row per real step: measured, speed-normalised and simulated seconds and relative errors."""
    frames = []
    for policy, load, rep, kind, res in runs:
        if kind != "real" or res.records is None or not len(res.records):
            continue
        df = res.records.copy()
        df.insert(0, "policy", policy)
        df.insert(1, "load", load)
        df.insert(2, "repeat", rep)
        df["sim_s"] = [cost_model.step_time_s(**a) for a in res.cost_args]
        df["error"] = df["sim_s"] / df["measured_s"] - 1.0
        df["error_normalised"] = df["sim_s"] / df["normalised_s"] - 1.0
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def step_error_table(it: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 absolute relative error (%) per policy and batch composition (and 'all')."""
    rows = []
    for policy, g in it.groupby("policy", sort=False):
        for comp in ("all", *COMPOSITIONS):
            sub = g if comp == "all" else g[g["kind"] == comp]
            if not len(sub):
                continue
            raw, norm = sub["error"].abs() * 100, sub["error_normalised"].abs() * 100
            rows.append({"policy": policy, "composition": comp, "steps": len(sub),
                         "median_abs_err_pct": raw.median(), "p90_abs_err_pct": raw.quantile(0.9),
                         "median_abs_err_norm_pct": norm.median(), "p90_abs_err_norm_pct": norm.quantile(0.9),
                         "bias_pct": sub["error"].median() * 100,
                         "bias_norm_pct": sub["error_normalised"].median() * 100,
                         "total_time_err_pct": (sub["sim_s"].sum() / sub["measured_s"].sum() - 1) * 100,
                         "total_time_err_norm_pct": (sub["sim_s"].sum() / sub["normalised_s"].sum() - 1) * 100,
                         "measured_median_ms": sub["measured_s"].median() * 1e3})
    return pd.DataFrame(rows)


def metric_table(runs) -> pd.DataFrame:
    """Per policy, load and metric: the real runs' min/median/max, the simulated value, its relative
    error to the real median and whether it falls inside the real range."""
    rows = []
    keys = list(dict.fromkeys((p, l) for p, l, *_ in runs))
    for policy, load in keys:
        real = [r.summary for p, l, _, k, r in runs if (p, l, k) == (policy, load, "real")]
        sim = next(r.summary for p, l, _, k, r in runs if (p, l, k) == (policy, load, "sim"))
        for m in METRICS:
            vals = np.array([s[m] for s in real], dtype=float)
            lo, med, hi = np.nanmin(vals), np.nanmedian(vals), np.nanmax(vals)
            rows.append({"policy": policy, "load": load, "metric": m, "real_min": lo, "real_median": med,
                         "real_max": hi, "real_spread_pct": (hi / lo - 1) * 100 if lo > 0 else np.nan,
                         "sim": sim[m], "rel_err_pct": (sim[m] / med - 1) * 100 if med > 0 else np.nan,
                         "inside_range": bool(lo <= sim[m] <= hi), "num_real_runs": len(vals)})
    return pd.DataFrame(rows)


def range_summary(metrics: pd.DataFrame) -> str:
    """One line: below saturation, how many simulated p50/p99 TTFT/TPOT/E2E values fall inside the real
    runs' range and how many within 5% of their median."""
    m = metrics[(metrics["load"] != "saturated") & metrics["metric"].isin(RANGE_METRICS)]
    if not len(m):
        return "No load below saturation was run."
    err = m["rel_err_pct"].abs()
    return (f"Below saturation, {int(m['inside_range'].sum())} of {len(m)} simulated p50/p99 TTFT, TPOT and E2E "
            f"values fall inside the real runs' range; {int((err <= 5).sum())} are within 5% of the real median "
            f"(median |error| {err.median():.1f}%, largest {err.max():.1f}%; the real runs' spread: median "
            f"{m['real_spread_pct'].median():.1f}%).")


def raw_saturated_throughput(runs) -> pd.DataFrame:
    """With --speed-normalise the real runs' clock is speed-normalised; for a saturated run (busy from the
    first step to the last) the raw clock's throughput is output tokens / summed raw step times."""
    rows = []
    for policy, load, rep, kind, res in runs:
        if kind != "real" or load != "saturated" or res.records is None or not len(res.records):
            continue
        tokens = res.summary["output_tok_per_s"] * res.records["normalised_s"].sum()
        rows.append({"policy": policy, "repeat": rep, "raw_tok_per_s": tokens / res.records["measured_s"].sum(),
                     "normalised_tok_per_s": res.summary["output_tok_per_s"]})
    return pd.DataFrame(rows)


def speed_table(it: pd.DataFrame, runs) -> dict:
    """Machine noise seen during the real runs: the speed index's range over the run, and the noise floor
    = how far back-to-back repeats of the identical probe step fall from their median (abs. deviation)."""
    ratio = it["speed_ratio"] if len(it) else pd.Series([1.0])
    devs = [abs(x / s[1] - 1) for *_, kind, r in runs if kind == "real" for s in (r.speed_samples or [])
            for x in s[2:]]
    return {"speed_ratio_min": float(ratio.min()), "speed_ratio_median": float(ratio.median()),
            "speed_ratio_max": float(ratio.max()),
            "noise_floor_median_pct": float(np.median(devs) * 100) if devs else float("nan"),
            "noise_floor_p90_pct": float(np.percentile(devs, 90) * 100) if devs else float("nan"),
            "minor_faults_per_step_mean": float(it["minor_faults"].mean()) if len(it) else 0.0,
            "minor_faults_per_step_max": int(it["minor_faults"].max()) if len(it) else 0}


def plot(it: pd.DataFrame, path: Path, measured: str = "measured_s") -> None:
    """Simulated against measured step time per policy; `measured`: the raw or the normalised column."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(it["policy"]))
    fig, axes = plt.subplots(1, len(policies), figsize=(4.5 * len(policies), 4.2), squeeze=False)
    colors = {"prefill_only": "tab:red", "decode_only": "tab:blue", "mixed": "tab:green"}
    lo = float(min(it[measured].min(), it["sim_s"].min())) * 1e3 * 0.8
    hi = float(max(it[measured].max(), it["sim_s"].max())) * 1e3 * 1.2
    for ax, policy in zip(axes[0], policies):
        g = it[it["policy"] == policy]
        for comp, c in colors.items():
            sub = g[g["kind"] == comp]
            if len(sub):
                ax.scatter(sub[measured] * 1e3, sub["sim_s"] * 1e3, s=6, alpha=0.5, c=c, label=comp)
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.plot([lo, hi], [lo * 1.15, hi * 1.15], "k:", lw=0.6)
        ax.plot([lo, hi], [lo / 1.15, hi / 1.15], "k:", lw=0.6)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=policy,
               xlabel=("speed-normalised " if measured == "normalised_s" else "") + "measured step time (ms)",
               ylabel="simulated step time (ms)")
        ax.legend(fontsize=7, markerscale=2)
    fig.suptitle("simulated vs measured step time (dotted: +-15%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _md(df: pd.DataFrame, floatfmt: str = "{:.1f}") -> str:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        out.append("| " + " | ".join(floatfmt.format(v) if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(out)


def write_report(result: dict, out: Path, corrected: Path | None, command: str) -> Path:
    runs, cm = result["runs"], result["cost_model"]
    it = iteration_errors(runs, cm)
    steps, metrics, speed = step_error_table(it), metric_table(runs), speed_table(it, runs)
    it.to_csv(out / "iterations.csv", index=False)
    steps.to_csv(out / "step_errors.csv", index=False)
    metrics.to_csv(out / "metrics.csv", index=False)
    normalised = bool(result.get("speed_normalise"))
    if len(it):
        plot(it, out / "step_time.png", "normalised_s" if normalised else "measured_s")
    a = result["args"]
    desc = cm.describe()
    clock_note = (
        f"Speed-normalised clock: the probe step was timed right before and after every step, each step's "
        f"forward pass ran {result.get('step_repeats')} times back to back, and the engine advanced by the "
        "median step time at the baseline speed; the real runs' metrics below are on that clock. "
        "`measured` in the per-step table is the raw first run, `norm` the normalised time."
        if normalised else
        "The engine advanced by the raw measured step time; `norm` divides it by the latest periodic probe's "
        "speed index.")
    lines = [
        "# Fidelity report", "", f"Command: `{command}`", "",
        f"Device: {a['device']} ({result['device_name']}), torch threads {result['threads']}, dtype {a['dtype']}, "
        f"step clock {a['clock']}, decode attention {result.get('decode_attention', '?')}; "
        f"model {a['model'] if not a['config'] else a['config']}; cost model under test: "
        f"{desc.get('kind')} ({desc.get('source', desc.get('name', ''))}).", "",
        f"Speed index (probe step time / baseline {result['reference_base_s'] * 1e3:.2f} ms): "
        f"min {speed['speed_ratio_min']:.3f}, median {speed['speed_ratio_median']:.3f}, "
        f"max {speed['speed_ratio_max']:.3f}. Noise floor (identical probe step repeated back to back, "
        f"abs. deviation from its median): median {speed['noise_floor_median_pct']:.1f}%, "
        f"p90 {speed['noise_floor_p90_pct']:.1f}%; no per-step error can be expected below it. "
        f"Minor page faults per step: mean {speed['minor_faults_per_step_mean']:.1f}, "
        f"max {speed['minor_faults_per_step_max']}.", "", clock_note, "",
        *([f"**Interrupted**: {result['interrupted']} real runs finished; the tables cover those only.", ""]
          if result.get("interrupted") else []),
        "## Per-step error (simulated vs measured, same batches)", "",
        "Error = simulated / measured - 1 per real iteration; `norm` divides the measured time by the speed "
        "index first (removes machine-speed drift); bias = median signed error; total_time = summed simulated / "
        "summed measured busy time - 1 (each also against the normalised time: `_norm`).", "",
        _md(steps), "",
        "## Per-policy metrics: real runs' range vs simulated", "",
        "`saturated`: every request queued at t = 0; loads are fractions of the real saturated capacity. "
        "rel_err is to the real median; inside = the simulated value falls within the real runs' range. "
        "A point's real runs were spread over the validation (round robin over policies and loads).", "",
        range_summary(metrics), "",
        _md(metrics.drop(columns=["num_real_runs"]), "{:.3g}"), "",
    ]
    raw_tp = raw_saturated_throughput(runs) if normalised else pd.DataFrame()
    if len(raw_tp):
        raw_tp.to_csv(out / "raw_throughput.csv", index=False)
        lines += ["Saturated runs' output throughput on the raw clock (output tokens / summed raw step times) "
                  "next to the speed-normalised clock's:", "", _md(raw_tp, "{:.1f}"), ""]
    if result["overheads"] is not None:
        ps, pr, kernel_ratio = result["overheads"]
        lines += ["## Overhead refit", "",
                  f"Kernels alone (the model without its overhead terms) predict a median {kernel_ratio:.2f}x "
                  "the measured step time" + (" - more than the steps take, so no non-negative overhead "
                                              "can fix it; the kernel tables are off." if kernel_ratio > 1 else "."),
                  "",
                  f"Refit: per_step_s = {ps * 1e3:.3f} ms, per_request_s = {pr * 1e6:.1f} us"
                  + (f"; corrected profile written to `{corrected}`." if corrected else
                     " (the cost model has no profile file to correct).")]
    files = "iterations.csv (every real step), step_errors.csv, metrics.csv, step_time.png"
    if a.get("profile") == "stepfit":  # validate fitted the model under test itself and saved it
        files += "; the step model under test: stepfit.json, fitted on the steps in stepfit_steps.csv"
    lines += ["", f"Files: {files}."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

"""Goodput per GPU of prefill/decode disaggregation versus co-located replicas on the same GPUs, DistServe
style: `python examples/plot_disaggregation.py [--jobs N] [--out docs/img/disaggregation.png]`.

Runs (or resumes, into results/<name>) examples/disaggregation.yaml and examples/disaggregation_colocated.yaml.
Per workload and deployment it reads the SLO attainment (fraction of requests meeting TTFT and TPOT) at
every swept rate; the goodput per GPU is the highest rate per GPU whose attainment is >= 90% (DistServe's
definition), interpolated linearly between the last rate that meets it and the next one, and only below
the first rate that misses it. Prints the table the plot is drawn from.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.config import load_sweep_file  # noqa: E402
from experiments.sweep import run_sweep  # noqa: E402

SWEEPS = ("disaggregation_colocated.yaml", "disaggregation.yaml")
TARGET_ATTAINMENT = 0.9
WORKLOADS = {2048: "prefill-heavy (prompt ~2048, output ~64)", 256: "decode-heavy (prompt ~256, output ~512)"}


def deployment(row) -> str:
    if pd.notna(row.get("disaggregation.num_prefill_replicas")):
        return f"{int(row['disaggregation.num_prefill_replicas'])}P{int(row['disaggregation.num_decode_replicas'])}D"
    return f"co-located x{int(row['num_replicas'])}"


def max_rate_meeting(curve: pd.DataFrame, target: float = TARGET_ATTAINMENT) -> float:
    """Highest rate (per GPU) with attainment >= target, searching up from the lowest rate and stopping
    at the first miss; linear interpolation between the last pass and that miss. 0 if the lowest misses."""
    curve = curve.sort_values("rate_per_gpu")
    best, prev = 0.0, None
    for r, a in zip(curve["rate_per_gpu"], curve["slo_attainment"]):
        if a >= target:
            best, prev = r, (r, a)
            continue
        if prev is not None:
            (r0, a0) = prev
            best = r0 + (r - r0) * (a0 - target) / (a0 - a)
        break
    return float(best)


def load_results(jobs: int | None) -> pd.DataFrame:
    frames = []
    for name in SWEEPS:
        sweep = load_sweep_file(ROOT / "examples" / name)
        res = run_sweep(sweep, ROOT / "results" / sweep["name"], jobs=jobs, progress=False)
        frames.append(res.results)
    df = pd.concat(frames, ignore_index=True)
    df["deployment"] = df.apply(deployment, axis=1)
    df["workload_name"] = df["workload.prompt_tokens.median"].map(WORKLOADS)
    df["rate_per_gpu"] = df["workload.arrival.rate_per_s"] / df["num_gpus"]
    return df


def goodput_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (w, d), g in df.groupby(["workload_name", "deployment"], sort=False):
        rate = max_rate_meeting(g)
        best = g[g["slo_attainment"] >= TARGET_ATTAINMENT]
        rows.append({"workload": w, "deployment": d, "goodput_per_gpu_at_90pct": round(rate, 2),
                     "max_measured_goodput_rps_per_gpu": round(float(g["goodput_rps_per_gpu"].max()), 2),
                     "ttft_p99_ms_at_best": round(float(best.sort_values("rate_per_gpu").iloc[-1]["ttft_p99_ms"]), 1)
                     if len(best) else float("nan"),
                     "tpot_p99_ms_at_best": round(float(best.sort_values("rate_per_gpu").iloc[-1]["tpot_p99_ms"]), 1)
                     if len(best) else float("nan")})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, table: pd.DataFrame, out: Path) -> None:
    workloads = list(WORKLOADS.values())
    deps = sorted(table["deployment"].unique(), key=lambda d: (not d.startswith("co"), d))
    color = {d: f"C{i}" for i, d in enumerate(deps)}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, w in zip(axes[:2], workloads):
        for d in deps:
            g = df[(df["workload_name"] == w) & (df["deployment"] == d)].sort_values("rate_per_gpu")
            ax.plot(g["rate_per_gpu"], 100 * g["slo_attainment"], marker="o", ms=3, color=color[d],
                    lw=2.2 if d.startswith("co") else 1.3, ls="-" if d.startswith("co") else "--", label=d)
        ax.axhline(100 * TARGET_ATTAINMENT, color="grey", lw=0.8, ls=":")
        ax.set(title=w, xlabel="request rate per GPU (req/s)", ylabel="SLO attainment (%)", ylim=(0, 102))
        ax.legend(fontsize=8)
    ax = axes[2]
    width = 0.8 / len(deps)
    for j, d in enumerate(deps):
        vals = [table[(table.workload == w) & (table.deployment == d)]["goodput_per_gpu_at_90pct"].sum()
                for w in workloads]
        bars = ax.bar([i + j * width for i in range(len(workloads))], vals, width, label=d, color=color[d])
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], [w.split(" (")[0] for w in workloads])
    ax.set(title="goodput per GPU (>= 90% of requests meet the SLO)", ylabel="req/s per GPU")
    ax.legend(fontsize=8)
    slo = load_sweep_file(ROOT / "examples" / SWEEPS[1])["slo"]
    fig.suptitle(f"Llama-3-8B on {int(df['num_gpus'].iloc[0])}x H100-SXM; SLO per request: "
                 + " and ".join(f"{k.split('_')[0].upper()} <= {v:g} ms" for k, v in slo.items())
                 + "; disaggregated KV over 50 GB/s per GPU", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "disaggregation.png"))
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args(argv)
    df = load_results(args.jobs)
    table = goodput_table(df)
    print(table.to_string(index=False))
    plot(df, table, Path(args.out))
    print(f"\nplot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

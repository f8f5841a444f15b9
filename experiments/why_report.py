"""The capacity-planning answers a sweep's report gains (called once, after summary.md is written): what binds
at each point (experiments/binding_report.py), what a gateway refused against the tail it kept, what an
autoscaled fleet cost against fixed ones, and, for
traffic whose rate changes over time, offered against achieved load over time (experiments/load_plot.py)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from experiments.binding_report import append_binding_section
from experiments.load_plot import load_over_time
from experiments.tables import read_table
from workloads.synthetic import parse_arrival

MAX_PANELS = 4


def time_varying_runs(out: Path, results: pd.DataFrame) -> dict:
    """label -> (arrivals, finishes, rate profile) of the first seed's points whose rate changes over time."""
    runs = {}
    for _, r in results[results["seed"] == results["seed"].iloc[0]].iterrows():
        d = out / "points" / r["point"]
        try:
            arrival = yaml.safe_load((d / "config.yaml").read_text())["workload"]["arrival"]
        except (OSError, KeyError, TypeError):
            continue
        if not isinstance(arrival.get("rate_per_s"), dict) or len(runs) == MAX_PANELS:
            continue
        profile = parse_arrival({"process": arrival["process"], "rate_per_s": arrival["rate_per_s"]}).rate_profile
        req = read_table(d, "requests", ["arrival_s", "finish_s", "status"])
        fin = req[req["status"] == "finished"]
        runs[str(r.get("label", r["point"]))] = (req["arrival_s"].to_numpy(float), fin["finish_s"].to_numpy(float),
                                                 profile)
    return runs


def gateway_sentence(r) -> str:
    """What a gateway refused against the tail it kept, for a results row with gateway counts ('' if none)."""
    if "num_gateway_refused" not in r or pd.isna(r["num_gateway_refused"]):
        return ""
    n = int(r["num_requests"])
    ended = int(r["num_gateway_refused"] + r["num_dropped"] + r["num_abandoned"])
    words = (f"the gateway ended {ended:,} of {n:,} requests ({ended / n:.0%}: {int(r['num_gateway_refused']):,} "
             f"refused with a 429, {int(r['num_dropped']):,} dropped in the queue, {int(r['num_abandoned']):,} "
             f"abandoned by their clients); the {int(r['num_finished']):,} served had p99 TTFT "
             f"{r['ttft_p99_ms']:,.0f} ms")
    if "goodput_rps" in r and pd.notna(r.get("goodput_rps")):
        words += f"; goodput {r['goodput_rps']:.2f} req/s ({r['slo_attainment']:.0%} of all requests within the SLO)"
    return words[0].upper() + words[1:] + "."


def gateway_section(results: pd.DataFrame) -> list[str]:
    if "num_gateway_refused" not in results.columns:
        return []
    lines = ["## Admission control", "",
             "Per point, what the gateway refused, dropped or let clients abandon, against the latency of what it "
             "served; points without a gateway show the tail it would protect against.", ""]
    for _, r in results.iterrows():
        sentence = gateway_sentence(r)
        label = str(r.get("label", r["policy"]))
        lines.append(f"- **{label}** (`{r['point']}`): " + (sentence or
                     f"No gateway: p99 TTFT {r['ttft_p99_ms']:,.0f} ms over {int(r['num_finished']):,} served"
                     + (f"; goodput {r['goodput_rps']:.2f} req/s ({r['slo_attainment']:.0%} within the SLO)"
                        if "goodput_rps" in r and pd.notna(r.get("goodput_rps")) else "") + "."))
    return lines + [""]


def autoscaling_section(results: pd.DataFrame) -> list[str]:
    """Per point with autoscaling: GPU-hours, cost, SLO attainment and replicas, so that an autoscaled point
    reads against fixed ones (min_replicas = max_replicas) of the same sweep."""
    if "gpu_hours" not in results.columns:
        return []
    lines = ["## Autoscaling", "", "GPU-hours count every replica from its start to its leaving; a fixed fleet is "
             "min_replicas = max_replicas.", ""]
    for _, r in results.iterrows():
        if pd.isna(r.get("gpu_hours")):
            continue
        cost = f", cost {r['cost']:,.2f}" if "cost" in r and pd.notna(r.get("cost")) else ""
        slo = (f"; {r['slo_attainment']:.1%} of requests within the SLO" if "slo_attainment" in r
               and pd.notna(r.get("slo_attainment")) else "")
        lines.append(f"- **{r.get('label', r['policy'])}** (`{r['point']}`): {r['gpu_hours']:.3f} GPU-hours{cost}; "
                     f"{r['replicas_mean']:.2f} replicas on average, {int(r['replicas_peak'])} at most "
                     f"({int(r['num_scale_ups'])} started, {int(r['num_scale_downs'])} drained){slo}; p99 TTFT "
                     f"{r['ttft_p99_ms']:,.0f} ms.")
    return lines + [""]


def append_why_sections(out: Path, results: pd.DataFrame, grid_keys: list[str], setup: str) -> list[Path]:
    """Figures made (paths); summary.md gains their sections."""
    made = append_binding_section(out, results, grid_keys, setup)
    lines = gateway_section(results) + autoscaling_section(results)
    if lines:
        with open(out / "summary.md", "a") as f:
            f.write("\n" + "\n".join(lines))
    runs = time_varying_runs(out, results)
    if runs:
        p = load_over_time(runs, out / "plots" / "load_over_time.png", setup)
        made.append(p)
        with open(out / "summary.md", "a") as f:
            f.write(f"\n## Offered vs achieved load over time\n\n![{p.stem}](plots/{p.name})\n")
    return made

"""Report for a plain sweep (no search): load curves when a load is swept, else throughput by the first
swept setting with a policy-over-static ratio (Anyscale's), CDFs, engine state, slot timeline, summary.md."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import plots
from experiments.offload_report import with_offload_columns
from experiments.why_report import append_why_sections
from simcore.metrics import untrusted_notes
from experiments.answer_basis import router_bases_of, schedules_line, seeds_line, vllm_versions_of
from experiments.report import (LOAD_SUFFIXES, _gantt, _label, _requests_cdf_input, _timeseries, describe_setup,
                                md_table, settings_words, with_basis)
from costmodels.basis import rests_on


def sweep_report(sweep: dict, out: Path, results: pd.DataFrame) -> list[Path]:
    swept = list((sweep.get("grid") or {}).keys())  # a mapping swept whole shows up as its dotted columns,
    # of which a label needs only the settings that differ between its values
    grid_keys = [c for c in results.columns if c in swept or (any(c.startswith(k + ".") for k in swept)
                                                               and results[c].astype(str).nunique(dropna=False) > 1)]
    setup = describe_setup(sweep)
    if "cost_model_basis" in results:   # every figure says what it rests on
        setup = with_basis(setup, {_label(r, grid_keys): r["cost_model_basis"] for _, r in results.iterrows()})
    first = results[results["seed"] == results["seed"].iloc[0]]
    load_keys = [k for k in grid_keys if k.endswith(LOAD_SUFFIXES)]
    others = [k for k in grid_keys if k != "engine.policy" and k not in load_keys]
    results = results.assign(label=[_label(r, others) for _, r in results.iterrows()])
    made = []
    if load_keys:
        lk = load_keys[0]
        finite = results[np.isfinite(results[lk].astype(float))]
        curves = {lab: df for lab, df in finite.groupby("label", sort=False)}
        sub = setup + ("; runs with every request at t = 0 (rate .inf) are in the table, not on this axis"
                       if len(finite) < len(results) else "")
        for m in ("ttft_p99_ms", "itl_p99_ms"):
            made.append(plots.latency_vs_load(curves, lk, m, out / "plots" / f"latency_vs_load_{m}.png", sub))
        made.append(plots.throughput_vs_load(curves, lk, out / "plots" / "throughput_vs_load.png", sub))
        made.append(plots.throughput_latency(curves, lk, [("ttft_p99_ms", None), ("itl_p99_ms", None)],
                                             out / "plots" / "throughput_latency.png", sub))
        finite_first = first[np.isfinite(first[lk].astype(float))]
        chosen = first[first[lk] == (finite_first[lk].max() if len(finite_first) else first[lk].max())]
    elif others:
        x = others[0]
        if len(others) > 1 and first.groupby(["policy", x], dropna=False).size().max() > 1:
            # the first setting does not tell the configurations apart (autoscalers swept whole, two of which
            # share max_replicas): one category per configuration on the axis, and all of them in the CDFs
            results = results.assign(setting=[", ".join(settings_words(r, others)) for _, r in results.iterrows()])
            first = results[results["seed"] == results["seed"].iloc[0]]
            x, chosen = "setting", first
        else:
            chosen = _at_last_value(first, x)
        ratio = policy_ratio(results, [x])
        if ratio is not None:
            ratio.attrs["label"] = "output throughput, continuous / static (x)"
        made.append(plots.metric_by_setting(results, x, "output_tok_per_s", "output throughput (tokens/s)",
                                            out / "plots" / "throughput_by_setting.png", setup, ratio=ratio))
    else:
        chosen = first
    runs = {_label(r, grid_keys): out / "points" / r["point"] for _, r in chosen.iterrows()}
    made.append(plots.latency_cdfs({k: _requests_cdf_input(d) for k, d in runs.items()},
                                   out / "plots" / "latency_cdf.png", setup))
    made.append(_timeseries(runs, out, setup))
    if load_keys:
        low = first[first[load_keys[0]] == first[load_keys[0]].min()]
    else:
        low = _at_last_value(first, others[0]) if others else first
    for k in [k for k in others if results[k].notna().all()]:  # one static panel: settings as in the first row
        low = low[low[k] == low[k].iloc[0]] if len(low) else low
    g = _gantt({_label(r, grid_keys): out / "points" / r["point"] for _, r in low.iterrows()}, out, setup)
    if g:
        made.append(g)
    (out / "summary.md").write_text(_sweep_md(sweep, results, grid_keys, others, made))
    made += append_why_sections(out, results, grid_keys, setup)   # experiments/why_report.py
    return made


def _at_last_value(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """The rows whose `key` equals the last row's (a missing value, NaN or None, matches missing ones)."""
    column = frame[key]
    last = column.iloc[-1]
    return frame[column.isna()] if pd.isna(last) else frame[column == last]


def policy_ratio(results: pd.DataFrame, by: list[str], num: str = "continuous", den: str = "static",
                 col: str = "output_tok_per_s") -> pd.DataFrame | None:
    """Throughput of one policy over another at equal settings (mean over seeds), e.g. Anyscale's ratio."""
    pol = set(results["policy"])
    if num not in pol or den not in pol:
        return None
    by = [k for k in by if results[k].notna().all()]  # a knob only some policies have is not a setting to match
    m = results.groupby(by + ["policy"])[col].mean().unstack("policy") if by else \
        results.groupby("policy")[col].mean().to_frame().T
    m = m.dropna(subset=[num, den])
    if m.empty:
        return None
    return pd.DataFrame({**({k: m.index.get_level_values(k) for k in by} if by else {}),
                         f"{num}_{col}": m[num].values, f"{den}_{col}": m[den].values,
                         "ratio": (m[num] / m[den]).values})


def _sweep_md(sweep, results, grid_keys, others, made) -> str:
    lines = [f"# {sweep.get('name', 'sweep')}", "", describe_setup(sweep) + ".", ""]
    if "cost_model_basis" in results:
        bases = {_label(r, grid_keys): r["cost_model_basis"] for _, r in results.iterrows()}
        schedules = schedules_line(results['policy'], vllm_versions_of(results), router_bases_of(results))
        lines += [f"**Rests on** the {rests_on(bases)}; it {schedules}; {seeds_line(results['seed'].nunique())}.", ""]
    by = [k for k in grid_keys if k != "engine.policy"]
    for num in ("continuous", "chunked_prefill"):
        ratio = policy_ratio(results, by, num)
        if ratio is not None:
            by_used = [k for k in by if k in ratio.columns]
            words = "; ".join(", ".join(f"{k.split('.')[-1]}={r[k]:g}" if isinstance(r[k], float) else
                                        f"{k.split('.')[-1]}={r[k]}" for k in by_used) + f": {r['ratio']:.2f}x"
                              for _, r in ratio.iterrows())
            lines += [f"Output throughput, {num} / static: {words}.", "", md_table(ratio), ""]
    cols = ["label", *[k for k in grid_keys if k.endswith(LOAD_SUFFIXES)], "seed", "offered_rate_per_s",
            "throughput_rps", "input_tok_per_s", "output_tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms",
            "tpot_p99_ms",
            "mean_running", "kv_usage_max", "num_preemptions", "num_rejected", "unstable"]
    results, offload = with_offload_columns(results)   # KV offload runs: hit rate, bytes moved, recomputed
    cols += offload
    lines += trust_section(results, [k for k in grid_keys if k.endswith(LOAD_SUFFIXES)])
    lines += ["## Results", "", md_table(results[[c for c in cols if c in results.columns]]), "",
              "## Figures", ""] + [f"![{p.stem}](plots/{p.name})" for p in made] + [""]
    return "\n".join(lines)


def trust_section(results: pd.DataFrame, load_keys: list[str] = ()) -> list[str]:
    """summary.md's words on rows that cannot be taken at face value (simcore.metrics.untrusted_notes);
    `load_keys`: swept load columns, named next to each row's label."""
    lines = ["## Can these results be trusted?", ""]
    flagged = [(r, untrusted_notes(r)) for _, r in results.iterrows()]
    flagged = [(r, n) for r, n in flagged if n]
    if not flagged:
        return lines + ["Every run served the load it was offered (no backlog growing through the run), and no "
                        "request was rejected or clipped.", ""]
    lines += [f"**{len(flagged)} of {len(results)} runs cannot be taken at face value:**", ""]
    def name(r) -> str:
        loads = ", ".join(f"{k.split('.')[-1]} {r[k]:g}" if isinstance(r[k], float) else f"{k.split('.')[-1]} {r[k]}"
                          for k in load_keys if k in r)
        return f"**{r.get('label', r['policy'])}{', ' + loads if loads else ''}** (`{r['point']}`)"
    lines += [f"- {name(r)}: " + "; ".join(n) + "." for r, n in flagged]
    return lines + ["", "`offered_rate_per_s` is the rate requests were sent at, `throughput_rps` "
                    "(= `achieved_rate_per_s`) the rate they finished at; `unstable` marks a backlog that kept "
                    "growing (past saturation), `num_rejected` / `rejected_reasons` requests the engine refused.", ""]

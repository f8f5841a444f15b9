"""After a search: pick the runs worth plotting, draw the figures (`experiments.plots`) and write `summary.md`,
which states the answers in words ("chunked_prefill: 212 concurrent users at p99 TTFT <= 200 ms, ...").

Reads only what the sweep or search saved in the output folder, so it can be rerun on finished results.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd

from costmodels.basis import rests_on
from experiments import plots
from experiments.answer_basis import point_router_bases, point_vllm_versions, schedules_line
from experiments.capacity_over_time import check_sentence
from experiments.capacity_plan import CapacitySpec, replicas_curve
from experiments.config import set_dotted
from experiments.search import pretty_metric
from experiments.search_run import SearchResult, comparison_load, gantt_load
from experiments.tables import iter_table, read_itl_ms, read_table, table_num_rows

LOAD_SUFFIXES = ("arrival.concurrency", "arrival.rate_per_s")


def md_table(df: pd.DataFrame) -> str:
    def cell(v):
        if v is None:
            return ""
        if isinstance(v, float):
            if math.isnan(v):
                return ""
            if v.is_integer() and abs(v) < 1e15:
                return f"{int(v):,}"
            return f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.3g}"
        return str(v)
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def with_basis(setup: str, bases) -> str:
    """A figure's subtitle: the setup, then (on its own line) what the figure rests on, its real-run
    checks cut to where they are."""
    return f"{setup}\n{rests_on(bases, brief=True)}"


def describe_setup(sweep: dict) -> str:
    """One line a reader needs to interpret a figure without the YAML; swept settings show as 'swept'."""
    sweep = copy.deepcopy(sweep)
    searched = [sweep["search"]["over"]] if isinstance(sweep.get("search"), dict) and "over" in sweep["search"] else []
    for k in [*(sweep.get("grid") or {}), *searched]:
        if k not in ("engine", "engine.policy") and not any(k.startswith(f"{j}.") for j in (sweep.get("grid") or {})):
            set_dotted(sweep, k, "swept")  # (a key inside a mapping swept whole is covered by that mapping)
    w = sweep.get("workload") if isinstance(sweep.get("workload"), dict) else {}  # a string when swept whole
    a = w.get("arrival") if isinstance(w.get("arrival"), dict) else {}

    def dist(d):
        if not isinstance(d, dict):
            return str(d or "?")   # 'swept'
        d = dict(d)
        name = d.pop("dist", "?")
        return f"{name}(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")"
    tp = sweep.get("tensor_parallel_size", 1)
    on = f"{sweep.get('model', 'llama-3-8b')} on {_gpus(tp, sweep.get('hardware', 'h100-sxm'))}"
    if not isinstance(sweep.get("workload"), dict):
        return f"{on}, workloads swept"
    if "trace" in w:   # lengths and arrival times from the trace
        trace = w["trace"]
        name = Path(str(trace.get("path", "?"))).name if isinstance(trace, dict) else "swept"
        return f"{on}, trace replay ({name})"
    rate = a.get("rate_per_s")
    if a.get("process") == "closed":
        traffic = "closed loop" + (f", think time {a['think_time_s']} s" if a.get("think_time_s") else "")
    elif isinstance(rate, float) and math.isinf(rate):
        traffic = "all requests at t = 0"
    else:
        traffic = (f"{a.get('process', '?')} arrivals" + (f" cv={a['cv']}" if "cv" in a else "")
                   + (f" at {rate} requests/s" if isinstance(rate, (int, float)) else ""))
    return f"{on}, {traffic}, prompt {dist(w.get('prompt_tokens'))}, output {dist(w.get('output_tokens'))}"


def _gpus(tp, hardware) -> str:
    """'2x h100-sxm'; a GPU described by a mapping or a file by its name; what is swept said so."""
    if isinstance(hardware, dict):
        hardware = hardware.get("name") or (f"{hardware['base']}-custom" if hardware.get("base") else "custom-gpu")
    elif isinstance(hardware, str) and hardware.lower().endswith((".yaml", ".yml", ".json")):
        hardware = f"the GPU in {Path(hardware).name}"
    if hardware == "swept":
        return "GPUs and TP swept" if tp == "swept" else f"{tp}x GPU (swept)"
    return f"{hardware}, TP swept" if tp == "swept" else f"{tp}x {hardware}"


def varying_settings(grid_values: list[dict], grid_keys: list[str]) -> dict[str, set]:
    """For each grid key swept as whole mappings, the settings that differ between its mappings: all a
    label needs of them (an autoscaler's eight settings, of which one is swept, label as that one)."""
    out = {}
    for k in grid_keys:
        maps = [v[k] for v in grid_values if isinstance(v.get(k), dict)]
        if maps:
            out[k] = {s for s in set().union(*maps) if len({repr(m.get(s)) for m in maps}) > 1}
    return out


def _label(row, grid_keys: list[str], varying: dict[str, set] | None = None) -> str:
    """'chunked_prefill, max_num_batched_tokens=512': the policy, then every other swept setting (of a
    mapping swept whole, the settings in `varying` when given)."""
    return ", ".join([str(row["policy"])] + settings_words(row, grid_keys, varying))


def settings_words(row, keys: list[str], varying: dict[str, set] | None = None) -> list[str]:
    """['max_replicas=4', 'min_replicas=1']: the row's value of each swept setting but the policy, named by
    short_names; a setting the row's configuration does not have (NaN, None) is left out."""
    words, names = [], short_names(keys)
    for k in keys:
        if k == "engine.policy" or k not in row:
            continue
        v = row[k]
        if v is None or (isinstance(v, float) and math.isnan(v)):  # a knob this policy does not have
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, dict):  # a whole mapping swept (e.g. `engine:`): show its settings, not the dict
            words += [f"{kk}={vv}" for kk, vv in v.items()
                      if kk != "policy" and (varying is None or k not in varying or kk in varying[k])]
        else:
            words.append(f"{names[k]}={v}")
    return words


def short_names(keys) -> dict[str, str]:
    """Each dotted key by its shortest ending no other key shares: 'max_num_seqs' for
    engine.max_num_seqs, but 'prompt_tokens.median' and 'output_tokens.median' when both are swept."""
    keys = list(keys)
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(o != k and (o == tail or o.endswith("." + tail)) for o in keys):
                break
        out[k] = tail
    return out


def label_of(grid_values: dict, policy: str, grid_keys: list[str], varying: dict[str, set] | None = None) -> str:
    return _label({**grid_values, "policy": policy}, grid_keys, varying)


def grid_labels(grid_points, grid_keys: list[str]) -> dict[str, str]:
    """'g003' -> the label of each grid point of a search (its policy and the settings that vary)."""
    varying = varying_settings([p.grid_values for p in grid_points], grid_keys)
    return {f"g{p.index:03d}": label_of(p.grid_values, p.config.policy.name, grid_keys, varying) for p in grid_points}


def _requests_cdf_input(d: Path, spec=None) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """(TTFT of the finished requests in ms, (distinct ITL gaps in ms, counts)) of the run saved in `d`.
    With a closed-loop search's `spec` (warm-up "auto"), TTFT counts the requests the search measures:
    each user's first request (all sent at t = 0) and the last ones are left out, as in
    experiments.search.steady_state_metrics."""
    req = read_table(d, "requests", ["request_id", "status", "ttft_s"])
    fin = req[req["status"] == "finished"]
    if spec is not None and spec.is_integer and spec.warmup == "auto":
        import json
        users, n = int(json.loads((d / "summary.json").read_text())["value"]), len(req)
        if n >= 3 * users:
            fin = fin[(fin["request_id"] >= users) & (fin["request_id"] < n - users)]
    return (fin["ttft_s"] * 1e3).to_numpy(), read_itl_ms(d)


def _replica0(df: pd.DataFrame) -> pd.DataFrame:
    """A cluster's tables interleave replicas; slot and engine-state plots show replica 0's."""
    return df[df["replica_id"] == 0] if "replica_id" in df and df["replica_id"].nunique() > 1 else df


def _gantt_window_s(static_req: pd.DataFrame) -> float:
    """Enough time to see three static batches (or the whole run when shorter)."""
    starts = np.sort(static_req["admitted_s"].dropna().unique())
    end = float(static_req["finish_s"].max())
    return float(starts[3]) if len(starts) > 3 else end


def _gantt(panels: dict[str, Path], out: Path, subtitle: str) -> Path | None:
    """panels: label -> folder with a requests table; needs a static one and at least one other."""
    static = [k for k in panels if k.startswith("static")]
    if not static or len(panels) < 2:
        return None
    tables = {k: _replica0(read_table(d, "requests")) for k, d in panels.items()}
    window = _gantt_window_s(tables[static[0]])
    ordered = static + [k for k in panels if k not in static]
    return plots.slot_gantt({k: (tables[k], k.startswith("static")) for k in ordered}, window,
                            out / "plots" / "slot_gantt.png", subtitle)


TIMESERIES_COLUMNS = ["start_s", "num_waiting", "num_running", "kv_blocks_used", "replica_id"]


def _timeseries(runs: dict[str, Path], out: Path, subtitle: str) -> Path:
    import json
    data = {}
    for label, d in runs.items():
        blocks = json.loads((d / "summary.json").read_text()).get("num_gpu_blocks", 1)
        if table_num_rows(d, "iterations") <= 2 * plots.TIMESERIES_BINS:
            data[label] = (_replica0(read_table(d, "iterations", TIMESERIES_COLUMNS)), blocks)
        else:   # binned as it is read, a slice at a time: a long run's table never whole in memory
            data[label] = (_binned_iterations(d), blocks)
    return plots.engine_timeseries(data, out / "plots" / "engine_timeseries.png", subtitle)


def _binned_iterations(d: Path) -> dict[str, pd.DataFrame]:
    """Replica 0's engine state in time bins (plots.binned_chunks), reading the table twice: its time span,
    then the bins."""
    def chunks(columns):   # replica 0's rows (all of them for a single replica)
        for df in iter_table(d, "iterations", columns):
            yield df[df["replica_id"] == 0] if "replica_id" in df else df

    t_min, t_max = np.inf, -np.inf
    for df in chunks(["start_s", "replica_id"]):
        if len(df):
            t_min, t_max = min(t_min, df["start_s"].min()), max(t_max, df["start_s"].max())
    return plots.binned_chunks(chunks(TIMESERIES_COLUMNS), float(t_min), float(t_max),
                               ["num_waiting", "num_running", "kv_blocks_used"])


def search_report(sweep: dict, out: Path, res: SearchResult, cap: pd.DataFrame | None,
                  cap_spec: CapacitySpec | None) -> list[Path]:
    spec, grid_keys = res.spec, list((sweep.get("grid") or {}).keys())
    load_col = spec.over.split(".")[-1]
    labels = grid_labels(res.grid_points, grid_keys)
    setup = with_basis(describe_setup(sweep), search_bases(res, labels))
    curves = {labels[g]: df for g, df in res.points.groupby("grid_point", sort=False)}
    answers = {labels[r.grid_point]: r.max_value for r in res.searches.itertuples()}
    made = []
    for i, (metric, limit) in enumerate(spec.slo_ms):
        name = "latency_vs_load.png" if i == 0 else f"latency_vs_load_{metric}.png"
        made.append(plots.latency_vs_load(curves, load_col, metric, out / "plots" / name, setup, limit, answers,
                                          line="max" if spec.confidence == "all" else "median"))
    made.append(plots.throughput_vs_load(curves, load_col, out / "plots" / "throughput_vs_load.png", setup, answers))
    made.append(plots.throughput_latency(curves, load_col, list(spec.slo_ms), out / "plots" / "throughput_latency.png",
                                         setup))
    window = ("steady state as the search measures it (each user's first and last requests left out)"
              if spec.is_integer and spec.warmup == "auto" else "all requests")
    at_answer = {}
    for gi, o in res.outcomes.items():
        v = o.best if o.best is not None else spec.lo
        if (gi, v) in res.details:
            at_answer[f"{labels[f'g{gi:03d}']} at {v:g}"] = res.details[(gi, v)]
    if at_answer:
        made.append(plots.latency_cdfs({k: _requests_cdf_input(d, spec) for k, d in at_answer.items()},
                                       out / "plots" / "latency_cdf.png",
                                       f"each at its SLO maximum, {window}; {setup}"))
    v = comparison_load(spec, res.outcomes, {p.index: p for p in res.grid_points})
    same_load = {labels[f"g{gi:03d}"]: d for (gi, val), d in sorted(res.details.items()) if val == v}
    if same_load:
        made.append(_timeseries(same_load, out, f"same traffic, {load_col} = {v:g}; {setup}"))
    static = [gi for gi, p in enumerate(res.grid_points) if p.config.policy.name == "static"]
    if static:
        gs = res.grid_points[static[0]].index
        v = gantt_load(spec, res.outcomes[gs])
        panels = {labels[f"g{gi:03d}"]: d for (gi, val), d in res.details.items() if val == v}
        g = _gantt(panels, out, f"same traffic, {load_col} = {v:g}; {setup}")
        if g:
            made.append(g)
    if cap is not None and cap_spec is not None:
        hi = 2 * cap_spec.target_rps
        cc = {labels[r.grid_point]: replicas_curve(r.capacity_rps_per_replica, cap_spec.headroom, hi)
              for r in cap.itertuples() if r.replicas is not None and not pd.isna(r.replicas)}
        tps = {labels[r.grid_point]: int(r.tensor_parallel_size) for r in cap.itertuples()}
        made.append(plots.capacity_plan(cc, cap_spec.target_rps, out / "plots" / "capacity_plan.png",
                                        f"headroom {cap_spec.headroom:.0%}; {setup}", tps, cap_spec.gpu_price_per_hour))
    (out / "summary.md").write_text(_search_md(sweep, res, labels, cap, cap_spec, made, out))
    return made


def search_bases(res: SearchResult, labels: dict) -> dict:
    """label -> the cost-model line each searched point rests on (search.csv's cost_model_basis)."""
    if "cost_model_basis" not in res.searches:
        return {}
    return {labels[r.grid_point]: r.cost_model_basis for r in res.searches.itertuples()}


def seed_spread_text(row, spec) -> str:
    """'seeds alone pass up to 152-160 users' (or one figure when they agree); '' without the columns."""
    lo, hi = getattr(row, "seed_max_low", math.nan), getattr(row, "seed_max_high", math.nan)
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) or row.seeds < 2:
        return ""
    fmt = (lambda v: f"{v:,.0f}") if spec.is_integer else (lambda v: f"{v:,.3g}")
    return (f"each seed alone passes up to {fmt(lo)}" if lo == hi else
            f"seeds alone pass up to {fmt(lo)}-{fmt(hi)}") + " (among the loads searched)"


def answer_sentence(row, spec, label: str) -> str:
    unit = spec.unit
    fmt = (lambda v: f"{v:,.0f}") if spec.is_integer else (lambda v: f"{v:,.3g}")
    rejected = getattr(row, "loads_with_rejections", "")
    rejected = (f" Requests were rejected at {rejected} {unit}, so those loads fail whatever their latency."
                if isinstance(rejected, str) and rejected else "")
    if row.status == "infeasible":
        how = row.note.partition("(")[2].partition(")")[0]
        return (f"**{label}**: even the lowest load tried, {fmt(spec.lo)} {unit}, misses {spec.slo_text}"
                + (f" ({how})" if how else "") + "." + rejected)
    slo_vals = ", ".join(f"{pretty_metric(m)} {getattr(row, f'{m}_at_max'):,.0f} ms" for m, _ in spec.slo_ms)
    if row.max_value == 1 and spec.is_integer:
        unit = "concurrent user"
    inp = getattr(row, "input_tok_per_s", math.nan)
    inp = f"{inp:,.0f} input and " if inp is not None and not pd.isna(inp) else ""
    s = (f"**{label}**: {fmt(row.max_value)} {unit} at {spec.slo_text}, "
         f"{inp}{row.output_tok_per_s:,.0f} output tok/s ({row.throughput_rps:,.2f} requests/s); worst seed {slo_vals}")
    spread = seed_spread_text(row, spec)
    if spread:
        s += f"; {spread}"
    sat = getattr(row, "saturation_rps", math.nan)
    if sat is not None and not pd.isna(sat):
        s += f"; saturates at {sat:,.3g} requests/s"
    if row.status == "above_range":
        s += "; still passing at the top of the range, so the true maximum is higher"
    elif not pd.isna(row.first_fail):
        s += f"; first failing load {fmt(row.first_fail)}"
    if spec.is_integer and row.max_value == getattr(row, "max_num_seqs", math.nan):
        s += " (the engine's max_num_seqs: more users than batch slots wait in the queue)"
    if row.non_monotone:
        s += f". **Warning: non-monotone** - the SLO is met again at {row.non_monotone} above the first failure"
    if row.status == "max_evaluations":
        s += " (stopped at max_evaluations before the tolerance)"
    if getattr(row, "unstable_at_max", False) is True:
        s += "; the run at that load was unstable (its backlog kept growing), so a longer run would do worse"
    return s + "." + rejected


def _search_md(sweep, res: SearchResult, labels, cap, cap_spec, made, out: Path) -> str:
    spec = res.spec
    points = res.grid_points
    schedules = schedules_line([p.config.policy.name for p in points], point_vllm_versions(points),
                               point_router_bases(points))
    lines = [f"# {sweep.get('name', 'sweep')}: maximum load within the SLO", "",
             describe_setup(sweep) + ".", "",
             f"**Rests on** the {rests_on(search_bases(res, labels))}; it {schedules}.", "",
             f"Searched `{spec.over}` over [{spec.lo:g}, {spec.hi:g}] for the largest load meeting "
             f"{spec.slo_text}; {spec.rule_text} (seeds: {res.searches['seeds'].iloc[0]}). Tolerance: "
             + ("one user between the answer and the first failing load" if spec.is_integer and spec.tolerance <= 1
                else f"{spec.tolerance:g} absolute / {spec.rel_tolerance:.0%} relative")
             + "; that is the search's step, not the answer's precision: each answer says how far the seeds "
             "alone would go, and the p99 at one load varies from seed to seed.",
             ""]
    if spec.is_integer and spec.warmup == "auto":
        lines += ["Latency is measured in steady state: each user's first request (all sent at t = 0) and the "
                  "last requests (while users run out of work) are left out; throughput counts the window where "
                  f"all users are active. Each run has at least {spec.min_requests_per_user} requests per user.", ""]
    lines += ["## Answers", ""]
    for r in res.searches.itertuples():
        lines.append("- " + answer_sentence(r, spec, labels[r.grid_point]))
    cols = ["policy", "status", "max_value", "first_fail", "seed_max_low", "seed_max_high", "throughput_rps",
            "saturation_rps", "input_tok_per_s", "output_tok_per_s", "prefill_time_share"]
    cols += [f"{m}_at_max" for m, _ in spec.slo_ms] + ["num_loads", "note"]
    cols = [c for c in cols if c in res.searches.columns or c == "policy"]
    tab = res.searches.copy()
    tab["policy"] = [labels[g] for g in tab["grid_point"]]
    lines += ["", md_table(tab[cols]), "",
              f"Every simulated load is in `search_points.csv` ({len(res.points)} runs"
              + (f", {res.num_reused} reused from an earlier run" if res.num_reused else "") + ").", ""]
    if cap is not None:
        lines += ["## Capacity plan", "",
                  f"Target {cap_spec.target_rps:g} requests/s of this traffic; every replica kept at or below "
                  f"{1 - cap_spec.headroom:.0%} of its SLO capacity (headroom {cap_spec.headroom:.0%}).", ""]
        for r in cap.itertuples():
            if r.replicas is None or pd.isna(r.replicas):
                lines.append(f"- **{labels[r.grid_point]}**: cannot meet the SLO at any load on one replica.")
                continue
            cost = ""
            if cap_spec.gpu_price_per_hour is not None:
                cost = (f", {r.cost_per_hour:,.2f}/hour: per million tokens {r.cost_per_million_input_tokens:,.3f} "
                        f"input, {r.cost_per_million_output_tokens:,.3f} output, "
                        f"{r.cost_per_million_total_tokens:,.3f} total")
            lines.append(f"- **{labels[r.grid_point]}**: {int(r.replicas)} replicas ({int(r.gpus)} GPUs) at "
                         f"{r.capacity_rps_per_replica:,.3g} requests/s each{cost}." + (f" {r.note}." if r.note else "")
                         + _check_sentence(r, res.spec, cap_spec))
        show = [c for c in ("policy", "capacity_rps_per_replica", "replicas", "gpus", "utilization",
                            "input_tok_per_s", "output_tok_per_s", "prefill_time_share", "cost_per_hour",
                            "cost_per_million_input_tokens", "cost_per_million_output_tokens",
                            "cost_per_million_total_tokens", "target_rps_mean", "replicas_at_mean",
                            "gpu_hours_peak", "gpu_hours_mean", "gpu_hours_following",
                            "check_autoscaled_gpu_hours", "check_autoscaled_slo_attainment", "check_peak_gpu_hours",
                            "check_peak_slo_attainment", "check_mean_gpu_hours", "check_mean_slo_attainment",
                            "check_meets_slo", *[f"check_{m}" for m, _ in res.spec.slo_ms]) if c in cap.columns]
        t = cap.copy()
        t["policy"] = [labels[g] for g in t["grid_point"]]
        lines += ["", md_table(t[show]), "", f"Capacity basis: {cap['capacity_basis'].iloc[0]}.", ""]
    lines += ["## Figures", ""] + [f"![{p.stem}](plots/{p.name})" for p in made] + [""]
    return "\n".join(lines)


def _check_sentence(r, spec, cap_spec) -> str:
    """The simulated check of one planned cluster, in words ('' when it was not run)."""
    ok = getattr(r, "check_meets_slo", None)
    if ok is None or (isinstance(ok, float) and math.isnan(ok)):
        return ""
    if getattr(cap_spec, "target_profile", None) is not None:   # a time-varying target: three fleets
        return check_sentence(r, spec, cap_spec)
    vals = ", ".join(f"{pretty_metric(m)} {getattr(r, f'check_{m}'):,.0f} ms" for m, _ in spec.slo_ms)
    verdict = "meets the SLO" if ok else "**misses the SLO**: plan more replicas or more headroom"
    return (f" Check: {int(r.replicas)} simulated replicas behind {r.check_router} at {cap_spec.target_rps:g} "
            f"requests/s give {vals}: {verdict}.")

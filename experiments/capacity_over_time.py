"""A capacity plan for a load that changes over time: `capacity.target_rps` as a rate shape (the arrival
rate shapes of workloads/rates.py: stages, ramp, spike, diurnal, a trace scaled to a peak).

From one replica's SLO capacity (the search's answer) the plan states, over one span of the shape (a
period of a periodic one): the replicas the rate needs over time and at its peak, and the GPU-hours and cost
of three fleets: provisioned for the peak, provisioned for the mean, and following the need (replicas
that appear the moment the rate needs them: the lower bound an autoscaler approaches). With `verify` it
then simulates the span three times, at the shape's own arrivals, as `autoscaling:` points
(experiments/autoscaling_run.py): autoscaled between the need at the trough and at the peak (the scaler of
`capacity.autoscaling`), fixed at the peak need, fixed at the mean need; each reports its GPU-hours, cost,
replicas over time and SLO attainment per hour, as an `autoscaling:` sweep point does. Ignored by the
planned figures: start-up lag and bursts (the simulated check has both).
"""
from __future__ import annotations

import copy
import math

import numpy as np

from experiments.autoscaling_config import OPTIONAL, parse_autoscaling
from experiments.configcheck import ConfigError, check_keys
from workloads.errors import WorkloadError
from workloads.rates import RateProfile, parse_rate_profile

# The check's scaler unless `capacity.autoscaling` says otherwise: the p99 TTFT of the last minute, as in
# examples/autoscaling.yaml (a chunked-prefill engine admits its backlog into running prefills, so its queue
# says little), with Kubernetes HPA's 15 s look.
DEFAULT_SCALER = {"signal": "ttft_p99_s", "scale_up_above": 1.0, "scale_down_below": 0.25, "window_s": 60,
                  "interval_s": 15, "cooldown_s": 60}
SCALER_KEYS = {"signal", "scale_up_above", "scale_down_below"} | set(OPTIONAL) - {"gpu_price_per_hour"}
FLEETS = ("autoscaled", "peak", "mean")
NEED_SAMPLES = 2000   # rate samples per span for the need over time (a step function of a smooth rate)


def parse_target(value) -> RateProfile | None:
    """None for a number (a fixed target), else the shape, checked (one line naming the key)."""
    if not isinstance(value, dict):
        return None
    try:
        return parse_rate_profile(value, "capacity.target_rps")
    except WorkloadError as e:
        raise ConfigError(str(e)) from None


def parse_scaler(spec) -> dict:
    """`capacity.autoscaling`: the check's autoscaler (the `autoscaling:` keys but the replica bounds, which
    the plan sets), over DEFAULT_SCALER."""
    if spec is None:
        return dict(DEFAULT_SCALER)
    if not isinstance(spec, dict):
        raise ConfigError("capacity.autoscaling: expected a mapping like {signal: ttft_p99_s, scale_up_above: 1}")
    check_keys("capacity.autoscaling", spec, SCALER_KEYS)
    merged = {**DEFAULT_SCALER, **spec} if "signal" not in spec else {**spec}
    if "signal" in spec and not {"scale_up_above", "scale_down_below"} <= set(spec):
        raise ConfigError("capacity.autoscaling.scale_up_above: required with a signal (and scale_down_below)")
    try:   # the `autoscaling:` section's own rules
        parse_autoscaling({**merged, "min_replicas": 1, "max_replicas": 1}, None)
    except ConfigError as e:
        raise ConfigError(str(e).replace("autoscaling.", "capacity.autoscaling.", 1)) from None
    return merged


def need_over_time(profile: RateProfile, replicas_for) -> tuple[np.ndarray, np.ndarray]:
    """(times, replicas needed from each time on) over one span, at NEED_SAMPLES even samples."""
    t = np.linspace(0.0, profile.span_s, NEED_SAMPLES, endpoint=False)
    return t, np.array([replicas_for(float(r)) or 0 for r in profile.rate_at(t)])


def timeline_text(t: np.ndarray, n: np.ndarray) -> str:
    """'time:replicas' at each change (as the autoscaler's replica_timeline)."""
    keep = np.r_[True, n[1:] != n[:-1]]
    return " ".join(f"{x:g}:{int(v)}" for x, v in zip(np.round(t[keep], 1), n[keep]))


def profile_columns(profile: RateProfile, replicas_for, gpus_per_replica: int, price: float | None) -> dict:
    """The plan's columns for a shape, from `replicas_for(rate)` (the replicas a fixed rate needs)."""
    hours = profile.span_s / 3600
    peak, mean = replicas_for(profile.peak_rate_per_s), replicas_for(profile.mean_rate_per_s)
    t, n = need_over_time(profile, replicas_for)
    out = {"target_rps_mean": profile.mean_rate_per_s, "target_rps_peak": profile.peak_rate_per_s,
           "span_hours": hours, "replicas_at_mean": mean, "replicas_at_trough": int(n.min()) if len(n) else None,
           "replicas_over_time": timeline_text(t, n)}
    fleets = {"peak": peak, "mean": mean}
    for fleet, k in fleets.items():
        out[f"gpu_hours_{fleet}"] = k * gpus_per_replica * hours if k is not None else math.nan
    out["gpu_hours_following"] = float(n.mean()) * gpus_per_replica * hours if peak is not None else math.nan
    if price is not None:
        for fleet in ("peak", "mean", "following"):
            out[f"cost_{fleet}"] = out[f"gpu_hours_{fleet}"] * price
    return out


def fleet_configs(raw: dict, row, spec, slo_ms) -> dict[str, dict]:
    """The check's three simulations of one planned grid point, as sweep points: one span of the shape's
    arrivals behind `spec.router`, autoscaled between the trough's and the peak's need, fixed at each."""
    base = copy.deepcopy(raw)
    base.pop("cluster", None)
    base["cluster"] = {"router": spec.router}
    w = base["workload"]
    w["arrival"] = {**w["arrival"], "rate_per_s": copy.deepcopy(spec.target_profile.spec)}
    w["num_requests"] = max(1, int(round(spec.target_profile.mean_rate_per_s * spec.target_profile.span_s)))
    peak = int(row["replicas"])
    mean = int(row["replicas_at_mean"]) if row["replicas_at_mean"] is not None else peak
    low = max(1, min(int(row["replicas_at_trough"] or 1), peak))
    bounds = {"autoscaled": (low, peak), "peak": (peak, peak), "mean": (mean, mean)}
    if "slo" not in base:   # SLO attainment per request, from the search's limits
        base["slo"] = per_request_slo(slo_ms)
    out = {}
    for fleet, (lo, hi) in bounds.items():
        cfg = copy.deepcopy(base)
        cfg["autoscaling"] = {**spec.scaler, "min_replicas": lo, "max_replicas": hi,
                              **({"gpu_price_per_hour": spec.gpu_price_per_hour}
                                 if spec.gpu_price_per_hour is not None else {})}
        out[fleet] = cfg
    return out


def per_request_slo(slo_ms) -> dict:
    """The sweep's `slo:` (per request) from the search's percentile limits: each family's tightest."""
    out: dict[str, float] = {}
    for metric, limit in slo_ms:
        key = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "tpot_ms", "e2e": "e2e_ms"}.get(metric.split("_")[0])
        if key is not None:
            out[key] = min(limit, out.get(key, math.inf))
    return out


CHECK_KEYS = ("gpu_hours", "cost", "replicas_mean", "replicas_peak", "replica_timeline", "slo_attainment",
              "slo_attainment_by_hour", "num_rejected")


def evaluate_fleet(cfg: dict, seed: int, metrics: tuple[str, ...]) -> dict:
    """One simulated fleet (runs on a worker): its autoscaling keys and the search's metrics over the span."""
    from experiments.simulate import simulate
    summary = simulate(cfg, seed).summary
    return {k: summary.get(k, math.nan) for k in (*CHECK_KEYS, *metrics)}


def verify_over_time(res, cap, spec, out, jobs, dask_address):
    """`capacity.verify` for a shape: each planned grid point's three fleets simulated over one span
    (saved under capacity/ and reused on a rerun, as the fixed-target check's are); columns
    check_<fleet>_<key> for FLEETS x CHECK_KEYS and the search's metrics, and check_meets_slo (the autoscaled
    fleet's whole span against the search's limits)."""
    import pandas as pd

    from experiments.executors import open_executor
    from experiments.search_run import evaluation_key, read_saved, save_evaluation
    by_id = {f"g{p.index:03d}": p for p in res.grid_points}
    seed = int(res.points["seed"].iloc[0])
    metrics = tuple(m for m, _ in res.spec.slo_ms)
    tasks, found = {}, {}
    for i, r in cap.iterrows():
        if r["replicas"] is None or pd.isna(r["replicas"]):
            continue
        for fleet, cfg in fleet_configs(by_id[r["grid_point"]].raw, r, spec, res.spec.slo_ms).items():
            f = out / "capacity" / f"{r['grid_point']}-{fleet}-over-time.json"
            h = evaluation_key(cfg, res.spec, seed, "capacity-over-time")
            cached = read_saved(f)
            if cached is not None and cached.get("config_hash") == h:
                found[i, fleet] = cached["metrics"]
            else:
                tasks[i, fleet] = (cfg, f, h)
    if tasks:
        with open_executor(jobs, dask_address, len(tasks)) as (pool, _):
            futures = {k: pool.submit(evaluate_fleet, cfg, seed, metrics) for k, (cfg, _, _) in tasks.items()}
            for k, fut in futures.items():
                found[k] = fut.result()
                save_evaluation(tasks[k][1], {"config_hash": tasks[k][2], "metrics": found[k]})
    cap = cap.copy()
    cap["check_router"] = [spec.router if (i, "peak") in found else None for i in cap.index]
    for fleet in FLEETS:
        for k in (*CHECK_KEYS, *metrics):
            cap[f"check_{fleet}_{k}"] = [found[i, fleet].get(k) if (i, fleet) in found else None for i in cap.index]
    cap["check_meets_slo"] = [res.spec.meets_slo(found[i, "autoscaled"]) if (i, "autoscaled") in found else None
                              for i in cap.index]
    return cap


def check_sentence(r, spec, cap_spec) -> str:
    """The simulated check of a shape's three fleets, in words (summary.md), for one capacity.csv row."""
    from experiments.search import pretty_metric
    parts = []
    for fleet, words in (("autoscaled", f"autoscaled {int(r.replicas_at_trough or 1)}-{int(r.replicas)}"),
                         ("peak", f"fixed at the peak need ({int(r.replicas)})"),
                         ("mean", f"fixed at the mean need ({int(r.replicas_at_mean)})")):
        hours, share = getattr(r, f"check_{fleet}_gpu_hours", None), getattr(r, f"check_{fleet}_slo_attainment", None)
        if hours is None or hours != hours:
            continue
        vals = ", ".join(f"{pretty_metric(m)} {getattr(r, f'check_{fleet}_{m}'):,.0f} ms" for m, _ in spec.slo_ms)
        parts.append(f"{words}: {hours:,.2f} GPU-hours, {share:.1%} of requests within the SLO ({vals})")
    if not parts:
        return ""
    verdict = "meets the SLO" if r.check_meets_slo else "**misses the SLO**"
    return (f" Check over one span of the target ({r.span_hours:g} h, mean {r.target_rps_mean:g} and peak "
            f"{r.target_rps_peak:g} requests/s, behind {r.check_router}): " + "; ".join(parts)
            + f". The autoscaled fleet {verdict} over the span.")

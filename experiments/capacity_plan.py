"""Capacity plan: replicas, GPUs and cost to serve a target load within the SLO, per policy and configuration.

Per-replica capacity is what the SLO search found: the largest open-loop arrival rate (search over
`workload.arrival.rate_per_s`) whose latency meets the SLO on one replica, for the sweep's traffic shape.
A load balancer that sends each request to a random replica splits Poisson traffic into Poisson traffic
at 1/replicas of the rate, so one replica's answer carries over. Headroom keeps each replica at or below
(1 - headroom) of that capacity. Ignored: routing smarter than random (it helps a little), prefix-cache
affinity, autoscaling lag, and bursts of gamma traffic (splitting thins them, so the plan is conservative).
A search over concurrency has no arrival rate; its closed-loop throughput at the answer stands in, and
the table says so. With `verify` (the default), experiments.search_and_plan then simulates each planned cluster at the
target load behind a real router and reports whether it meets the SLO.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from experiments.capacity_over_time import parse_scaler, parse_target, profile_columns
from experiments.config import ConfigError, check_keys, number
from policies.routers import ROUTERS
from workloads.rates import RateProfile

CAPACITY_KEYS = {"target_rps", "gpu_price_per_hour", "headroom", "verify", "router", "autoscaling"}


@dataclass(frozen=True)
class CapacitySpec:
    target_rps: float
    gpu_price_per_hour: float | None = None   # currency per GPU-hour (e.g. USD)
    headroom: float = 0.2                     # each replica runs at <= (1 - headroom) of its SLO capacity
    verify: bool = True                       # simulate the planned cluster at the target load
    router: str = "round_robin"               # the load balancer used for that check (policies/routers.py)
    # A time-varying target (experiments/capacity_over_time.py): its shape (target_rps is then its peak)
    # and the simulated check's autoscaler.
    target_profile: RateProfile | None = None
    scaler: dict | None = None


def parse_capacity(spec) -> CapacitySpec:
    if not isinstance(spec, dict):
        raise ConfigError("capacity: expected a mapping like {target_rps: 50, gpu_price_per_hour: 2.5}")
    check_keys("capacity", spec, CAPACITY_KEYS)
    if "target_rps" not in spec:
        raise ConfigError("capacity.target_rps: required (the load to plan for, requests/s)")
    profile = parse_target(spec["target_rps"])
    out = {k: number(f"capacity.{k}", spec[k], strict=True) for k in ("target_rps", "gpu_price_per_hour")
           if k in spec and not (k == "target_rps" and profile is not None)}
    if profile is not None:
        out.update(target_rps=profile.peak_rate_per_s, target_profile=profile,
                   scaler=parse_scaler(spec.get("autoscaling")))
    elif "autoscaling" in spec:
        raise ConfigError("capacity.autoscaling: only with a time-varying target_rps (a rate shape)")
    h = number("capacity.headroom", spec.get("headroom", 0.2))
    if h >= 1:
        raise ConfigError(f"capacity.headroom: expected a fraction in [0, 1), got {h!r}")
    v = spec.get("verify", True)
    if not isinstance(v, bool):
        raise ConfigError(f"capacity.verify: expected true or false, got {v!r}")
    router = spec.get("router", "round_robin")
    if router not in ROUTERS:
        raise ConfigError(f"capacity.router: unknown router {router!r}; known: {', '.join(ROUTERS)}")
    return CapacitySpec(headroom=float(h), verify=v, router=router, **out)


def replicas_needed(target_rps: float, capacity_rps: float, headroom: float) -> int | None:
    """Smallest replica count that keeps every replica at <= (1 - headroom) of its capacity; None if none can."""
    if not capacity_rps or not math.isfinite(capacity_rps) or capacity_rps <= 0:
        return None
    return max(1, math.ceil(target_rps / (capacity_rps * (1 - headroom)) - 1e-9))


def plan(searches: pd.DataFrame, over: str, tp_by_point: dict[str, int], spec: CapacitySpec,
         config_columns: list[str]) -> pd.DataFrame:
    """One row per searched grid point. `tp_by_point`: grid_point -> tensor_parallel_size (GPUs/replica)."""
    rows = []
    by_rate = over.endswith("rate_per_s")
    for _, s in searches.iterrows():
        cap = s["max_value"] if by_rate else s["throughput_rps"]
        if s["status"] == "above_range":
            basis_note = "capacity is at least this (the search range ended first): the plan may overprovision"
        elif s["status"] == "infeasible":
            basis_note = "no load meets the SLO on one replica: adding replicas cannot fix latency"
            cap = math.nan
        else:
            basis_note = ""
        rps = s["throughput_rps"]
        tok_per_req = s["output_tok_per_s"] / rps if rps else math.nan
        in_per_req = s.get("input_tok_per_s", math.nan) / rps if rps else math.nan
        n = replicas_needed(spec.target_rps, cap, spec.headroom)
        tp = int(tp_by_point[s["grid_point"]])
        gpus = n * tp if n is not None else None
        row = {"grid_point": s["grid_point"], **{c: s[c] for c in config_columns if c in s}, "policy": s["policy"],
               "capacity_rps_per_replica": cap,
               "capacity_basis": ("open-loop arrival rate meeting the SLO" if by_rate else
                                  "closed-loop throughput at the max concurrency (no arrival bursts)"),
               "target_rps": spec.target_rps, "headroom": spec.headroom, "replicas": n,
               "tensor_parallel_size": tp, "gpus": gpus,
               "utilization": spec.target_rps / (n * cap) if n else math.nan,
               "input_tokens_per_request": in_per_req, "output_tokens_per_request": tok_per_req,
               "input_tok_per_s": spec.target_rps * in_per_req, "output_tok_per_s": spec.target_rps * tok_per_req,
               "prefill_time_share": s.get("prefill_time_share", math.nan),
               "saturation_rps_per_replica": s.get("saturation_rps", math.nan)}
        if spec.gpu_price_per_hour is not None:
            row.update(token_costs(gpus * spec.gpu_price_per_hour if gpus is not None else math.nan,
                                   spec.target_rps, in_per_req, tok_per_req))
        if spec.target_profile is not None:   # the rate over time: replicas over time, three fleets' cost
            row.update(profile_columns(spec.target_profile, lambda r: replicas_needed(r, cap, spec.headroom), tp,
                                       spec.gpu_price_per_hour))
        row["note"] = basis_note
        row["cost_model_basis"] = s.get("cost_model_basis", "")
        rows.append(row)
    return pd.DataFrame(rows)


def token_costs(cost_per_hour: float, rps: float, input_per_request: float, output_per_request: float) -> dict:
    """The hour's price spread over the tokens served in it: per million input (prompt), output and total
    tokens. Each is the whole GPU cost over one side's tokens, so the input and output figures are not
    shares that add up: a prompt-heavy workload (code completion) is best read by the input one."""
    def per_million(tokens_per_request):
        per_hour = rps * tokens_per_request * 3600
        return cost_per_hour / per_hour * 1e6 if per_hour > 0 else math.nan
    return {"cost_per_hour": cost_per_hour,
            "cost_per_million_input_tokens": per_million(input_per_request),
            "cost_per_million_output_tokens": per_million(output_per_request),
            "cost_per_million_total_tokens": per_million(input_per_request + output_per_request)}


def replicas_curve(capacity_rps: float, headroom: float, max_rps: float, num: int = 200) -> tuple[list, list]:
    """(target loads, replicas) for the capacity plot: a staircase from 0 to `max_rps`."""
    xs = [max_rps * i / num for i in range(1, num + 1)]
    return xs, [replicas_needed(x, capacity_rps, headroom) for x in xs]

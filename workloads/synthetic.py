"""Synthetic traffic: open-loop arrivals (Poisson, gamma with a chosen CV) or closed-loop users, with
independent seeded streams for arrival times, prompt lengths and output lengths."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from simcore.request import RequestSpec
from workloads.distributions import LengthDist, parse_length_dist
from workloads.errors import WorkloadError
from workloads.traces import TraceWorkload, parse_trace_workload, trace_specs

PROCESSES = ("poisson", "gamma", "closed")


@dataclass(frozen=True)
class Arrival:
    """`poisson`/`gamma`: open loop at `rate_per_s` (inf: everything at t = 0), gamma inter-arrivals with
    coefficient of variation `cv` (cv = 1 is Poisson, > 1 bursty). `closed`: `concurrency` users, each
    sending its next request `think_time_s` after its previous one finishes."""
    process: str
    rate_per_s: float | None = None
    cv: float = 1.0
    concurrency: int | None = None
    think_time_s: float = 0.0

    @property
    def is_closed(self) -> bool:
        return self.process == "closed"


@dataclass(frozen=True)
class Workload:
    num_requests: int
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist


@dataclass(frozen=True)
class GeneratedRequests:
    specs: tuple[RequestSpec, ...]   # arrival_s is 0 for closed-loop traffic (set when a user sends it)
    num_clipped_prompts: int         # prompts cut to max_model_len - 1
    num_clipped_outputs: int         # outputs cut so prompt + output <= max_model_len


_ARRIVAL_KEYS = {"poisson": {"rate_per_s"}, "gamma": {"rate_per_s", "cv"}, "closed": {"concurrency", "think_time_s"}}


def parse_arrival(spec, key: str = "workload.arrival") -> Arrival:
    if not isinstance(spec, dict) or spec.get("process") not in PROCESSES:
        raise WorkloadError(f"{key}.process: must be one of {', '.join(PROCESSES)}")
    process = spec["process"]
    allowed = _ARRIVAL_KEYS[process]
    for k, v in spec.items():
        if k == "process":
            continue
        if k not in allowed:
            raise WorkloadError(f"{key}.{k}: not a key of process {process}; expected {', '.join(sorted(allowed))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (v == 0 and k != "think_time_s"):
            raise WorkloadError(f"{key}.{k}: must be a positive number, got {v!r}")
    if process == "closed":
        c = spec.get("concurrency")
        if c is None or int(c) != c:
            raise WorkloadError(f"{key}.concurrency: closed-loop traffic needs an integer number of users")
        return Arrival("closed", concurrency=int(c), think_time_s=float(spec.get("think_time_s", 0.0)))
    if "rate_per_s" not in spec:
        raise WorkloadError(f"{key}.rate_per_s: required for process {process}")
    return Arrival(process, rate_per_s=float(spec["rate_per_s"]), cv=float(spec.get("cv", 1.0)))


def parse_workload(spec, key: str = "workload") -> Workload | TraceWorkload:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping")
    if "trace" in spec:  # trace replay (workloads/traces.py)
        if extra := sorted(set(spec) - {"trace"}):
            raise WorkloadError(f"{key}.{extra[0]}: not used with a trace (put replay options under {key}.trace)")
        return parse_trace_workload(spec["trace"], f"{key}.trace")
    allowed = {"num_requests", "arrival", "prompt_tokens", "output_tokens"}
    for k in spec:
        if k not in allowed:
            raise WorkloadError(f"{key}.{k}: unknown key; expected {', '.join(sorted(allowed))}")
    for k in sorted(allowed):
        if k not in spec:
            raise WorkloadError(f"{key}.{k}: required")
    n = spec["num_requests"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise WorkloadError(f"{key}.num_requests: must be a positive integer, got {n!r}")
    return Workload(n, parse_arrival(spec["arrival"], f"{key}.arrival"),
                    parse_length_dist(spec["prompt_tokens"], f"{key}.prompt_tokens"),
                    parse_length_dist(spec["output_tokens"], f"{key}.output_tokens"))


def arrival_times_s(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if arrival.is_closed:
        return np.zeros(n)
    if np.isinf(arrival.rate_per_s):
        return np.zeros(n)
    mean_gap = 1.0 / arrival.rate_per_s
    if arrival.process == "poisson" or arrival.cv == 1.0:
        gaps = rng.exponential(mean_gap, size=n)
    else:  # gamma with shape k = 1/cv^2 keeps the mean and sets the CV (vllm bench --burstiness = k)
        k = 1.0 / arrival.cv**2
        gaps = rng.gamma(k, mean_gap / k, size=n)
    return np.cumsum(gaps)


def generate(workload: Workload | TraceWorkload, seed: int, max_model_len: int,
             block_size: int = 16) -> GeneratedRequests:
    """Draw the requests. Streams: arrivals, prompt lengths and output lengths are independent, so
    changing one distribution does not reshuffle the others. A trace is replayed as logged; prefix-block
    ids are expressed in `block_size`-token engine blocks."""
    if isinstance(workload, TraceWorkload):
        return trace_specs(workload, max_model_len, block_size)
    arrival_rng, prompt_rng, output_rng = np.random.default_rng(seed).spawn(3)
    n = workload.num_requests
    times = arrival_times_s(workload.arrival, n, arrival_rng)
    prompts = workload.prompt_tokens.sample(prompt_rng, n)
    outputs = workload.output_tokens.sample(output_rng, n)
    # Clip only to the model's hard limits, and count it.
    clipped_p = prompts > max_model_len - 1
    prompts = np.minimum(prompts, max_model_len - 1)
    clipped_o = outputs > max_model_len - prompts
    outputs = np.minimum(outputs, max_model_len - prompts)
    max_new = workload.output_tokens.max_value
    specs = tuple(
        RequestSpec(i, float(t), int(p), int(o), None if max_new is None else max(int(o), min(max_new, max_model_len - int(p))))
        for i, (t, p, o) in enumerate(zip(times, prompts, outputs)))
    return GeneratedRequests(specs, int(clipped_p.sum()), int(clipped_o.sum()))


def describe_workload(w: Workload | TraceWorkload) -> dict:
    """The workload as recorded with results (resolved.yaml)."""
    if isinstance(w, TraceWorkload):
        return {"trace": {k: v for k, v in dataclasses.asdict(w).items() if v is not None}}
    return {"num_requests": w.num_requests, "arrival": dataclasses.asdict(w.arrival),
            "prompt_tokens": {"dist": w.prompt_tokens.dist, **dict(w.prompt_tokens.params)},
            "output_tokens": {"dist": w.output_tokens.dist, **dict(w.output_tokens.params)}}

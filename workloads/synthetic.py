"""Synthetic traffic: open-loop arrivals (Poisson, gamma with a chosen CV) or closed-loop users, with
independent seeded streams for arrival times, prompt lengths and output lengths."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.request import RequestSpec
from workloads.distributions import LengthDist, parse_length_dist
from workloads.errors import WorkloadError

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
class PriorityMix:
    """Priority classes (lower value = served first, as vLLM) drawn independently per request with
    the given weights (normalised)."""
    classes: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class Workload:
    num_requests: int
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    priority: PriorityMix | None = None  # None: every request has priority 0


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


def parse_priority(spec, key: str = "workload.priority") -> PriorityMix:
    """`{classes: [0, 1], weights: [0.2, 0.8]}`; weights may be omitted (equal shares)."""
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping with classes and weights")
    for k in spec:
        if k not in ("classes", "weights"):
            raise WorkloadError(f"{key}.{k}: unknown key; expected classes, weights")
    classes = spec.get("classes")
    if (not isinstance(classes, list) or not classes
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in classes)):
        raise WorkloadError(f"{key}.classes: expected a non-empty list of integers, got {classes!r}")
    if len(set(classes)) != len(classes):
        raise WorkloadError(f"{key}.classes: repeated class in {classes}")
    weights = spec.get("weights", [1.0] * len(classes))
    if (not isinstance(weights, list) or len(weights) != len(classes)
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and np.isfinite(w) and w >= 0
                       for w in weights) or sum(weights) <= 0):
        raise WorkloadError(f"{key}.weights: expected {len(classes)} non-negative numbers with a positive sum, "
                            f"got {weights!r}")
    total = float(sum(weights))
    return PriorityMix(tuple(classes), tuple(float(w) / total for w in weights))


def parse_workload(spec, key: str = "workload") -> Workload:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping")
    allowed = {"num_requests", "arrival", "prompt_tokens", "output_tokens"}
    for k in spec:
        if k not in allowed | {"priority"}:
            raise WorkloadError(f"{key}.{k}: unknown key; expected {', '.join(sorted(allowed | {'priority'}))}")
    for k in sorted(allowed):
        if k not in spec:
            raise WorkloadError(f"{key}.{k}: required")
    n = spec["num_requests"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise WorkloadError(f"{key}.num_requests: must be a positive integer, got {n!r}")
    priority = parse_priority(spec["priority"], f"{key}.priority") if spec.get("priority") is not None else None
    return Workload(n, parse_arrival(spec["arrival"], f"{key}.arrival"),
                    parse_length_dist(spec["prompt_tokens"], f"{key}.prompt_tokens"),
                    parse_length_dist(spec["output_tokens"], f"{key}.output_tokens"), priority)


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


def generate(workload: Workload, seed: int, max_model_len: int) -> GeneratedRequests:
    """Draw the requests. Streams: arrivals, prompt lengths and output lengths are independent, so
    changing one distribution does not reshuffle the others (priorities use a fourth stream; spawned
    children do not depend on how many are spawned, so adding it left the first three unchanged)."""
    arrival_rng, prompt_rng, output_rng, priority_rng = np.random.default_rng(seed).spawn(4)
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
    mix = workload.priority
    priorities = (priority_rng.choice(np.asarray(mix.classes), size=n, p=np.asarray(mix.weights))
                  if mix is not None else np.zeros(n, dtype=np.int64))
    specs = tuple(
        RequestSpec(i, float(t), int(p), int(o), None if max_new is None else max(int(o), min(max_new, max_model_len - int(p))),
                    priority=int(c))
        for i, (t, p, o, c) in enumerate(zip(times, prompts, outputs, priorities)))
    return GeneratedRequests(specs, int(clipped_p.sum()), int(clipped_o.sum()))

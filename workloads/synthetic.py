"""Synthetic traffic: open-loop arrivals (Poisson, gamma with a chosen CV) or closed-loop users, with
independent seeded streams for arrival times, prompt lengths and output lengths."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from simcore.kvcache import DEFAULT_BLOCK_SIZE
from simcore.request import RequestSpecs
from workloads.distributions import LengthDist, parse_length_dist
from workloads.errors import WorkloadError, check_keys, finite_number
from workloads.rates import arrival_times_s as profile_arrival_times_s
from workloads.rates import parse_rate_profile
from workloads.prefix import (RequestClass, Sessions, SharedPrefix, parse_mix, parse_sessions,
                              parse_shared_prefix, prefix_block_ids, sample_mix, session_layout)
from workloads.requests import (LONG_PROMPTS, OPEN_LOOP_PROCESSES, PROCESSES, Arrival, GeneratedRequests,  # noqa: F401
                               clip_to_model, parse_long_prompts)
from workloads.traces import TraceWorkload, parse_trace_workload, trace_specs


@dataclass(frozen=True)
class PriorityMix:
    """Priority classes (lower value = served first, as vLLM) drawn independently per request with
    the given weights (normalised)."""
    classes: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class Workload:
    """`prompt_tokens`/`output_tokens` are None when `mix` gives per-class lengths (workloads/prefix.py,
    which also defines `shared_prefix` and `sessions`)."""
    num_requests: int
    arrival: Arrival
    prompt_tokens: LengthDist | None
    output_tokens: LengthDist | None
    priority: PriorityMix | None = None  # None: every request has priority 0
    shared_prefix: SharedPrefix | None = None
    sessions: Sessions | None = None
    mix: tuple[RequestClass, ...] | None = None
    long_prompts: str = "reject"  # LONG_PROMPTS: the engine rejects a prompt >= max_model_len, or it is cut


_ARRIVAL_KEYS = {"poisson": {"rate_per_s"}, "gamma": {"rate_per_s", "cv"}, "constant": {"rate_per_s"},
                 "closed": {"concurrency", "think_time_s"}}


def parse_arrival(spec, key: str = "workload.arrival") -> Arrival:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping like {{process: poisson, rate_per_s: 4}}")
    if spec.get("process") not in PROCESSES:
        raise WorkloadError(f"{key}.process: expected one of {', '.join(PROCESSES)}, got {spec.get('process')!r}")
    process = spec["process"]
    allowed = _ARRIVAL_KEYS[process]
    for k in spec:
        if k != "process" and k not in allowed:
            raise WorkloadError(f"{key}.{k}: not a key of process {process}; expected {', '.join(sorted(allowed))}")
    if process == "closed":
        if "concurrency" not in spec:
            raise WorkloadError(f"{key}.concurrency: required for process closed (the number of users)")
        c = finite_number(f"{key}.concurrency", spec["concurrency"], minimum=1, integer=True)
        think = finite_number(f"{key}.think_time_s", spec.get("think_time_s", 0.0))
        return Arrival("closed", concurrency=c, think_time_s=think)
    if "rate_per_s" not in spec:
        raise WorkloadError(f"{key}.rate_per_s: required for process {process}")
    if isinstance(spec["rate_per_s"], dict):   # a rate that changes over time (workloads/rates.py)
        if process not in ("poisson", "constant"):
            raise WorkloadError(f"{key}.rate_per_s: a rate that changes over time needs process poisson or "
                                f"constant, got {process}")
        if "cv" in spec:
            raise WorkloadError(f"{key}.cv: not used with a rate that changes over time (process {process})")
        profile = parse_rate_profile(spec["rate_per_s"], f"{key}.rate_per_s")
        return Arrival(process, rate_per_s=profile.mean_rate_per_s, rate_profile=profile)
    rate = finite_number(f"{key}.rate_per_s", spec["rate_per_s"], strict=True, allow_inf=True)
    return Arrival(process, rate_per_s=rate, cv=finite_number(f"{key}.cv", spec.get("cv", 1.0), strict=True))


def parse_priority(spec, key: str = "workload.priority") -> PriorityMix:
    """`{classes: [0, 1], weights: [0.2, 0.8]}`; weights may be omitted (equal shares)."""
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping with classes and weights")
    check_keys(key, spec, {"classes", "weights"})
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


def parse_workload(spec, key: str = "workload") -> Workload | TraceWorkload:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{key}: expected a mapping")
    if "trace" in spec:  # trace replay (workloads/traces.py)
        if extra := sorted(set(spec) - {"trace"}):
            raise WorkloadError(f"{key}.{extra[0]}: not used with a trace (put replay options under {key}.trace)")
        return parse_trace_workload(spec["trace"], f"{key}.trace")
    required = {"num_requests", "arrival"} | ({"prompt_tokens", "output_tokens"} if "mix" not in spec else set())
    allowed = required | {"shared_prefix", "sessions", "mix", "long_prompts"} | (
        {"prompt_tokens"} if "sessions" in spec else set())
    check_keys(key, spec, allowed | {"priority"})
    for k in sorted(required):
        if k not in spec:
            raise WorkloadError(f"{key}.{k}: required")
    n = finite_number(f"{key}.num_requests", spec["num_requests"], minimum=1, integer=True)
    check_num_requests(f"{key}.num_requests", n)
    arrival = parse_arrival(spec["arrival"], f"{key}.arrival")
    long_prompts = parse_long_prompts(spec.get("long_prompts", "reject"), f"{key}.long_prompts")
    sessions = parse_sessions(spec["sessions"], f"{key}.sessions") if "sessions" in spec else None
    if sessions is not None and arrival.is_closed:
        raise WorkloadError(f"{key}.sessions: needs an open-loop arrival process ({', '.join(OPEN_LOOP_PROCESSES)})")
    if sessions is not None and "mix" in spec:
        raise WorkloadError(f"{key}.sessions: cannot be combined with {key}.mix")
    priority = parse_priority(spec["priority"], f"{key}.priority") if spec.get("priority") is not None else None
    dist = lambda k: parse_length_dist(spec[k], f"{key}.{k}") if k in spec else None  # noqa: E731
    return Workload(n, arrival, dist("prompt_tokens"), dist("output_tokens"), priority,
                    parse_shared_prefix(spec["shared_prefix"], f"{key}.shared_prefix") if "shared_prefix" in spec else None,
                    sessions, parse_mix(spec["mix"], f"{key}.mix") if "mix" in spec else None, long_prompts)


# Peak memory per simulated request on the fast path, rounded up (benchmarks.speed section 3 measures it;
# docs/speed.md); the SimPy engine needs more, so this bound only refuses runs that cannot fit at all.
BYTES_PER_REQUEST = 2048


def check_num_requests(key: str, n: int) -> None:
    """Refuse a run whose requests cannot fit this machine's memory (they are generated up front)."""
    import os
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound
        return
    if n * BYTES_PER_REQUEST > total:
        raise WorkloadError(f"{key}: {n:,} requests need about {n * BYTES_PER_REQUEST / 1e9:,.0f} GB of memory "
                            f"(~{BYTES_PER_REQUEST} bytes each) and this machine has {total / 1e9:,.0f} GB; "
                            f"use at most {total // BYTES_PER_REQUEST:,}")


def arrival_times_s(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if arrival.is_closed:
        return np.zeros(n)
    if arrival.rate_profile is not None:
        return profile_arrival_times_s(arrival.rate_profile, n, arrival.process, rng)
    if np.isinf(arrival.rate_per_s):
        return np.zeros(n)
    mean_gap = 1.0 / arrival.rate_per_s
    if arrival.process == "constant":  # evenly spaced, the first at t = 0 (GuideLLM, inference-perf)
        return np.arange(n) * mean_gap
    if arrival.process == "poisson" or arrival.cv == 1.0:
        gaps = rng.exponential(mean_gap, size=n)
    else:  # gamma with shape k = 1/cv^2 keeps the mean and sets the CV (vllm bench --burstiness = k)
        k = 1.0 / arrival.cv**2
        gaps = rng.gamma(k, mean_gap / k, size=n)
    return np.cumsum(gaps)


def generate(workload: Workload | TraceWorkload, seed: int, max_model_len: int,
             block_size: int = DEFAULT_BLOCK_SIZE) -> GeneratedRequests:
    """Draw the requests. Streams: arrivals, prompt lengths and output lengths are independent, so
    changing one distribution does not reshuffle the others (spawned children do not depend on how many
    are spawned: priorities, classes and system-prompt groups use streams 4-6 and leave the first three
    unchanged). A trace is replayed as logged; prefix-block ids are in `block_size`-token engine blocks."""
    if isinstance(workload, TraceWorkload):
        return trace_specs(workload, max_model_len, block_size)
    arrival_rng, prompt_rng, output_rng, priority_rng, class_rng, group_rng = np.random.default_rng(seed).spawn(6)
    n = workload.num_requests
    if workload.mix is not None:
        _, prompts, outputs, max_new = sample_mix(workload.mix, n, class_rng, prompt_rng, output_rng)
    else:
        prompts = workload.prompt_tokens.sample(prompt_rng, n)
        outputs = workload.output_tokens.sample(output_rng, n)
        max_new = np.full(n, workload.output_tokens.max_value or -1)
    sess = workload.sessions
    if sess is not None:  # session starts from the arrival process, turns laid out after them
        num_sessions = -(-n // sess.num_turns)
        times, prompts, session, _ = session_layout(arrival_times_s(workload.arrival, num_sessions, arrival_rng),
                                                    prompts, outputs, sess)
    else:
        times, session = arrival_times_s(workload.arrival, n, arrival_rng), None
    sp = workload.shared_prefix
    groups = group_rng.integers(sp.num_groups, size=n) if sp is not None else None
    if sp is not None:
        prompts = prompts + sp.prefix_tokens
    # Fit only the model's hard limits, and count it (too-long prompts are rejected unless asked to clip).
    prompts, outputs, clipped_p, clipped_o = clip_to_model(prompts, outputs, max_model_len, workload.long_prompts)
    mix = workload.priority
    priorities = (priority_rng.choice(np.asarray(mix.classes), size=n, p=np.asarray(mix.weights))
                  if mix is not None else np.zeros(n, dtype=np.int64))
    order = np.argsort(times, kind="stable")  # sessions interleave; ids follow arrival order
    prompts, outputs, max_new = prompts[order], outputs[order], max_new[order]
    ids = None
    if sp is not None or sess is not None:
        ids = [prefix_block_ids(int(p), block_size, None if groups is None else int(groups[j]),
                                sp.prefix_tokens if sp is not None else 0, None if session is None else int(session[j]))
               for p, j in zip(prompts.tolist(), order.tolist())]
    # max_new_tokens: the client's limit, fitted to the context (never below the output); absent where < 0
    fitted = np.maximum(outputs, np.minimum(max_new, np.maximum(1, max_model_len - prompts)))
    specs = RequestSpecs(times[order], prompts, outputs, np.ma.masked_array(fitted, mask=max_new < 0),
                         priorities[order], ids)
    return GeneratedRequests(specs, int(clipped_p.sum()), int(clipped_o.sum()))


def describe_workload(w: Workload | TraceWorkload) -> dict:
    """The workload as recorded with results (resolved.yaml)."""
    if isinstance(w, TraceWorkload):
        return {"trace": {k: v for k, v in dataclasses.asdict(w).items() if v is not None}}
    dist = lambda d: None if d is None else {"dist": d.dist, **dict(d.params)}  # noqa: E731
    arrival = {k: v for k, v in dataclasses.asdict(w.arrival).items() if k != "rate_profile"}
    if w.arrival.rate_profile is not None:   # as written, with its mean and peak
        p = w.arrival.rate_profile
        arrival.update(rate_per_s=p.spec, mean_rate_per_s=p.mean_rate_per_s, peak_rate_per_s=p.peak_rate_per_s)
    out = {"num_requests": w.num_requests, "arrival": arrival,
           "prompt_tokens": dist(w.prompt_tokens), "output_tokens": dist(w.output_tokens),
           "priority": dataclasses.asdict(w.priority) if w.priority else None}
    for k in ("shared_prefix", "sessions"):
        if getattr(w, k) is not None:
            out[k] = dataclasses.asdict(getattr(w, k))
    if w.mix is not None:
        out["mix"] = [{"name": c.name, "weight": c.weight, "prompt_tokens": dist(c.prompt_tokens),
                       "output_tokens": dist(c.output_tokens)} for c in w.mix]
    if w.long_prompts != "reject":
        out["long_prompts"] = w.long_prompts
    return {k: v for k, v in out.items() if v is not None}

"""SLO search: the largest load (closed-loop users or open-loop arrival rate) whose results meet every SLO.

The search brackets geometrically from the low end of the range, then bisects to a stated tolerance
(integers for concurrency), and finally probes a few values above the first failure so that a non-monotone
response shows up instead of hiding behind the bisection. A value passes only if the seeds agree under the
confidence rule. The algorithm is a plain generator (`bracket_then_bisect`) that yields the next value and
is sent back whether it passed, so it is tested without a simulator; `experiments.search_run` drives it.

Steady state: closed-loop users all send their first request at t = 0 and the last requests run while
users drop out, so by default the search measures latency on the requests in between (see
`steady_state_metrics`); the whole-run summary stays in the points table next to it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generator

import numpy as np
import pandas as pd

from experiments.config import ConfigError, check_keys, number
from simcore.metrics import stats_ms

OVER_KEYS = ("workload.arrival.concurrency", "workload.arrival.rate_per_s")
SLO_METRICS = tuple(f"{m}_p{p}_ms" for m in ("ttft", "itl", "tpot", "e2e") for p in (50, 90, 95, 99))
SEARCH_KEYS = {"over", "slo", "range", "tolerance", "rel_tolerance", "confidence", "growth", "verify_above",
               "warmup", "min_requests_per_user", "max_evaluations"}


@dataclass(frozen=True)
class SearchSpec:
    """A validated `search:` block. Values are in the unit of `over` (users or requests/s)."""
    over: str
    slo_ms: tuple[tuple[str, float], ...]   # (metric, limit in ms); a value must meet every one
    lo: float
    hi: float
    tolerance: float = 1.0          # stop once first-fail - best <= max(tolerance, rel_tolerance * best)
    rel_tolerance: float = 0.0
    confidence: str | float = "all"  # "all", "majority", or the fraction of seeds that must pass
    growth: float = 2.0             # bracketing multiplies the load by this until a value fails
    verify_above: int = 2           # extra probes above the first failure, to expose non-monotonicity
    warmup: str = "auto"            # "auto": closed loop drops each user's first and the last requests
    min_requests_per_user: int = 4  # closed loop: num_requests is raised to this many per user
    max_evaluations: int = 40       # distinct values, a safety stop

    @property
    def is_integer(self) -> bool:
        return self.over.endswith("concurrency")

    @property
    def unit(self) -> str:
        return "concurrent users" if self.is_integer else "requests/s"

    @property
    def slo_text(self) -> str:
        return " and ".join(f"{pretty_metric(m)} <= {v:g} ms" for m, v in self.slo_ms)

    @property
    def rule_text(self) -> str:
        rejected = " (a seed that rejected any request fails)"
        if self.confidence == "all":
            return "a load passes only if every seed meets every SLO" + rejected
        if self.confidence == "majority":
            return "a load passes if a strict majority of seeds meet every SLO" + rejected
        return f"a load passes if at least {self.confidence:.0%} of seeds meet every SLO" + rejected

    def seeds_pass(self, per_seed: list[bool]) -> bool:
        n, k = len(per_seed), sum(per_seed)
        if self.confidence == "all":
            return k == n
        if self.confidence == "majority":
            return 2 * k > n
        return k >= self.confidence * n - 1e-9

    def meets_slo(self, metrics: dict) -> bool:
        """NaN (no such samples, e.g. ITL with one-token outputs) counts as a miss: nothing was shown. A run
        that rejected any request misses too: its latencies describe only the survivors."""
        if metrics.get("run_num_rejected", 0):
            return False
        return all(metrics.get(m, math.nan) <= limit for m, limit in self.slo_ms)


def pretty_metric(metric: str) -> str:
    """'ttft_p99_ms' -> 'p99 TTFT'."""
    name, pct, _ = metric.split("_")
    return f"{pct} {name.upper()}"


def parse_search(spec) -> SearchSpec:
    """Validate the `search:` mapping; every error names the offending key."""
    if not isinstance(spec, dict):
        raise ConfigError("search: expected a mapping with over, slo and range")
    check_keys("search", spec, SEARCH_KEYS)
    for k in ("over", "slo", "range"):
        if k not in spec:
            raise ConfigError(f"search.{k}: required")
    over = spec["over"]
    if over not in OVER_KEYS:
        raise ConfigError(f"search.over: expected one of {', '.join(OVER_KEYS)}, got {over!r}")
    slo = spec["slo"]
    if not isinstance(slo, dict) or not slo:
        raise ConfigError("search.slo: expected a mapping like {ttft_p99_ms: 200}")
    for m, v in slo.items():
        if m not in SLO_METRICS:
            raise ConfigError(f"search.slo.{m}: unknown metric; expected one of {', '.join(SLO_METRICS)}")
        number(f"search.slo.{m}", v, strict=True)
    rng = spec["range"]
    if not isinstance(rng, list) or len(rng) != 2:
        raise ConfigError(f"search.range: expected [low, high], got {rng!r}")
    lo, hi = (number("search.range", v, strict=True) for v in rng)
    integer = over.endswith("concurrency")
    if integer and (lo != int(lo) or hi != int(hi)):
        raise ConfigError(f"search.range: concurrency is a whole number of users, got {rng!r}")
    if hi <= lo:
        raise ConfigError(f"search.range: high ({hi:g}) must exceed low ({lo:g})")
    kw = {}
    for k, positive in (("tolerance", True), ("rel_tolerance", False), ("growth", True)):
        if k in spec:
            kw[k] = number(f"search.{k}", spec[k], strict=positive)
    if not integer and "tolerance" not in spec:
        kw.setdefault("tolerance", 0.0)
        kw.setdefault("rel_tolerance", 0.02)  # rates: 2% of the answer
    if integer and kw.get("tolerance", 1) != int(kw.get("tolerance", 1)):
        raise ConfigError("search.tolerance: concurrency is searched in whole users; use an integer")
    if kw.get("growth", 2.0) <= 1:
        raise ConfigError("search.growth: must exceed 1")
    if kw.get("rel_tolerance", 0.0) >= 1:
        raise ConfigError("search.rel_tolerance: must be below 1")
    conf = spec.get("confidence", "all")
    if conf not in ("all", "majority") and (isinstance(conf, bool) or not isinstance(conf, (int, float))
                                            or not 0 < conf <= 1):
        raise ConfigError(f"search.confidence: expected all, majority or a fraction in (0, 1], got {conf!r}")
    for k, least in (("verify_above", 0), ("min_requests_per_user", 1), ("max_evaluations", 2)):
        if k in spec:
            kw[k] = number(f"search.{k}", spec[k], minimum=least, integer=True)
    warmup = spec.get("warmup", "auto")
    if warmup not in ("auto", "none"):
        raise ConfigError(f"search.warmup: expected auto or none, got {warmup!r}")
    if integer and warmup == "auto" and kw.get("min_requests_per_user", 4) < 3:
        raise ConfigError("search.min_requests_per_user: warmup auto drops 2 requests per user; use at least 3")
    return SearchSpec(over, tuple((m, float(v)) for m, v in slo.items()), lo, hi, confidence=conf,
                      warmup=warmup, **kw)


# ---- the algorithm ----

@dataclass(frozen=True)
class Outcome:
    """What a search found. `best` is None when even `lo` fails; `first_fail` is None when `hi` passes."""
    status: str                      # "ok", "infeasible" (lo misses), "above_range" (hi still meets the SLO),
    best: float | None               # or "max_evaluations" (stopped before the tolerance was reached)
    first_fail: float | None
    non_monotone: tuple[float, ...] = ()   # values that passed although a lower value had failed
    evaluated: dict = field(default_factory=dict)  # value -> passed, in evaluation order

    @property
    def message(self) -> str:
        notes = {"infeasible": "even the lowest value misses the SLO",
                 "above_range": "the highest value still meets the SLO (the maximum lies above the range)",
                 "max_evaluations": "stopped at max_evaluations before reaching the tolerance"}
        out = notes.get(self.status, "")
        if self.non_monotone:
            nm = ", ".join(f"{v:g}" for v in self.non_monotone)
            out = (out + "; " if out else "") + f"NON-MONOTONE: passes again at {nm} above the first failure"
        return out


def _snap(v: float, integer: bool) -> float:
    return float(math.floor(v)) if integer else float(v)


def bracket_then_bisect(spec: SearchSpec) -> Generator[float, bool, Outcome]:
    """Yields loads to evaluate; send back True when the load passed. Returns the Outcome."""
    lo, hi, integer = spec.lo, spec.hi, spec.is_integer
    seen: dict[float, bool] = {}

    def done(status, best, fail):
        nm = tuple(sorted(v for v, ok in seen.items() if ok and fail is not None and v > fail))
        return Outcome(status, best, fail, nm, dict(seen))

    seen[lo] = yield lo
    if not seen[lo]:
        return done("infeasible", None, lo)
    good, bad = lo, None
    while bad is None and good < hi:  # bracket: grow geometrically until a value fails or hi passes
        nxt = min(hi, _snap(good * spec.growth, integer))
        nxt = max(nxt, good + 1) if integer else nxt
        seen[nxt] = yield nxt
        good, bad = (nxt, None) if seen[nxt] else (good, nxt)
        if len(seen) >= spec.max_evaluations:
            return done("max_evaluations", good, bad)
    if bad is None:
        return done("above_range", good, None)
    while bad - good > max(spec.tolerance, spec.rel_tolerance * good):  # bisect
        mid = _snap((good + bad) / 2, integer)
        if mid <= good or mid >= bad:
            break
        seen[mid] = yield mid
        good, bad = (mid, bad) if seen[mid] else (good, mid)
        if len(seen) >= spec.max_evaluations:
            return done("max_evaluations", good, bad)
    for k in range(1, spec.verify_above + 1):  # look above the failure for a pass bisection cannot see
        v = min(hi, _snap(bad * (1 + (spec.growth - 1) * k / spec.verify_above), integer))
        if v > bad and v not in seen:
            seen[v] = yield v
    return done("ok", good, bad)


# ---- what one simulation says about the SLO ----

def steady_state_metrics(requests: pd.DataFrame, itl_gaps_s, itl_end_s, concurrency: int | None,
                         warmup: str = "auto", iterations: pd.DataFrame | None = None) -> dict:
    """Latency percentiles and throughput over the measured requests.

    Closed loop with warmup "auto": users send requests in id order, so ids [0, N) are each user's first
    request (all sent at t = 0, a burst no steady state has) and the last N ids run while users run out of
    work. Both are dropped; ITL and throughput count the window from the arrival of request N to the last
    send, when all N users are active (half-open: (t0, t1]). Otherwise every request and the whole run count.

    Both sides of the work: `input_tok_per_s` counts the prompts whose first token came in the window (a
    prompt is done when its first token is), `output_tok_per_s` the tokens made in it. With `iterations`,
    `prefill_time_share` is the share of the window's GPU time spent in steps that carry prefill tokens
    (mixed steps count as prefill: a chunked-prefill step is priced as one pass), the rest decode-only.
    """
    fin = requests[requests["status"] == "finished"]
    n = len(requests)
    gaps, ends = np.asarray(itl_gaps_s, dtype=float), np.asarray(itl_end_s, dtype=float)
    if concurrency and warmup == "auto" and n >= 3 * concurrency:
        ids = requests["request_id"]
        fin = fin[(fin["request_id"] >= concurrency) & (fin["request_id"] < n - concurrency)]
        t0 = float(requests.loc[ids == concurrency, "arrival_s"].iloc[0])
        t1 = float(requests["arrival_s"].max())
    else:
        t0 = 0.0
        t1 = float(max(requests["finish_s"].max(), ends.max() if ends.size else 0.0))
    in_win = (ends > t0) & (ends <= t1)  # half-open, so a burst exactly at t0 is not counted twice
    if ends.size != gaps.size:  # gap times unavailable: pool every gap rather than drop them
        in_win = np.ones(gaps.size, dtype=bool)
    firsts = requests["first_token_s"].between(t0, t1, inclusive="right").sum()
    span_s = t1 - t0
    out = {"num_measured": int(len(fin)), "window_s": span_s,
           "throughput_rps": float(requests["finish_s"].between(t0, t1, inclusive="right").sum() / span_s)
           if span_s > 0 else math.nan,
           "output_tok_per_s": float((in_win.sum() + firsts) / span_s) if span_s > 0 else math.nan}
    prompts = requests.loc[requests["first_token_s"].between(t0, t1, inclusive="right"), "prompt_tokens"]
    out["input_tok_per_s"] = float(prompts.sum() / span_s) if span_s > 0 else math.nan
    if iterations is not None and len(iterations):
        steps = iterations[(iterations["start_s"] > t0) & (iterations["start_s"] <= t1)]
        busy = float(steps["duration_s"].sum())
        prefill = float(steps.loc[steps["prefill_tokens"] > 0, "duration_s"].sum())
        out["prefill_time_share"] = prefill / busy if busy > 0 else math.nan
    out.update(stats_ms("ttft", fin["ttft_s"]))
    out.update(stats_ms("itl", gaps[in_win]))
    out.update(stats_ms("tpot", fin["tpot_s"]))
    out.update(stats_ms("e2e", fin["e2e_s"]))
    return out

"""Arrival rates that change over time, and the non-homogeneous Poisson arrivals they drive.

Every shape is a piecewise-linear rate over a span of time (stages, a ramp, a spike, a diurnal curve drawn
with 288 segments a period, a trace's per-bin rates), after which it repeats (`periodic`) or holds its
last rate. Arrivals come by time rescaling (Cinlar; Lewis and Shedler 1979): unit-rate Poisson times pushed
through the inverse of the cumulative rate, exact for a piecewise-linear rate. The sweep file writes
`rate_per_s: {diurnal: {...}}` (or stages, ramp, spike, trace) in place of a number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from workloads.errors import WorkloadError, check_keys, finite_number

SHAPES = ("stages", "ramp", "spike", "diurnal", "trace")
DIURNAL_SEGMENTS = 288   # five-minute segments over a day: the cosine's chord error is under 0.02% of its swing


@dataclass(frozen=True)
class RateProfile:
    """Rate `rates_per_s[k]` at `times_s[k]`, linear in between; `times_s[0]` is 0. Past the last knot the
    profile repeats from 0 (`periodic`) or holds its last rate. `spec`: the mapping it was read from."""
    times_s: tuple[float, ...]
    rates_per_s: tuple[float, ...]
    periodic: bool
    spec: dict = field(default_factory=dict, compare=False)

    @property
    def span_s(self) -> float:
        return self.times_s[-1]

    @property
    def mean_rate_per_s(self) -> float:
        """The mean over the span (trapezoids: exact for a piecewise-linear rate)."""
        t, r = np.asarray(self.times_s), np.asarray(self.rates_per_s)
        return float(np.sum(np.diff(t) * (r[1:] + r[:-1]) / 2) / t[-1])

    @property
    def peak_rate_per_s(self) -> float:
        return max(self.rates_per_s)

    def rate_at(self, t_s) -> np.ndarray:
        t = np.asarray(t_s, dtype=float)
        if self.periodic:
            t = np.mod(t, self.span_s)
        return np.interp(t, self.times_s, self.rates_per_s)

    def _cumulative(self) -> np.ndarray:
        t, r = np.asarray(self.times_s), np.asarray(self.rates_per_s)
        return np.r_[0.0, np.cumsum(np.diff(t) * (r[1:] + r[:-1]) / 2)]

    def expected_arrivals(self, t_s: float) -> float:
        """The cumulative rate: arrivals expected in [0, t_s) (exact: each segment's trapezoid)."""
        cum, span = self._cumulative(), self.span_s
        periods = 0.0
        if self.periodic:
            periods, t_s = divmod(t_s, span)
        elif t_s >= span:
            return float(cum[-1] + self.rates_per_s[-1] * (t_s - span))
        t, r = self.times_s, self.rates_per_s
        k = min(int(np.searchsorted(t, t_s, side="right")) - 1, len(t) - 2)
        x = t_s - t[k]
        slope = (r[k + 1] - r[k]) / (t[k + 1] - t[k])
        return float(periods * cum[-1] + cum[k] + r[k] * x + slope * x * x / 2)

    def invert(self, counts: np.ndarray) -> np.ndarray:
        """Times at which the cumulative rate reaches each of `counts` (nondecreasing, >= 0): within a
        segment of rate r0 + s (t - t0) the time solves r0 x + s x^2 / 2 = y, taken in the form that is
        stable for s = 0."""
        y = np.asarray(counts, dtype=float)
        t, r = np.asarray(self.times_s), np.asarray(self.rates_per_s)
        cum = self._cumulative()
        total, span = cum[-1], self.span_s
        offset = np.zeros_like(y)
        if self.periodic:
            periods = np.floor(y / total)
            offset, y = periods * span, y - periods * total
        beyond = y >= total
        k = np.clip(np.searchsorted(cum, y, side="right") - 1, 0, len(t) - 2)   # zero-rate segments skipped
        dy = y - cum[k]
        slope = (r[k + 1] - r[k]) / (t[k + 1] - t[k])
        root = np.sqrt(np.maximum(r[k] ** 2 + 2 * slope * dy, 0.0))
        denom = r[k] + root
        x = np.where(denom > 0, 2 * dy / np.where(denom > 0, denom, 1.0), 0.0)
        out = t[k] + x
        if not self.periodic and beyond.any():   # held at the last rate (> 0, checked when parsed)
            out = np.where(beyond, span + (y - total) / r[-1], out)
        return offset + out


def arrival_times_s(profile: RateProfile, n: int, process: str, rng: np.random.Generator) -> np.ndarray:
    """`n` arrival times: a Poisson process of this rate (`poisson`), or evenly spaced in expected count,
    the first at t = 0 (`constant`: the deterministic counterpart)."""
    counts = np.arange(n, dtype=float) if process == "constant" else np.cumsum(rng.exponential(1.0, size=n))
    return profile.invert(counts)


def _stages(spec, key: str) -> RateProfile:
    if not isinstance(spec, list) or not spec:
        raise WorkloadError(f"{key}: expected a list of {{duration_s, rate_per_s}} stages (rate_per_s a number, "
                            "or [from, to] for a linear stage)")
    times, rates = [0.0], []
    for i, st in enumerate(spec):
        k = f"{key}[{i}]"
        check_keys(k, st, {"duration_s", "rate_per_s"})
        if "duration_s" not in st or "rate_per_s" not in st:
            raise WorkloadError(f"{k}: needs duration_s and rate_per_s")
        d = finite_number(f"{k}.duration_s", st["duration_s"], strict=True)
        v = st["rate_per_s"]
        lo, hi = (v if isinstance(v, list) and len(v) == 2 else (v, v))
        lo = finite_number(f"{k}.rate_per_s", lo)
        hi = finite_number(f"{k}.rate_per_s", hi)
        if rates and rates[-1] != lo:   # a step: a zero-length segment between the two rates
            times.append(times[-1])
            rates.append(lo)
        elif not rates:
            rates.append(lo)
        times.append(times[-1] + d)
        rates.append(hi)
    return RateProfile(tuple(times), tuple(rates), False)


def _ramp(spec, key: str) -> RateProfile:
    check_keys(key, spec, {"from", "to", "duration_s"})
    for k in ("from", "to", "duration_s"):
        if k not in spec:
            raise WorkloadError(f"{key}.{k}: required")
    a, b = finite_number(f"{key}.from", spec["from"]), finite_number(f"{key}.to", spec["to"])
    d = finite_number(f"{key}.duration_s", spec["duration_s"], strict=True)
    return RateProfile((0.0, d), (a, b), False)


def _spike(spec, key: str) -> RateProfile:
    check_keys(key, spec, {"base", "peak", "start_s", "duration_s"})
    for k in ("base", "peak", "start_s", "duration_s"):
        if k not in spec:
            raise WorkloadError(f"{key}.{k}: required")
    base, peak = finite_number(f"{key}.base", spec["base"]), finite_number(f"{key}.peak", spec["peak"])
    start = finite_number(f"{key}.start_s", spec["start_s"])
    d = finite_number(f"{key}.duration_s", spec["duration_s"], strict=True)
    times = (0.0, start, start, start + d, start + d, start + 2 * d)
    rates = (base, base, peak, peak, base, base)
    return RateProfile(times, rates, False)


def _diurnal(spec, key: str) -> RateProfile:
    check_keys(key, spec, {"mean", "peak_to_trough", "period_s", "peak_at_s"})
    if "mean" not in spec:
        raise WorkloadError(f"{key}.mean: required (requests/s averaged over a period)")
    mean = finite_number(f"{key}.mean", spec["mean"], strict=True)
    ratio = finite_number(f"{key}.peak_to_trough", spec.get("peak_to_trough", 4.0), minimum=1.0)
    period = finite_number(f"{key}.period_s", spec.get("period_s", 86400.0), strict=True)
    peak_at = finite_number(f"{key}.peak_at_s", spec.get("peak_at_s", period / 2))
    # mean + a cos(...): (mean + a) / (mean - a) = ratio
    amplitude = mean * (ratio - 1) / (ratio + 1)
    t = np.linspace(0.0, period, DIURNAL_SEGMENTS + 1)
    rates = mean + amplitude * np.cos(2 * np.pi * (t - peak_at) / period)
    # the chords cut under a cosine's crests and over its troughs; shift them so the mean stays `mean`
    rates = rates + (mean - float(np.sum(np.diff(t) * (rates[1:] + rates[:-1]) / 2) / period))
    return RateProfile(tuple(t.tolist()), tuple(np.maximum(rates, 0.0).tolist()), True)


def _trace(spec, key: str) -> RateProfile:
    from workloads.traces import FORMATS, load_trace
    check_keys(key, spec, {"path", "format", "peak_rate_per_s", "bin_s"})
    for k in ("path", "format", "peak_rate_per_s"):
        if k not in spec:
            raise WorkloadError(f"{key}.{k}: required")
    if spec["format"] not in FORMATS:
        raise WorkloadError(f"{key}.format: expected one of {', '.join(FORMATS)}, got {spec['format']!r}")
    peak = finite_number(f"{key}.peak_rate_per_s", spec["peak_rate_per_s"], strict=True)
    bin_s = finite_number(f"{key}.bin_s", spec.get("bin_s", 60.0), strict=True)
    return trace_profile(load_trace(str(spec["path"]), spec["format"]).arrival_s, bin_s, peak, key)


def trace_profile(arrival_s: np.ndarray, bin_s: float, peak_rate_per_s: float, key: str = "trace") -> RateProfile:
    """A trace's arrivals per `bin_s` bin as a piecewise-constant rate, scaled so that its busiest bin runs
    at `peak_rate_per_s`; it repeats over the trace's span."""
    t = np.asarray(arrival_s, dtype=float)
    num_bins = max(1, math.ceil((t.max() - t.min()) / bin_s)) if len(t) else 0
    if num_bins == 0:
        raise WorkloadError(f"{key}: the trace has no requests")
    counts = np.bincount(np.minimum(((t - t.min()) // bin_s).astype(int), num_bins - 1), minlength=num_bins)
    rates = counts / counts.max() * peak_rate_per_s
    times = np.repeat(np.arange(num_bins + 1) * bin_s, 2)[1:-1]   # each bin flat, steps between bins
    return RateProfile(tuple(times.tolist()), tuple(np.repeat(rates, 2).tolist()), True)


_PARSERS = {"stages": _stages, "ramp": _ramp, "spike": _spike, "diurnal": _diurnal, "trace": _trace}


def parse_rate_profile(spec, key: str) -> RateProfile:
    """`{stages: [...]}`, `{ramp: {...}}`, `{spike: {...}}`, `{diurnal: {...}}` or `{trace: {...}}`."""
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SHAPES:
        raise WorkloadError(f"{key}: expected a number or a mapping with one of {', '.join(SHAPES)}, got {spec!r}")
    (shape, body), = spec.items()
    if shape != "stages" and not isinstance(body, dict):
        raise WorkloadError(f"{key}.{shape}: expected a mapping")
    profile = _PARSERS[shape](body, f"{key}.{shape}")
    if not profile.periodic and profile.rates_per_s[-1] <= 0:
        raise WorkloadError(f"{key}.{shape}: ends at 0 requests/s, so the requests after it would never "
                            "arrive; end on a positive rate")
    if profile.mean_rate_per_s <= 0:
        raise WorkloadError(f"{key}.{shape}: the rate is 0 throughout")
    return RateProfile(profile.times_s, profile.rates_per_s, profile.periodic, {shape: body})

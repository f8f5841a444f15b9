"""`python -m workloads.fit TRACE --format azure`: fit the synthetic generators to a trace and print the
sweep `workload:` block that reproduces its statistics.

Lengths: lognormal by the moments of log length (mean and sd of ln x; median = e^mean), or Pareto type I
by maximum likelihood above the smallest length; `--lengths auto` keeps the one with the higher
log-likelihood. Both are truncated at the trace's maximum (redrawn, as the generator does). Arrivals:
gamma inter-arrival gaps with the trace's mean rate and coefficient of variation (CV = 1 is Poisson).
Ignored: correlation between prompt and output length (nearly none in the Azure traces), time-of-day
rate changes, and prefix sharing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import yaml

from commandline.argtypes import non_negative_float, positive_int
from commandline.exits import refuse, run_main
from commandline.parser import Parser
from workloads.errors import WorkloadError
from workloads.traces import FORMATS, Trace, load_trace


@dataclass(frozen=True)
class LengthFit:
    dist: str                # "lognormal" or "pareto"
    params: dict             # as the sweep writes them (median/sigma or alpha/min), plus max
    log_likelihood: float


def fit_lognormal(x: np.ndarray) -> LengthFit:
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())
    sigma = max(sigma, 1e-6)
    ll = float(np.sum(-logs - np.log(sigma * np.sqrt(2 * np.pi)) - (logs - mu) ** 2 / (2 * sigma**2)))
    return LengthFit("lognormal", {"median": round(float(np.exp(mu)), 2), "sigma": round(sigma, 4),
                                   "max": int(x.max())}, ll)


def fit_pareto(x: np.ndarray) -> LengthFit:
    xmin = float(x.min())
    s = float(np.sum(np.log(x / xmin)))
    alpha = len(x) / s if s > 0 else 1e6
    ll = float(len(x) * np.log(alpha) + len(x) * alpha * np.log(xmin) - (alpha + 1) * np.sum(np.log(x)))
    return LengthFit("pareto", {"alpha": round(alpha, 4), "min": xmin, "max": int(x.max())}, ll)


def fit_lengths(x: np.ndarray, kind: str = "lognormal") -> LengthFit:
    x = np.asarray(x, dtype=float)
    if kind == "lognormal":
        return fit_lognormal(x)
    if kind == "pareto":
        return fit_pareto(x)
    return max(fit_lognormal(x), fit_pareto(x), key=lambda f: f.log_likelihood)


def fit_arrivals(arrival_s: np.ndarray) -> dict:
    """Mean rate over the trace's span and the CV of inter-arrival gaps."""
    gaps = np.diff(np.sort(arrival_s))
    if len(gaps) < 2 or gaps.mean() <= 0:
        raise WorkloadError("a trace needs at least three requests at different times to fit arrivals")
    return {"rate_per_s": round(float(1.0 / gaps.mean()), 4), "cv": round(float(gaps.std() / gaps.mean()), 4)}


def fit_workload(trace: Trace, lengths: str = "lognormal") -> dict:
    """The sweep `workload:` mapping that reproduces `trace`."""
    arrival = fit_arrivals(trace.arrival_s)
    process = {"process": "gamma", **arrival} if abs(arrival["cv"] - 1) > 0.05 else \
        {"process": "poisson", "rate_per_s": arrival["rate_per_s"]}
    out = {}
    for key, x in (("prompt_tokens", trace.prompt_tokens), ("output_tokens", trace.output_tokens)):
        f = fit_lengths(x, lengths)
        out[key] = {"dist": f.dist, **f.params}
    return {"num_requests": len(trace), "arrival": process, **out}


def describe(trace: Trace) -> list[str]:
    """Comment lines: what the trace itself measures, for comparison with the fit."""
    lines = [f"{trace.path} ({trace.format}): {len(trace)} requests over {trace.duration_s:.0f} s "
             f"({len(trace) / max(trace.duration_s, 1e-9):.2f} req/s)"]
    if trace.num_dropped:
        lines.append(f"{trace.num_dropped} rows with a zero length dropped")
    for name, x in (("prompt", trace.prompt_tokens), ("output", trace.output_tokens)):
        logs = np.log(x)
        lines.append(f"{name} tokens: mean {x.mean():.0f}, p50 {np.percentile(x, 50):.0f}, "
                     f"p99 {np.percentile(x, 99):.0f}; ln-length mean {logs.mean():.2f}, sd {logs.std():.2f}")
    gaps = np.diff(trace.arrival_s)
    lines.append(f"inter-arrival CV {gaps.std() / gaps.mean():.2f}; "
                 f"{np.mean(gaps == 0):.1%} of gaps are 0 (timestamp resolution)")
    rep = trace.repeated_block_fraction()
    if rep is not None:
        lines.append(f"prefix blocks seen before (infinite cache): {rep:.1%} (not reproduced by the fit)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m workloads.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="trace file")
    ap.add_argument("--format", required=True, choices=FORMATS)
    ap.add_argument("--lengths", default="lognormal", choices=("lognormal", "pareto", "auto"))
    ap.add_argument("--start-s", type=non_negative_float, default=0.0, help="window start (trace seconds)")
    ap.add_argument("--end-s", type=non_negative_float, default=None, help="window end (trace seconds)")
    ap.add_argument("--num-requests", type=positive_int, default=None, help="only the first N requests")
    args = ap.parse_args(argv)
    if args.end_s is not None and args.end_s <= args.start_s:
        ap.error(f"--end-s {args.end_s:g}: must be after --start-s {args.start_s:g}")
    try:
        trace = load_trace(args.trace, args.format).select(args.start_s, args.end_s, args.num_requests)
        block = fit_workload(trace, args.lengths)
    except WorkloadError as e:
        return refuse(e)
    print("\n".join(f"# {line}" for line in describe(trace)))
    print(yaml.safe_dump({"workload": block}, sort_keys=False, default_flow_style=None).rstrip())
    return 0


if __name__ == "__main__":
    run_main(main, (WorkloadError,))

"""The bar a kernel fit must pass: each family's held-out median absolute percentage error at most a
limit (default 25%). A family above it is reported loudly and the profile is refused (exit 3) unless
the user keeps it. Families with fewer than MIN_HELD_OUT held-out points are not judged."""
from __future__ import annotations

import argparse
from pathlib import Path

from costmodels.profile import ELEMENTWISE_PER_LAYER, ELEMENTWISE_PER_STEP

MAX_HOLDOUT_ERROR_PCT = 25.0  # default bar on each family's held-out median error
MIN_HELD_OUT = 3              # fewer held-out points make no median to judge
BAD_FIT_RC = 3                # exit status of a refused fit (2: bad input)


def holdout_limits(specs: list[str] | None) -> dict[str, float]:
    """{"*": the default, family: its own} from --max-holdout-error-pct values `N` or `FAMILY=N`
    ("elementwise" sets every elementwise op, "allreduce" every TP degree). ValueError names a bad value."""
    limits = {"*": MAX_HOLDOUT_ERROR_PCT}
    families = {"gemm", "prefill_attn", "decode_attn", "sampling", "elementwise", "gemm_fp8", "moe", "mla_prefill",
                "mla_decode", "allreduce", *(f"allreduce_tp{n}" for n in (2, 4, 8, 16)),
                *(f"elementwise_{op}" for op in set(ELEMENTWISE_PER_LAYER) | set(ELEMENTWISE_PER_STEP))}
    for spec in specs or []:
        name, _, value = spec.rpartition("=")
        if name and name not in families:
            raise ValueError(f"--max-holdout-error-pct {spec}: unknown family {name!r} "
                             f"(one of {', '.join(sorted(families))})")
        try:
            limit = float(value)
        except ValueError:
            limit = -1.0
        if not 0 <= limit < float("inf"):
            raise ValueError(f"--max-holdout-error-pct {spec}: expected N or FAMILY=N, N a percentage >= 0")
        limits[name or "*"] = limit
    return limits


def bad_fits(report: dict, limits: dict[str, float]) -> dict[str, dict]:
    """The families whose held-out median error exceeds their limit (of those with MIN_HELD_OUT
    held-out points or more)."""
    bad = {}
    for name, r in report.items():
        median = r.get("held_out_median_ape") if name != "composition" else None
        group = name.split("_")[0] if name.startswith(("elementwise_", "allreduce_")) else name
        limit = limits.get(name, limits.get(group, limits["*"]))
        if median is not None and r["num_held_out"] >= MIN_HELD_OUT and median > limit:
            bad[name] = {"held_out_median_ape": median, "held_out_p90_ape": r["held_out_p90_ape"],
                         "num_held_out": r["num_held_out"], "limit_pct": limit}
    return bad


def bad_fit_lines(bad: dict[str, dict], kept: bool, folder: Path, out: Path) -> list[str]:
    """The loud report of families that failed their held-out limit."""
    rule = "!" * 100
    one = len(bad) == 1
    lines = [rule, f"BAD FIT: {len(bad)} kernel famil{'y' if one else 'ies'} of {folder} predict{'s' if one else ''} "
             "held-out timings worse than allowed:"]
    for name, b in bad.items():
        lines.append(f"  {name:24s} held-out median error {b['held_out_median_ape']:.1f}% > {b['limit_pct']:g}% "
                     f"(p90 {b['held_out_p90_ape']:.1f}%, {b['num_held_out']} held-out points)")
    if kept:
        lines.append(f"--keep-bad-fit: {out} written anyway; its fit_quality names these families. Do not "
                     "trust their timings.")
    else:
        lines += [f"{out} NOT written (fit_report.json and fit.png are, to see why).",
                  "Usual causes: other load on the machine or too few repeats (compare p10_s and p90_s in "
                  "measurements.csv), a grid too coarse for the kernel's shape.",
                  f"Write it anyway: python -m calibration.fit {folder} --out {out} --keep-bad-fit; "
                  "move the bar: --max-holdout-error-pct N or FAMILY=N."]
    return lines + [rule]


def add_quality_options(ap: argparse.ArgumentParser) -> None:
    """The held-out quality bar, shared with calibration.capture."""
    ap.add_argument("--max-holdout-error-pct", action="append", metavar="N|FAMILY=N",
                    help=f"refuse a fit whose held-out median error exceeds N%% in any family (default "
                    f"{MAX_HOLDOUT_ERROR_PCT:g}); FAMILY=N sets one family (repeatable)")
    ap.add_argument("--keep-bad-fit", action="store_true",
                    help=f"write the profile even when a family fails that bar (else exit {BAD_FIT_RC})")

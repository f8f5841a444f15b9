"""The sweep file's value checks, shared by every section's parser (experiments/config.py, search.py,
capacity.py, workloads/*): one wording for every error, "<dotted key>: expected <what>, got <value>"."""
import math


class WorkloadError(ValueError):
    """Bad workload input; the message names the offending key or file in one line."""


def finite_number(key: str, v, *, minimum: float = 0.0, strict: bool = False, allow_inf: bool = False,
                  integer: bool = False, error=WorkloadError):
    """The one number check of the sweep file: a real number (not a boolean, NaN or, unless `allow_inf`,
    infinite), >= `minimum` (> with `strict`); with `integer`, a YAML integer. Returns it as float or int."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and not math.isnan(v)
          and (allow_inf or math.isfinite(v)) and (v > minimum if strict else v >= minimum)
          and (not integer or isinstance(v, int)))
    if not ok:
        what = "an integer" if integer else "a number"
        bound = f"{'>' if strict else '>='} {minimum:g}"
        inf = " (or .inf)" if allow_inf else ""
        raise error(f"{key}: expected {what} {bound}{inf}, got {v!r}")
    return int(v) if integer else float(v)


def check_keys(section: str, spec, known, error=WorkloadError) -> None:
    """`spec` must be a mapping whose keys are all in `known`; the error names the first other key."""
    if not isinstance(spec, dict):
        raise error(f"{section}: expected a mapping with {', '.join(sorted(known))}")
    for k in spec:
        if k not in known:
            raise error(f"{section}.{k}: unknown key; expected one of {', '.join(sorted(known))}")

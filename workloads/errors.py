import math


class WorkloadError(ValueError):
    """Bad workload input; the message names the offending key or file in one line."""


def finite_number(key: str, v, *, minimum: float = 0.0, strict: bool = False, allow_inf: bool = False,
                  integer: bool = False, error=WorkloadError):
    """The one number check of the sweep file's workload keys: a real number (not a boolean, NaN or, unless
    `allow_inf`, infinite), >= `minimum` (> with `strict`), a whole number with `integer`."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and not math.isnan(v)
          and (allow_inf or math.isfinite(v)) and (v > minimum if strict else v >= minimum)
          and (not integer or (math.isfinite(v) and float(v).is_integer())))
    if not ok:
        what = "an integer" if integer else "a number"
        bound = f"{'>' if strict else '>='} {minimum:g}"
        inf = " (or .inf)" if allow_inf else ""
        raise error(f"{key}: expected {what} {bound}{inf}, got {v!r}")
    return int(v) if integer else float(v)

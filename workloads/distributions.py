"""Token-length distributions written in a sweep as `{dist: NAME, ...}`.

Lengths are rounded to integers; a draw below 1 or above `max` is drawn again (truncation by
resampling, as Anyscale's benchmark does), so a distribution is never clamped silently.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.errors import WorkloadError, finite_number

_PARAMS = {
    "fixed": ({"value"}, set()),
    "uniform": ({"min", "max"}, set()),
    "lognormal": ({"median", "sigma"}, {"max"}),
    "exponential": ({"mean"}, {"max"}),
    "pareto": ({"alpha", "min"}, {"max"}),
}


@dataclass(frozen=True)
class LengthDist:
    dist: str
    params: tuple[tuple[str, float], ...]

    @property
    def max_value(self) -> int | None:
        p = dict(self.params)
        return int(p["value"]) if self.dist == "fixed" else (int(p["max"]) if "max" in p else None)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = dict(self.params)
        if self.dist == "fixed":
            return np.full(n, p["value"], dtype=float)
        if self.dist == "uniform":
            return rng.integers(int(p["min"]), int(p["max"]) + 1, size=n).astype(float)
        if self.dist == "lognormal":
            return rng.lognormal(np.log(p["median"]), p["sigma"], size=n)
        if self.dist == "exponential":
            return rng.exponential(p["mean"], size=n)
        return p["min"] * (1.0 + rng.pareto(p["alpha"], size=n))  # Pareto type I with scale `min`

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        hi = self.max_value
        out = np.rint(self._draw(rng, n))
        for _ in range(1000):
            bad = (out < 1) | (out > hi) if hi is not None else out < 1
            if not bad.any():
                return out.astype(np.int64)
            out[bad] = np.rint(self._draw(rng, int(bad.sum())))
        raise WorkloadError(f"{self.dist} lengths: almost no draws fall in [1, {hi}]; widen max")


def parse_length_dist(spec, key: str) -> LengthDist:
    """`spec` is the YAML mapping; `key` names it in errors (e.g. 'workload.prompt_tokens')."""
    if not isinstance(spec, dict) or "dist" not in spec:
        raise WorkloadError(f"{key}: expected a mapping with 'dist' (one of {', '.join(_PARAMS)})")
    name = spec["dist"]
    if name not in _PARAMS:
        raise WorkloadError(f"{key}.dist: unknown distribution {name!r}; use one of {', '.join(_PARAMS)}")
    required, optional = _PARAMS[name]
    given = set(spec) - {"dist"}
    if unknown := given - required - optional:
        raise WorkloadError(f"{key}.{sorted(unknown)[0]}: unknown key for dist {name}; "
                            f"expected {', '.join(sorted(required | optional))}")
    if missing := required - given:
        raise WorkloadError(f"{key}.{sorted(missing)[0]}: required for dist {name}")
    params = {k: finite_number(f"{key}.{k}", spec[k], strict=True) for k in sorted(given)}
    if name == "uniform" and params["min"] > params["max"]:
        raise WorkloadError(f"{key}: min {params['min']:g} > max {params['max']:g}")
    centre = {"lognormal": "median"}.get(name)  # most draws would be redrawn: not the stated median
    if centre and "max" in params and params["max"] < params[centre]:
        raise WorkloadError(f"{key}.max: {params['max']:g} is below the {centre} {params[centre]:g}, so the lengths "
                            f"would not follow the stated {centre}; raise max or lower the {centre}")
    lo = params.get("min", params.get("value", 1))
    if "max" in params and params["max"] < max(1, lo if name == "pareto" else 1):
        raise WorkloadError(f"{key}.max: {params['max']:g} leaves no valid length")
    return LengthDist(name, tuple(sorted(params.items())))

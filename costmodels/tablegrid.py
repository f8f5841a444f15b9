"""Kernel-table rows -> a LogGrid over the table's own knots (costmodels/aic.py builds its families with it).

Optionally the rows are first divided by their roofline shape (fixed + max(FLOPs / peak, bytes / BW)),
so that interpolation between knots follows launch-, memory- and compute-bound kinks. The held-out error
rebuilds the grid without every fifth interior knot of each axis and predicts the rows at those knots.
"""
from __future__ import annotations

import numpy as np

from costmodels.profile import LogGrid


def grid_from_rows(axes, points: np.ndarray, latency_s: np.ndarray, slopes) -> LogGrid:
    """A LogGrid on the rows' distinct values per axis; empty cells are extrapolated from the nearest
    filled cell below along each axis with that axis's slope, then floored from above."""
    knots = [np.unique(points[:, i]) for i in range(points.shape[1])]
    values = np.full([len(k) for k in knots], np.nan)
    index = tuple(np.searchsorted(k, points[:, i]) for i, k in enumerate(knots))
    values[index] = np.log(latency_s)
    logk = [np.log(k) for k in knots]
    for axis in reversed(range(len(knots))):
        v = np.moveaxis(values, axis, -1)
        for j in range(1, v.shape[-1]):
            gap = np.isnan(v[..., j]) & ~np.isnan(v[..., j - 1])
            v[..., j][gap] = v[..., j - 1][gap] + slopes[axis] * (logk[axis][j] - logk[axis][j - 1])
        for j in range(v.shape[-1] - 2, -1, -1):
            gap = np.isnan(v[..., j]) & ~np.isnan(v[..., j + 1])
            v[..., j][gap] = v[..., j + 1][gap]
    if np.isnan(values).any():
        values = np.where(np.isnan(values), np.nanmax(values), values)
    return LogGrid(tuple(axes), tuple(logk), values, tuple(float(s) for s in slopes))


def held_out_error(axes, points: np.ndarray, latency_s: np.ndarray, slopes) -> dict:
    """Rebuild without every fifth interior knot of each axis; absolute % error on the rows at them."""
    held = np.zeros(len(points), dtype=bool)
    for i in range(points.shape[1]):
        k = np.unique(points[:, i])
        held |= np.isin(points[:, i], k[1:-1][2::5])
    if not held.any() or held.all():
        return {"rows": 0}
    grid = grid_from_rows(axes, points[~held], latency_s[~held], slopes)
    pred = np.array([grid(*p) for p in points[held]])
    err = np.abs(pred / latency_s[held] - 1) * 100
    return {"rows": int(held.sum()), "median_pct": round(float(np.median(err)), 2),
            "p90_pct": round(float(np.percentile(err, 90)), 2)}


def _monomials(terms, points: np.ndarray) -> np.ndarray:
    return sum(c * np.prod(points ** np.asarray(e, dtype=float), axis=1) for c, e in terms) if terms else 0.0


def baseline_s(b: dict, points: np.ndarray) -> np.ndarray:
    """The roofline shape a family's rows are divided by before interpolation: fixed + max(FLOPs / peak,
    bytes / bandwidth), FLOPs and bytes as sums of monomials (coefficient, exponents) of the coordinates;
    `cap` [axis, divisor, window] appends min(x[axis] / divisor, window), the keys a sliding window leaves."""
    if b.get("cap"):
        axis, divisor, window = b["cap"]
        points = np.column_stack([points, np.minimum(points[:, axis] / divisor, window)])
    return b["fixed_s"] + np.maximum(_monomials(b["flops"], points) / b["peak_flops_per_s"],
                                     _monomials(b["bytes"], points) / b["bytes_per_s"])


class TableFamily:
    """Latency in seconds at a family's coordinates: the residual grid times the roofline baseline."""

    def __init__(self, family: dict):
        self.grid, self.baseline = LogGrid.from_dict(family["grid"]), family.get("baseline")

    def __call__(self, *x: float) -> float:
        t = self.grid(*x)
        return t * float(baseline_s(self.baseline, np.array([x], dtype=float))[0]) if self.baseline else t


def family(frame, axes, columns, slopes, baseline: dict | None = None, scale=1e-3) -> dict:
    """Grid + held-out error of one family from its table rows (latency in ms); min over kernel sources.
    With a `baseline`, the grid holds latency / baseline (flat beyond the last knot: the baseline carries
    the physical growth), which follows compute/memory/launch-bound kinks between knots."""
    merged = frame.groupby(list(columns), as_index=False)["latency"].min()
    points = merged[list(columns)].to_numpy(dtype=float)
    lat = merged["latency"].to_numpy(dtype=float) * scale
    if baseline is not None:
        baseline = {**baseline, "fixed_s": 0.8 * float(lat.min())}
        ratio, slopes = lat / baseline_s(baseline, points), (0.0,) * len(slopes)
        err = held_out_error(axes, points, ratio, slopes)   # errors of the ratio are errors of the latency
        return {"grid": grid_from_rows(axes, points, ratio, slopes).to_dict(), "baseline": baseline,
                "held_out": err, "rows": int(len(merged))}
    return {"grid": grid_from_rows(axes, points, lat, slopes).to_dict(),
            "held_out": held_out_error(axes, points, lat, slopes), "rows": int(len(merged))}

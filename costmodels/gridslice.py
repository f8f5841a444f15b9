"""A LogGrid (costmodels/profile.py) with every axis but the last held fixed: a 1-D lookup, scalar or
vectorised over many values of the last axis, bitwise equal to the full grid's `__call__`.

Why: a quiet stretch of decode steps (simcore/fast/engine.py) prices thousands of steps of one batch size,
and only the mean context changes; the leading axes' cells and weights are worked out once. Bitwise
equality with the full grid (tests/test_profile_vectorised.py) keeps the fast path's tables identical to
the SimPy engine's: the same float operations in the same order, elementwise; `math.log` / `math.exp` per
element rather than numpy's (whose SIMD versions may differ from libm in the last bit).
"""
from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

SCALAR_BELOW = 64   # fewer values than this: one by one (about 1 us each) beats numpy's fixed cost per call


class GridSlice:
    """`grid(*leading, x)` as `slice(x)` (a float) and `slice.many(xs)` (an array), for fixed `leading`."""

    def __init__(self, grid, leading: tuple[float, ...]):
        if len(leading) != len(grid.axes) - 1:
            raise ValueError(f"grid over {grid.axes}: fix {len(grid.axes) - 1} axes, got {len(leading)}")
        cells, extra = [], 0.0
        for axis, x_raw in enumerate(leading):   # the full grid's own cell rule, so the same bits
            base, step, t, beyond = grid._cell(axis, x_raw)
            extra += beyond
            cells.append((base, step, t))
        lead = []   # (flat index, weight) per corner of the leading axes, in the full grid's corner order
        for corner in range(1 << len(cells)):
            index, w = 0, 1.0
            for axis, (base, step, t) in enumerate(cells):
                if (corner >> axis) & 1:
                    index, w = index + base + step, w * t
                else:
                    index, w = index + base, w * (1.0 - t)
            lead.append((index, w))
        self.lead, self.extra = lead, extra
        self.two_corners = (*lead[0], *lead[1]) if len(lead) == 2 else None
        self.knots, self.slope, self.flat = grid._knots[-1], grid.slopes[-1], grid._flat
        self.knots_array = np.asarray(self.knots)
        self.flat_array = np.asarray(self.flat)
        self.scalar = self._scalar_fn()   # self(x), the closure callers in hot loops hold

    def __call__(self, x_raw: float) -> float:
        return self.scalar(x_raw)

    def _scalar_fn(self):
        """`self(x)` as a closure over the slice's constants (called millions of times by the fast engine's
        stretches: no attribute lookups, no tuples, and with one leading axis no loop)."""
        k, extra0, slope, flat, lead = self.knots, self.extra, self.slope, self.flat, self.lead
        k0, k_last, last = k[0], k[-1], len(k) - 1
        log, exp = math.log, math.exp

        def cell(x_raw):   # LogGrid._cell on the last axis: (base, step, t, extra)
            x = log(x_raw if not x_raw < 1e-12 else 1e-12)   # max(x_raw, 1e-12) without the call
            if x >= k_last:
                return last, 0, 0.0, extra0 + slope * (x - k_last)
            if x <= k0:
                return 0, 0, 0.0, extra0
            base = bisect_right(k, x) - 1
            return base, 1, (x - k[base]) / (k[base + 1] - k[base]), extra0

        if self.two_corners:   # one leading axis (decode attention's batch): unrolled, the same sums in the
            i0, w0, i1, w1 = self.two_corners   # same order as the loop below

            def value_two(x_raw: float) -> float:
                x = log(x_raw if not x_raw < 1e-12 else 1e-12)
                extra = extra0
                if x >= k_last:
                    extra += slope * (x - k_last)
                    base, step, t = last, 0, 0.0
                elif x <= k0:
                    base, step, t = 0, 0, 0.0
                else:
                    base = bisect_right(k, x) - 1
                    step, t = 1, (x - k[base]) / (k[base + 1] - k[base])
                value = 0.0
                f = 1.0 - t
                w = w0 * f
                if w:
                    value += w * flat[i0 + base]
                w = w1 * f
                if w:
                    value += w * flat[i1 + base]
                w = w0 * t
                if w:
                    value += w * flat[i0 + base + step]
                w = w1 * t
                if w:
                    value += w * flat[i1 + base + step]
                return exp(value + extra)
            return value_two

        def value_any(x_raw: float) -> float:
            base, step, t, extra = cell(x_raw)
            value = 0.0
            for f, offset in ((1.0 - t, base), (t, base + step)):   # the last axis is the corners' highest bit
                for index, w_lead in lead:
                    w = w_lead * f
                    if w:
                        value += w * flat[index + offset]
            return exp(value + extra)
        return value_any

    def many(self, x_raw) -> np.ndarray:
        """`[self(x) for x in x_raw]` as an array, elementwise the same operations."""
        if len(x_raw) < SCALAR_BELOW:
            return np.array([self(x) for x in np.asarray(x_raw, dtype=float).tolist()], dtype=float)
        k, n = self.knots_array, len(self.knots)
        x_raw = np.maximum(np.asarray(x_raw, dtype=float), 1e-12)
        x = np.fromiter(map(math.log, x_raw.tolist()), float, len(x_raw))
        beyond, below = x >= k[-1], x <= k[0]
        inside = ~(beyond | below)
        base = np.clip(np.searchsorted(k, x, side="right") - 1, 0, max(n - 2, 0))
        t = np.zeros(len(x))
        if n > 1:
            t[inside] = (x[inside] - k[base[inside]]) / (k[base[inside] + 1] - k[base[inside]])
        base[beyond], base[below] = n - 1, 0
        step = inside.astype(np.int64)
        extra = np.full(len(x), self.extra)
        extra[beyond] = self.extra + self.slope * (x[beyond] - k[-1])
        value, flat = np.zeros(len(x)), self.flat_array
        for f, offset in ((1.0 - t, base), (t, base + step)):
            for index, w_lead in self.lead:
                w = w_lead * f
                value = np.where(w != 0, value + w * flat[index + offset], value)
        return np.fromiter(map(math.exp, (value + extra).tolist()), float, len(x))

"""Fit a LogGrid (costmodels.profile) to timings: log-latency at the knots of a tensor grid of log-sizes,
by least squares on the multilinear interpolation weights, with a small second-difference penalty that
fills knots without data and smooths noise; then made monotone (non-decreasing) along every axis.

Scattered points (mixed batches, cached prefill) need no regular design: every point just spreads its
weight over the 2^d corners of its cell.
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix, vstack
from scipy.sparse.linalg import lsqr

from costmodels.profile import LogGrid


def choose_knots(values: np.ndarray, max_knots: int = 96, merge_ratio: float = 1.002) -> np.ndarray:
    """The distinct sizes (values within `merge_ratio` of each other merged), thinned geometrically
    when there are more than `max_knots`."""
    v = np.unique(np.asarray(values, dtype=float))
    knots = [v[0]]
    for x in v[1:]:
        if x > knots[-1] * merge_ratio:
            knots.append(x)
    knots = np.asarray(knots)
    if len(knots) > max_knots:
        knots = np.unique(np.geomspace(knots[0], knots[-1], max_knots))
    return knots


def _weights(log_knots: list[np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat knot indices, weights), each (n_points, 2^d), of multilinear interpolation at log-points x;
    points outside the grid are clamped to the edge (the regression fits the edge knot to them)."""
    n, d = x.shape
    lo, frac = np.zeros((n, d), dtype=int), np.zeros((n, d))
    for a, k in enumerate(log_knots):
        xa = np.clip(x[:, a], k[0], k[-1])
        if len(k) > 1:
            i = np.clip(np.searchsorted(k, xa, side="right") - 1, 0, len(k) - 2)
            lo[:, a], frac[:, a] = i, (xa - k[i]) / (k[i + 1] - k[i])
    dims = [len(k) for k in log_knots]
    idx, w = np.zeros((n, 1 << d), dtype=int), np.ones((n, 1 << d))
    for corner in range(1 << d):
        multi = []
        for a in range(d):
            upper = (corner >> a) & 1
            multi.append(np.minimum(lo[:, a] + upper, dims[a] - 1))
            w[:, corner] *= frac[:, a] if upper else 1.0 - frac[:, a]
        idx[:, corner] = np.ravel_multi_index(multi, dims)
    return idx, w


def _second_differences(log_knots: list[np.ndarray], weights: list[float], spaced: bool) -> coo_matrix:
    """Rows penalising curvature of the knot values along each axis; `spaced` uses divided differences
    (curvature in log-size), else differences in knot index."""
    dims = [len(k) for k in log_knots]
    rows, cols, vals, r = [], [], [], 0
    size = int(np.prod(dims))
    grid = np.arange(size).reshape(dims)
    for a, n in enumerate(dims):
        if n < 3 or weights[a] == 0:
            continue
        g, k = np.moveaxis(grid, a, 0), log_knots[a]
        for i in range(1, n - 1):
            coef = (1.0, -2.0, 1.0)
            if spaced:
                h0, h1 = k[i] - k[i - 1], k[i + 1] - k[i]
                hbar = (h0 + h1) / 2
                coef = (hbar / h0, -hbar * (1 / h0 + 1 / h1), hbar / h1)
            for c, s in zip((g[i - 1], g[i], g[i + 1]), coef):
                flat = c.ravel()
                rows.append(r + np.arange(flat.size))
                cols.append(flat)
                vals.append(np.full(flat.size, s * weights[a]))
            r += g[i].size
    if not rows:
        return coo_matrix((0, size))
    return coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, size))


def fit_loggrid(axes: tuple[str, ...], points: np.ndarray, latency_s: np.ndarray, knots: list[np.ndarray],
                slopes: tuple[float, ...], smoothing: float | tuple[float, ...] = 0.03, spaced: bool = False,
                baseline=None, monotone_axes: tuple[int, ...] | None = None) -> LogGrid:
    """Least-squares LogGrid through (points, latency_s); `points` is (n, d) in raw units.

    `smoothing` weighs the second-difference penalty (one weight, or one per axis). `baseline(points)`,
    a physical estimate (roofline time), is divided out before the fit, so the grid interpolates the
    smoother efficiency and empty knots are filled along the physical shape; it is multiplied back in at
    the knots. Latency is then made non-decreasing along `monotone_axes` (default: all)."""
    points = np.asarray(points, dtype=float)
    base = baseline(points) if baseline else np.ones(len(points))
    x, y = np.log(points), np.log(np.asarray(latency_s, dtype=float) / base)
    log_knots = [np.log(np.asarray(k, dtype=float)) for k in knots]
    dims = [len(k) for k in log_knots]
    idx, w = _weights(log_knots, x)
    n, size = len(y), int(np.prod(dims))
    design = coo_matrix((w.ravel(), (np.repeat(np.arange(n), w.shape[1]), idx.ravel())), shape=(n, size))
    weights = list(smoothing) if isinstance(smoothing, (tuple, list)) else [smoothing] * len(dims)
    penalty = _second_differences(log_knots, weights, spaced)
    a = vstack([design, penalty]).tocsr()
    b = np.concatenate([y, np.zeros(penalty.shape[0])])
    x0 = np.full(size, np.median(y))
    values = (lsqr(a, b - a @ x0, atol=1e-10, btol=1e-10, iter_lim=20000)[0] + x0).reshape(dims)
    if baseline:
        mesh = np.stack(np.meshgrid(*[np.exp(k) for k in log_knots], indexing="ij"), axis=-1)
        values = values + np.log(baseline(mesh.reshape(-1, len(dims)))).reshape(dims)
    for axis in range(len(dims)) if monotone_axes is None else monotone_axes:
        values = monotone(values, axis)
    return LogGrid(tuple(axes), tuple(log_knots), values, tuple(float(s) for s in slopes))


def monotone(values: np.ndarray, axis: int) -> np.ndarray:
    """Latency never falls as a size grows: the mean of the running max from below and the running min
    from above, both non-decreasing, so one noisy knot moves its neighbours by half, not the whole row.
    Each step keeps the monotonicity along axes already processed."""
    lower = np.maximum.accumulate(values, axis=axis)
    upper = np.flip(np.minimum.accumulate(np.flip(values, axis), axis=axis), axis)
    return (lower + upper) / 2.0


def errors(grid: LogGrid, points: np.ndarray, latency_s: np.ndarray) -> np.ndarray:
    """Absolute relative error |predicted / measured - 1| at each point."""
    pred = np.array([grid(*p) for p in np.asarray(points, dtype=float)])
    return np.abs(pred / np.asarray(latency_s, dtype=float) - 1.0)


def split(n: int, held_out_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, held_out): a seeded random fraction is kept aside from the fit."""
    rng = np.random.default_rng(seed)
    held = np.zeros(n, dtype=bool)
    if n >= 5:
        held[rng.permutation(n)[: int(round(held_out_fraction * n))]] = True
    return ~held, held


def split_interior(points: np.ndarray, held_out_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Like `split`, but along the first axis, among the points sharing their other coordinates (a row),
    a held-out point is never a row's smallest or largest, and both its row neighbours stay in the fit:
    the fitted grid (the one the profile keeps) then has every measured edge and never a gap of two
    sizes, and each held-out point tests an interpolation between measured neighbours, which is all the
    profile is asked inside its grid. Fewer are held out where a family has too few such points. An axis
    every point shares (one batch size) makes no rows: the split then runs along the next axis."""
    points = np.asarray(points, dtype=float)
    while points.shape[1] > 1 and np.all(points[:, 0] == points[0, 0]):
        points = points[:, 1:]
    n = len(points)
    _, row = np.unique(points[:, 1:], axis=0, return_inverse=True)
    row = row.ravel()
    order = np.lexsort((points[:, 0], row))           # by row, then along the first axis
    rank = np.empty(n, dtype=int)
    rank[order] = np.arange(n)
    first = np.r_[True, row[order][1:] != row[order][:-1]][rank]   # a row's smallest / largest
    last = np.r_[row[order][1:] != row[order][:-1], True][rank]
    held = np.zeros(n, dtype=bool)
    want = int(round(held_out_fraction * n)) if n >= 5 else 0
    for i in np.random.default_rng(seed).permutation(n):
        if held.sum() == want:
            break
        if not (first[i] or last[i] or held[order[rank[i] - 1]] or held[order[rank[i] + 1]]):
            held[i] = True
    return ~held, held

"""Kernel-table rows -> a LogGrid over the table's own knots (costmodels/aic.py builds its families with it).

Optionally the rows are first divided by their roofline shape (fixed + max(FLOPs / peak, bytes / BW)),
so that interpolation between knots follows launch-, memory- and compute-bound kinks. Fitted terms: an
L2-capacity step (bytes served faster while one call's data fits in L2), a time per decoded sequence,
and, for collectives, latency + bytes / bandwidth. The held-out error rebuilds the grid without every
fifth interior knot of each axis, fitting the baseline's constants on the kept rows only, and predicts
the rows at those knots.
Ignored: kernel-selection steps between knots (a tile or split change the rows show only where they are
sampled) and the tables' own run-to-run noise; both remain in the held-out error.
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


def l2_jumps(points: np.ndarray, log_ratio: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """log(latency / baseline) just outside the L2 capacity minus just inside, for every pair of rows
    that are neighbouring knots along one axis (other coordinates equal) and straddle the capacity: the
    step itself, not mixed with rows far from it (large batches of short contexts are overhead-bound)."""
    knots = [np.unique(points[:, i]) for i in range(points.shape[1])]
    index = tuple(np.searchsorted(k, points[:, i]) for i, k in enumerate(knots))
    values, is_inside = np.full([len(k) for k in knots], np.nan), np.zeros([len(k) for k in knots], dtype=bool)
    values[index], is_inside[index] = log_ratio, inside
    jumps = []
    for axis in range(values.ndim):
        v, ins = np.moveaxis(values, axis, -1), np.moveaxis(is_inside, axis, -1)
        step = ~np.isnan(v[..., :-1]) & ~np.isnan(v[..., 1:]) & ins[..., :-1] & ~ins[..., 1:]
        jumps.extend((v[..., 1:] - v[..., :-1])[step].tolist())
    return np.array(jumps)


def held_out_error(axes, points: np.ndarray, latency_s: np.ndarray, slopes, baseline: dict | None = None) -> dict:
    """Rebuild without every fifth interior knot of each axis; absolute % error on the rows at them. With a
    `baseline`, its fitted constants (fixed time, L2 speed-up, latency and bandwidth) come from the kept
    rows only, so nothing about a held-out row enters what predicts it."""
    held = np.zeros(len(points), dtype=bool)
    for i in range(points.shape[1]):
        k = np.unique(points[:, i])
        held |= np.isin(points[:, i], k[1:-1][2::5])
    if not held.any() or held.all():
        return {"rows": 0}
    kept_points, kept_s = points[~held], latency_s[~held]
    if baseline is None:
        grid = grid_from_rows(axes, kept_points, kept_s, slopes)
        pred = np.array([grid(*p) for p in points[held]])
    else:
        b = fit_baseline(baseline, kept_points, kept_s)
        grid = grid_from_rows(axes, kept_points, kept_s / baseline_s(b, kept_points), (0.0,) * len(slopes))
        pred = np.array([grid(*p) for p in points[held]]) * baseline_s(b, points[held])
    err = np.abs(pred / latency_s[held] - 1) * 100
    return {"rows": int(held.sum()), "median_pct": round(float(np.median(err)), 2),
            "p90_pct": round(float(np.percentile(err, 90)), 2)}


def _monomials(terms, points: np.ndarray) -> np.ndarray:
    return sum(c * np.prod(points ** np.asarray(e, dtype=float), axis=1) for c, e in terms) if terms else 0.0


def _with_cap(b: dict, points: np.ndarray) -> np.ndarray:
    if not b.get("cap"):
        return points
    axis, divisor, window = b["cap"]
    return np.column_stack([points, np.minimum(points[:, axis] / divisor, window)])


def baseline_s(b: dict, points: np.ndarray) -> np.ndarray:
    """The roofline shape a family's rows are divided by before interpolation: fixed + max(FLOPs / peak,
    bytes / bandwidth), FLOPs and bytes as sums of monomials (coefficient, exponents) of the coordinates;
    `cap` [axis, divisor, window] appends min(x[axis] / divisor, window), the keys a sliding window leaves.
    `l2_bytes`: the bytes one call streams are served `l2_speedup` times faster while they fit in the L2
    cache (decode attention whose whole KV is L2-resident: on L40S, 96 MB, the rows drop ~3x below it).
    `per_seq_s` x points[:, 0] (the batch) is added outside the max: each decoded sequence's own work
    (its query, softmax and split-K reduction, its thread blocks), which no KV streaming hides."""
    points = _with_cap(b, points)
    num_bytes = _monomials(b["bytes"], points)
    bytes_per_s = b["bytes_per_s"]
    if b.get("l2_bytes"):
        bytes_per_s = np.where(num_bytes <= b["l2_bytes"], bytes_per_s * b.get("l2_speedup", 1.0), bytes_per_s)
    per_seq_s = b["per_seq_s"] * points[:, 0] if b.get("per_seq_s") else 0.0
    return b["fixed_s"] + per_seq_s + np.maximum(_monomials(b["flops"], points) / b["peak_flops_per_s"],
                                                 num_bytes / bytes_per_s)


def fit_baseline(b: dict, points: np.ndarray, latency_s: np.ndarray) -> dict:
    """The baseline's constants from these rows: the fixed time (0.8 x the fastest row: launch floor), or,
    for `fit: latency_bandwidth` (collectives), latency + bytes / bandwidth by least squares on relative
    error; with `l2_bytes`, the L2 speed-up as the jump of latency / baseline across the capacity; with
    `per_seq_s`, the time per sequence at the shortest context (batches of 16 and more)."""
    if b.get("fit") == "latency_bandwidth":
        x = _monomials(b["bytes"], _with_cap(b, points))
        (alpha, beta), *_ = np.linalg.lstsq(np.column_stack([1 / latency_s, x / latency_s]),
                                           np.ones(len(x)), rcond=None)
        alpha = max(float(alpha), 0.5 * float(latency_s.min()))   # a noisy fit must not lose the floor
        beta = max(float(beta), 1e-30)
        return {**b, "fixed_s": alpha, "bytes_per_s": 1.0 / beta}
    b = {**b, "fixed_s": 0.8 * float(latency_s.min())}
    if "per_seq_s" in b:   # from the shortest contexts, where each sequence's own work is all there is
        shortest = (points[:, 1] == points[:, 1].min()) & (points[:, 0] >= 16)
        if shortest.any():
            b["per_seq_s"] = float(max(0.0, np.median((latency_s[shortest] - b["fixed_s"]) / points[shortest, 0])))
    if b.get("l2_bytes"):
        b["l2_speedup"], inside = 1.0, _monomials(b["bytes"], _with_cap(b, points)) <= b["l2_bytes"]
        for _ in range(4):   # the fixed time dilutes the step: rescale until the ratio has no jump left
            jumps = l2_jumps(points, np.log(latency_s / baseline_s(b, points)), inside)
            if not len(jumps):
                break
            b["l2_speedup"] = float(max(1.0, b["l2_speedup"] * np.exp(np.median(jumps))))
    return b


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
    err = held_out_error(axes, points, lat, slopes, baseline)
    if baseline is not None:
        baseline = fit_baseline(baseline, points, lat)
        ratio, slopes = lat / baseline_s(baseline, points), (0.0,) * len(slopes)
        return {"grid": grid_from_rows(axes, points, ratio, slopes).to_dict(), "baseline": baseline,
                "held_out": err, "rows": int(len(merged))}
    return {"grid": grid_from_rows(axes, points, lat, slopes).to_dict(), "held_out": err, "rows": int(len(merged))}


# The table guard. A family whose table prices a cell several times slower than the roofline's own
# physical estimate (datasheet peaks at measured efficiencies), or which the model needs far beyond the
# table's last row, is not used: the prior prices it instead and describe()["table_guard"] says why.
# Several times: the prior's efficiencies sit within about 1.5x of every table's rows for the shapes
# the tables measure (docs/fidelity/gpu/kernels.md), so 3x off is a wrong or thin table (an FP8 MoE
# table missing this layout's rows, priced from a neighbouring layout), not a kernel the prior misses.
GUARD_SLOWER = 3.0
# Far beyond: the grid is flat (as a ratio to the baseline) past its last knot; 8x past it on an axis the
# engine reaches is no longer measured.
GUARD_BEYOND = 8.0
# The operating range probed: token counts per step, decode batches and contexts an engine reaches.
PROBE_TOKENS = (1, 16, 128, 1024, 8192)
PROBE_BATCH = (1, 16, 128)
PROBE_CONTEXT = (128, 1024, 8192)


def _beyond(grid, x) -> float:
    """How far past the last knot (a factor >= 1) the coordinates reach on their worst axis."""
    return max(max(1.0, float(v) / float(np.exp(k[-1]))) for v, k in zip(x, grid.log_knots))


def table_guard(m) -> dict:
    """{family: reason} for the table families of AicCostModel `m` to drop (see GUARD_SLOWER)."""
    from costmodels.roofline import RooflineCostModel as Prior
    model, out = m.model, {}
    gemms = list(m.layer_gemms) + list(m.shared_gemms)

    def check(name, probes):
        fam = m._g.get(name)
        if fam is None:
            return
        for x, table_s, prior_s in probes:
            far = _beyond(fam.grid, x) if fam.grid is not None else 1.0
            if far > GUARD_BEYOND:
                out[name] = f"needed at {tuple(round(v) for v in x)}, {far:.0f}x beyond the table's last row"
                return
            if prior_s > 0 and table_s / prior_s > GUARD_SLOWER:
                out[name] = (f"{table_s / prior_s:.1f}x the roofline at {tuple(round(v) for v in x)} "
                             f"({table_s * 1e6:.0f} us vs {prior_s * 1e6:.0f} us)")
                return

    wname = "gemm_weights" if m.wb != m.dt else "gemm_bf16"
    check(wname, [((t, n, k), m._g[wname](t, n, k), Prior._gemm_s(m, t, n, k))
                  for n, k in gemms for t in PROBE_TOKENS] if wname in m._g else [])
    if "moe" in m._g:
        d = m.deployment
        check("moe", [((t * d.data_parallel_size * d.expert_load_imbalance,),
                       m._routed_experts_s(t), Prior._routed_experts_s(m, t)) for t in PROBE_TOKENS])
    if "decode_attn_full" in m._g and not m.mla_modules:
        grid = m._g["decode_attn_full"]
        probes = []
        for b in PROBE_BATCH:
            for c in PROBE_CONTEXT:
                if c <= model.max_model_len:
                    one = Prior._decode_attention_s(m, float(b * c), b) / model.num_layers
                    probes.append(((b, c), grid(float(b), float(c)), one))
        check("decode_attn_full", probes)
    if "allreduce" in m._g and m.tp > 1:
        check("allreduce", [((t * model.hidden_size,), 2 * m._g["allreduce"](float(t * model.hidden_size)),
                             Prior._allreduce_s(m, t)) for t in PROBE_TOKENS])
    return out

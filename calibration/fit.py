"""Turn measurements into a cost profile: one LogGrid per kernel family, fitted on a random 80% of the
points; the other 20% are held out and their median / p90 absolute percentage error is the fit report.

    python -m calibration.fit MEASUREMENTS_DIR --out PROFILE.json

Writes PROFILE.json (the profile the simulator loads, with provenance and held-out errors), and next to
it fit_report.json and fit.png (measured vs predicted, held-out points marked). A family whose held-out
median error exceeds --max-holdout-error-pct (default 25%) is reported loudly and PROFILE.json is not
written (exit 3) unless --keep-bad-fit (calibration.holdout). Families the measurements
lack (the published tables have no elementwise or sampling timings) come from the roofline prior and the
profile says so per family. MoE models get the `moe` family (tokens, top-k, imbalance), MLA models their
MLA attention (in place of prefill_attn / decode_attn) and projection curves, fp8-capable GPUs `gemm_fp8_*`
curves, several GPUs a measured `allreduce` at the profile's TP (costmodels.profile_families prices them).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from calibration import measurements
from calibration.holdout import BAD_FIT_RC, add_quality_options, bad_fit_lines, bad_fits, holdout_limits
from calibration.loggrid_fit import choose_knots, errors, fit_loggrid, monotone, split_interior
from calibration.overheads import fit_overheads, prior_family
from calibration.prefill_tiles import fit_prefill_tiles
from commandline.exits import refuse, run_main
from commandline.outputs import OutputError, out_dir, out_file
from commandline.parser import Parser
from costmodels.catalog import DTYPE_BYTES, GPUS, CatalogError, ModelShape, get_model
from costmodels.profile import (ELEMENTWISE_PER_LAYER, ELEMENTWISE_PER_STEP, FORMAT, LogGrid,
                                attention_heads, decode_coords, gemm_shapes, prefill_coords)
from costmodels.profile_families import extra_gemm_shapes, mla_shape, moe_shape

HELD_OUT_FRACTION = 0.2
# Exponent of latency in each size beyond the measured grid: GEMM time ~ m, n, k once compute-bound;
# prefill attention ~ sequences x length^2; decode attention ~ sequences x context (streams KV).
SLOPES = {"gemm": (1.0, 1.0, 1.0), "prefill_attn": (1.0, 2.0), "decode_attn": (1.0, 1.0), "1d": (1.0,),
          "moe": (1.0, 1.0, 1.0)}   # MoE: routed pairs ~ tokens x top-k; the busiest expert's share
# Curvature penalty per axis. GEMM: firm along tokens (neighbouring m differ by tile effects and noise),
# light across weight shapes (few, far apart). Chosen on held-out splits of the H100 tables with seeds 1-5;
# cross-validation on each fit's training points scales it (choose_smoothing).
SMOOTHING = {"gemm": (3.0, 0.1, 0.1), "prefill_attn": 0.3, "decode_attn": 0.3, "1d": 0.3,
             "moe": (3.0, 0.3, 0.3)}   # as GEMMs along tokens; top-k and imbalance have 3 values each
SMOOTHING_SCALES = (0.1, 0.3, 1.0, 3.0)   # multiples of SMOOTHING that cross-validation chooses from
CV_FOLDS = 5


@dataclass(frozen=True)
class Family:
    """The points of one kernel family in the fit's coordinates, and its physical shape."""
    axes: tuple[str, ...]
    points: np.ndarray          # (n, len(axes)) sizes
    latency_s: np.ndarray
    slopes: tuple[float, ...]
    smoothing: float | tuple[float, ...]
    work: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]   # (FLOPs, bytes) at sizes
    monotone_axes: tuple[int, ...] | None = None   # None: every axis


def datasheet_peaks(gpu_name: str) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) of a catalog GPU; None for a device without a datasheet (a CPU)."""
    gpu = GPUS.get(gpu_name)
    return (gpu.bf16_flops_per_s, gpu.hbm_bytes_per_s) if gpu else None


def family_points(frame: pd.DataFrame, model: ModelShape, tp: int, dtype: str = "bf16") -> dict[str, Family]:
    """The fitted families present in the measurements, in their fit coordinates."""
    e = DTYPE_BYTES[dtype]
    heads, kv_heads, head_dim = attention_heads(model, tp)
    out = {}
    for name, elem in (("gemm", e), ("gemm_fp8", 1)):
        g = frame[frame["family"] == name]
        if len(g):
            out[name] = Family(("m", "n", "k"), g[["m", "n", "k"]].to_numpy(float), g["latency_s"].to_numpy(),
                               SLOPES["gemm"], SMOOTHING["gemm"],
                               lambda p, e=elem: (2 * p[:, 0] * p[:, 1] * p[:, 2],
                                                  e * (p[:, 0] * p[:, 2] + p[:, 1] * (p[:, 2] + p[:, 0]))), (0,))
    out.update(_model_families(frame, model, tp, e))
    attn = frame[(frame["num_heads"] == heads) & (frame["num_kv_heads"] == kv_heads) & (frame["head_dim"] == head_dim)]
    p = attn[attn["family"] == "prefill_attn"]
    if len(p):
        out["prefill_attn"] = Family(
            ("sequences", "length"), _prefill_points(p), p["latency_s"].to_numpy(), SLOPES["prefill_attn"],
            SMOOTHING["prefill_attn"],
            lambda x: (2 * head_dim * heads * x[:, 0] * x[:, 1] * (x[:, 1] + 1),
                       e * head_dim * x[:, 0] * x[:, 1] * (2 * heads + 2 * kv_heads)))
    d = attn[(attn["family"] == "decode_attn") & (attn["op"] != "mixed")]  # mixed lengths: a check, below
    if len(d):
        out["decode_attn"] = Family(
            ("sequences", "context"), d[["batch_size", "context_len"]].to_numpy(float), d["latency_s"].to_numpy(),
            SLOPES["decode_attn"], SMOOTHING["decode_attn"],
            lambda x: (4 * head_dim * heads * x[:, 0] * x[:, 1],
                       e * head_dim * x[:, 0] * (2 * kv_heads * x[:, 1] + 2 * heads)))
    for op in sorted(set(ELEMENTWISE_PER_LAYER) | set(ELEMENTWISE_PER_STEP)):
        rows = frame[(frame["family"] == "elementwise") & (frame["op"] == op)]
        if len(rows):
            out[f"elementwise_{op}"] = _memory_bound(rows)
    s = frame[frame["family"] == "sampling"]
    if len(s):
        out["sampling"] = _memory_bound(s)
    return out


def _prefill_points(rows: pd.DataFrame) -> np.ndarray:
    """The (sequences, length) grid coordinates of measured prefill batches: `batch_size` sequences of
    `new_tokens` each after `cached_tokens`."""
    return np.array([prefill_coords(np.full(b, n, float), np.full(b, c, float))
                     for b, n, c in rows[["batch_size", "new_tokens", "cached_tokens"]].to_numpy(int)])


def _model_families(frame: pd.DataFrame, model: ModelShape, tp: int, e: int) -> dict[str, Family]:
    """The MoE, MLA and all-reduce families of the measurements, for this model's shapes."""
    out = {}
    mo = frame[frame["family"] == "moe"]
    if len(mo) and model.num_moe_layers:
        s = moe_shape(model, tp)
        h, w, experts = s["hidden_size"], s["expert_width"], s["num_experts"]
        mo = mo[(mo["n"] == w) & (mo["k"] == h) & (mo["batch_size"] == experts)]
        out["moe"] = Family(("tokens", "top_k", "imbalance"), mo[["m", "top_k", "imbalance"]].to_numpy(float),
                            mo["latency_s"].to_numpy(), SLOPES["moe"], SMOOTHING["moe"],
                            lambda x: (2 * x[:, 0] * experts * h + 6 * x[:, 0] * x[:, 1] * h * w,
                                       e * (np.minimum(experts, x[:, 0] * x[:, 1]) * 3 * h * w
                                            + x[:, 0] * x[:, 1] * (2 * h + 3 * w))), (0, 1))
    if model.is_mla:
        s = mla_shape(model, tp)
        heads, r, rope, nope, v = (s[k] for k in ("num_heads", "kv_lora_rank", "qk_rope_head_dim",
                                                  "qk_nope_head_dim", "v_head_dim"))
        mla = frame[(frame["num_heads"] == heads) & (frame["head_dim"] == r)]
        p = mla[mla["family"] == "mla_prefill"]
        if len(p):
            out["mla_prefill"] = Family(
                ("sequences", "length"), _prefill_points(p), p["latency_s"].to_numpy(), SLOPES["prefill_attn"],
                SMOOTHING["prefill_attn"],
                lambda x: (heads * (nope + rope + v) * x[:, 0] * x[:, 1] * (x[:, 1] + 1)
                           + 2 * x[:, 0] * x[:, 1] * r * heads * (nope + v),
                           e * x[:, 0] * x[:, 1] * (r + rope + heads * (nope + rope + v))))
        d = mla[mla["family"] == "mla_decode"]
        if len(d):
            out["mla_decode"] = Family(
                ("sequences", "context"), d[["batch_size", "context_len"]].to_numpy(float), d["latency_s"].to_numpy(),
                SLOPES["decode_attn"], SMOOTHING["decode_attn"],
                lambda x: (2 * heads * x[:, 0] * (x[:, 1] * (2 * r + rope) + r * (nope + v)),
                           e * (x[:, 0] * x[:, 1] * (r + rope) + heads * r * (nope + v))))
    for world, rows in frame[frame["family"] == "allreduce"].groupby("num_gpus"):
        out[f"allreduce_tp{int(world)}"] = _memory_bound(rows)
    return out


def _memory_bound(rows: pd.DataFrame) -> Family:
    """A 1-D family over tokens / sequences that streams a fixed number of bytes per one."""
    per_item = float((rows["bytes"] / rows["m"]).median())
    return Family(("m",), rows[["m"]].to_numpy(float), rows["latency_s"].to_numpy(), SLOPES["1d"], SMOOTHING["1d"],
                  lambda x, b=per_item: (np.zeros(len(x)), b * x[:, 0]))


def roofline_baseline(f: Family, fit_rows: np.ndarray, peaks: tuple[float, float] | None):
    """The roofline time `max(FLOPs / peak, bytes / bandwidth) + fixed` the fit divides out. Peaks: the
    datasheet's, else (a CPU) the best the fitted points achieved: the H100's would make the roofline a
    constant on a device 1000x slower, leaving every kink to the curvature penalty. Fixed: most of the
    fastest fitted time (launch-bound at the smallest shapes). Only fitted points are used."""
    flops, bytes_ = f.work(f.points[fit_rows])
    latency = f.latency_s[fit_rows]
    fixed_s = 0.8 * float(latency.min())
    flops_s, bytes_s = peaks or (max(float((flops / latency).max()), 1.0), max(float((bytes_ / latency).max()), 1.0))

    def baseline(points: np.ndarray) -> np.ndarray:
        fl, by = f.work(points)
        return np.maximum(fl / flops_s, by / bytes_s) + fixed_s
    return baseline


def fit_family(f: Family, peaks: tuple[float, float] | None = None, seed: int = 0) -> tuple[LogGrid, dict, np.ndarray]:
    """Fit on the training split. The held-out fifth is drawn from interior points with fitted neighbours
    (fitting.split_interior), so it is interpolated, as the profile is inside the measured grid. The curvature penalty is the family's SMOOTHING times the multiple that cross-validation on the
    training points chose (held-out points are never seen)."""
    train, held = split_interior(f.points, HELD_OUT_FRACTION, seed)
    knots = [choose_knots(f.points[:, a]) for a in range(f.points.shape[1])]
    scale = choose_smoothing(f, train, knots, peaks, seed)
    grid = _fit(f, train, knots, peaks, scale)
    err = errors(grid, f.points[held], f.latency_s[held]) if held.any() else np.array([])
    train_err = errors(grid, f.points[train], f.latency_s[train])
    report = {"num_points": int(len(f.latency_s)), "num_held_out": int(held.sum()),
              "held_out_median_ape": _pct(err, 50), "held_out_p90_ape": _pct(err, 90),
              "train_median_ape": _pct(train_err, 50), "smoothing_scale": scale}
    return grid, report, held


def _fit(f: Family, rows: np.ndarray, knots: list[np.ndarray], peaks, scale: float) -> LogGrid:
    smoothing = tuple(scale * w for w in f.smoothing) if isinstance(f.smoothing, tuple) else scale * f.smoothing
    return fit_loggrid(f.axes, f.points[rows], f.latency_s[rows], knots, f.slopes, smoothing, spaced=True,
                       baseline=roofline_baseline(f, rows, peaks), monotone_axes=f.monotone_axes)


def choose_smoothing(f: Family, train: np.ndarray, knots: list[np.ndarray], peaks, seed: int = 0) -> float:
    """The multiple of SMOOTHING with the lowest median error over CV_FOLDS folds of the training points.
    No one weight suits every device: H100 GEMM tables want the default, a CPU's sharp kink between
    overhead- and compute-bound wants a tenth of it. Too few points to fold: the default."""
    rows = np.flatnonzero(train)
    if len(rows) < 2 * CV_FOLDS:
        return 1.0
    folds = np.array_split(np.random.default_rng(seed).permutation(rows), CV_FOLDS)

    def cv_error(scale: float) -> float:
        err = []
        for fold in folds:
            fit_rows = train.copy()
            fit_rows[fold] = False
            err.append(errors(_fit(f, fit_rows, knots, peaks, scale), f.points[fold], f.latency_s[fold]))
        return float(np.median(np.concatenate(err)))
    return min(SMOOTHING_SCALES, key=cv_error)


def _pct(err: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(err, q)) * 100, 2) if len(err) else None


def gemm_curves(grid3: LogGrid, model: ModelShape, tp: int, prefix: str = "gemm_") -> dict[str, dict]:
    """The model's GEMMs (N, K) as 1-D curves over tokens, on the fitted m knots (MoE shared experts and
    MLA projections included: costmodels.profile_families.extra_gemm_shapes)."""
    m_knots = np.exp(grid3.log_knots[0])
    curves = {}
    for op, (n, k) in {**gemm_shapes(model, tp), **extra_gemm_shapes(model, tp)}.items():
        values = monotone(np.log([grid3(m, n, k) for m in m_knots]), 0)
        curves[f"{prefix}{op}"] = LogGrid(("m",), (grid3.log_knots[0],), values, (1.0,)).to_dict()
    return curves


def _add_model_families(families: dict, sources: dict, fitted: dict, model: ModelShape, tp: int,
                        source: str) -> None:
    """fp8 GEMM curves, the MoE grid, MLA attention as the profile's prefill_attn / decode_attn (same
    coordinates: sequences x equivalent length, sequences x mean context), the all-reduce at this TP."""
    if "gemm_fp8" in fitted:
        families.update(gemm_curves(fitted["gemm_fp8"], model, tp, prefix="gemm_fp8_"))
        sources["gemm_fp8"] = "measured"
    if "moe" in fitted:
        families["moe"], sources["moe"] = fitted["moe"].to_dict(), "measured"
    if model.is_mla:
        for name, mla in (("prefill_attn", "mla_prefill"), ("decode_attn", "mla_decode")):
            if mla not in fitted:
                raise measurements.MeasurementError(f"{source}: {model.name} is an MLA model; no {mla} timings")
            families[name], sources[name] = fitted[mla].to_dict(), f"measured ({mla})"
    if f"allreduce_tp{tp}" in fitted:
        families["allreduce"] = fitted[f"allreduce_tp{tp}"].to_dict()
        sources["allreduce"] = f"measured (NCCL, {tp} GPUs)"


def _prefill_by_tiles(families: dict, sources: dict, report: dict, plots: dict, frame: pd.DataFrame,
                      model: ModelShape, tp: int, gpu: str) -> None:
    """Prefill attention as FlashAttention's tiles on this GPU (calibration/prefill_tiles.py) where that
    predicts the held-out timings better than the sequences x equivalent-length grid: a chunk after a
    cached prefix, which the grid cannot tell from a fresh prompt of the same work. The report keeps the
    grid's error beside it."""
    if model.is_mla or "prefill_attn" not in report:
        return
    heads, kv_heads, head_dim = attention_heads(model, tp)
    tiles = fit_prefill_tiles(frame, GPUS.get(gpu), heads, kv_heads, head_dim, HELD_OUT_FRACTION)
    if tiles is None:
        return
    fit, tile_report, plot_data = tiles
    grid = report["prefill_attn"]
    if grid["held_out_median_ape"] is not None and grid["held_out_median_ape"] <= tile_report["held_out_median_ape"]:
        return
    families["prefill_attn_tiles"] = fit.to_dict()
    sources["prefill_attn"] = "measured (FlashAttention tiles: calibration/prefill_tiles.py)"
    report["prefill_attn"] = {**tile_report, "grid_held_out_median_ape": grid["held_out_median_ape"]}
    plots["prefill_attn"] = plot_data


def build_profile(frame: pd.DataFrame, meta: dict, source: str, gpu_override: str | None = None):
    """(profile dict, report dict, plot data) from successful measurement rows and their metadata."""
    model = get_model(meta["model"]) if "model_shape" not in meta else ModelShape(**meta["model_shape"])
    tp, dtype, gpu = int(meta.get("tp", 1)), meta.get("dtype", "bf16"), gpu_override or meta["gpu"]
    fitted, report, plots = {}, {}, {}
    for name, fam in family_points(frame, model, tp, dtype).items():
        grid, report[name], held = fit_family(fam, datasheet_peaks(gpu))
        fitted[name] = grid
        plots[name] = (fam.latency_s, np.array([grid(*p) for p in fam.points]), held)
    if "gemm" not in fitted:
        raise measurements.MeasurementError(f"{source}: no GEMM timings for {model.name}; nothing to fit")
    families = gemm_curves(fitted["gemm"], model, tp)
    sources = {"gemm": "measured"}
    _add_model_families(families, sources, fitted, model, tp, source)
    _prefill_by_tiles(families, sources, report, plots, frame, model, tp, gpu)
    for name in ("prefill_attn", "decode_attn", "sampling"):
        if name in families or (name == "prefill_attn" and "prefill_attn_tiles" in families):  # MLA, tiles
            continue
        if name in fitted:
            families[name], sources[name] = fitted[name].to_dict(), "measured"
        else:
            families[name], sources[name] = prior_family(name, model, gpu, tp, dtype).to_dict(), "roofline prior"
    families["elementwise"] = {}
    for op in sorted(set(ELEMENTWISE_PER_LAYER) | set(ELEMENTWISE_PER_STEP)):
        grid = fitted.get(f"elementwise_{op}") or prior_family(f"elementwise_{op}", model, gpu, tp, dtype)
        families["elementwise"][op] = grid.to_dict()
        sources[f"elementwise_{op}"] = "measured" if f"elementwise_{op}" in fitted else "roofline prior"
    name = meta.get("name") or f"{model.name}@{gpu} tp{tp} {dtype} ({meta.get('source')})"
    profile = {"format": FORMAT, "name": name,
               "model": model.name, "gpu": gpu, "tp": tp, "dtype": dtype,
               "shapes": {"gemm": {op: list(s) for op, s in gemm_shapes(model, tp).items()},
                          "attention_heads": list(attention_heads(model, tp)),
                          **({"extra_gemm": {op: list(s) for op, s in extra_gemm_shapes(model, tp).items()}}
                             if extra_gemm_shapes(model, tp) else {}),
                          **({"moe": moe_shape(model, tp)} if "moe" in families else {}),
                          **({"mla": mla_shape(model, tp)} if model.is_mla else {})},
               "families": families, "family_sources": sources}
    profile["overheads"], report["composition"] = fit_overheads(profile, frame, model)
    mixed = frame[(frame["family"] == "decode_attn") & (frame["op"] == "mixed")]
    if len(mixed) and "decode_attn" in fitted:  # does (batch, mean context) stand for a mixed batch?
        pred = [fitted["decode_attn"](*decode_coords(json.loads(b))) for b in mixed["batch"]]
        report["composition"]["decode_mixed_lengths_error_pct"] = [
            round(float(x), 1) for x in (np.array(pred) / mixed["latency_s"].to_numpy() - 1) * 100]
    profile["fit_report"] = {k: v for k, v in report.items() if k != "composition"}
    profile["provenance"] = {k: v for k, v in meta.items() if k not in ("grid_spec",)} | {
        "measurements": source, "held_out_fraction": HELD_OUT_FRACTION, "fit": "calibration.fit LogGrid"}
    return profile, report, plots


def plot(plots: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(plots)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axs = plt.subplots(rows, cols, figsize=(4 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, (meas, pred, held)) in zip(axs.ravel(), plots.items()):
        ax.loglog(meas[~held] * 1e3, pred[~held] * 1e3, ".", ms=3, alpha=0.5, label="fitted")
        ax.loglog(meas[held] * 1e3, pred[held] * 1e3, "x", ms=4, color="C3", label="held out")
        lo, hi = meas.min() * 1e3, meas.max() * 1e3
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.set(title=name, xlabel="measured ms", ylabel="predicted ms")
        ax.legend(fontsize=7)
    for ax in axs.ravel()[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_lines(report: dict) -> list[str]:
    lines = [f"{'family':24s} {'points':>7s} {'held out':>8s} {'median APE':>11s} {'p90 APE':>8s}"]
    for name, r in report.items():
        if name == "composition":
            continue
        med, p90 = r["held_out_median_ape"], r["held_out_p90_ape"]
        lines.append(f"{name:24s} {r['num_points']:7d} {r['num_held_out']:8d} "
                     f"{'-' if med is None else f'{med:.2f}%':>11s} {'-' if p90 is None else f'{p90:.2f}%':>8s}")
    for name, c in report.get("composition", {}).items():
        lines.append(f"composition {name}: {c}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m calibration.fit", description=__doc__.splitlines()[0])
    ap.add_argument("measurements", type=Path, help="folder with measurements.csv and meta.json")
    ap.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    ap.add_argument("--gpu", help="catalog GPU name the profile is for (default: from meta.json)")
    ap.add_argument("--name", help="profile name (default: model@gpu tp dtype (source))")
    ap.add_argument("--report-dir", type=Path, help="where fit_report.json and fit.png go (default: the "
                    "profile's folder)")
    add_quality_options(ap)
    args = ap.parse_args(argv)
    try:
        limits = holdout_limits(args.max_holdout_error_pct)
    except ValueError as e:
        ap.error(str(e))
    if args.gpu and args.gpu != "cpu" and args.gpu.lower() not in GPUS:
        ap.error(f"--gpu {args.gpu}: not a catalog GPU (known: {', '.join(GPUS)}, or cpu)")
    try:
        out_file(args.out)
        out_dir(args.report_dir or args.out.parent, "--report-dir" if args.report_dir else "--out")
        frame, meta = measurements.read(args.measurements)
        if args.name:
            meta["name"] = args.name
        profile, report, plots = build_profile(frame, meta, str(args.measurements), args.gpu)
    except (measurements.MeasurementError, CatalogError, OutputError) as e:
        return refuse(e)
    bad = bad_fits(report, limits)
    quality = {"max_holdout_error_pct": limits, "bad_families": bad,
               "kept_despite_bad_fit": bool(bad) and args.keep_bad_fit}
    report_dir = args.report_dir or args.out.parent
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "fit_report.json").write_text(json.dumps(report | {"fit_quality": quality}, indent=2) + "\n")
    plot(plots, report_dir / "fit.png")
    print("\n".join(report_lines(report)))
    if bad and not args.keep_bad_fit:
        lines = bad_fit_lines(bad, False, args.measurements, args.out)
        if args.out.exists():  # an earlier fit's profile would pass for a fit of these measurements
            args.out.unlink()
            lines.insert(-1, f"Removed the {args.out} an earlier fit had left there.")
        print("\n".join(lines), file=sys.stderr)
        return BAD_FIT_RC
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile | {"fit_quality": quality}, indent=1) + "\n")
    if bad:
        print("\n".join(bad_fit_lines(bad, True, args.measurements, args.out)), file=sys.stderr)
    print(f"wrote {args.out}, {report_dir / 'fit_report.json'}, {report_dir / 'fit.png'}")
    return 0


if __name__ == "__main__":
    run_main(main, (measurements.MeasurementError, CatalogError))

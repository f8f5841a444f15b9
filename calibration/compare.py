"""Compare a real run with the simulator, or two cost models with each other.

    python -m calibration.compare RUN [RUN ...] [--config POINT.yaml] [--profile P] [--out DIR]
    python -m calibration.compare PROFILE_A PROFILE_B [--model llama-3-8b --gpu h200-sxm]

First form: RUN is any real run calibration/realruns.py reads (a calibration.vllm_run folder, vllm bench
serve or GuideLLM JSON, a per-request CSV). Each run's exact requests (same send times, same lengths) are
replayed through our engine with the point's configuration (--config, else the one vllm_run recorded) and
cost model (--profile, else the point's own `profile:` or the automatic choice), and the report gives per
point the real runs' median and range (min-max over the repeats) and the simulated median of p50/p99 TTFT,
ITL, TPOT, E2E and throughput, whether the simulation lies inside the real range and its error to the real
median, and, where the engine recorded its steps, the error of the cost model's price of every real step.
Writes compare.csv and compare.md under --out.

Second form: each argument a profile path, a shipped profile name, or "roofline"; prints B / A at
representative shapes (ratio above 1: B predicts slower).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from costmodels.catalog import CatalogError, get_gpu, get_model
from costmodels.profile import GEMM_OPS, ProfileCostModel, read_profile
from costmodels.registry import PROFILES_DIR, load_cost_model

KERNELS = [(f"gemm_{op} m={m}", "gemm", op, m) for op in (*GEMM_OPS, "lm_head") for m in (1, 64, 512, 4096, 16384)]
ATTENTION = [("prefill_attn 1x512", "prefill_attn", 1, 512), ("prefill_attn 1x4096", "prefill_attn", 1, 4096),
             ("prefill_attn 8x1024", "prefill_attn", 8, 1024), ("decode_attn 1x1024", "decode_attn", 1, 1024),
             ("decode_attn 64x2048", "decode_attn", 64, 2048), ("decode_attn 256x4096", "decode_attn", 256, 4096)]
STEPS = [("decode 1 x ctx 512", [], [512]), ("decode 64 x ctx 2048", [], [2048] * 64),
         ("decode 256 x ctx 1024", [], [1024] * 256), ("prefill 512", [(512, 0)], []),
         ("prefill 4096", [(4096, 0)], []), ("chunk 512 + 32 decodes", [(512, 1024)], [1500] * 32)]


def kernel_s(cost, family: str, a, b) -> float | None:
    """A single kernel's time from a profile (None for the roofline prior, which has no kernel table)."""
    if not isinstance(cost, ProfileCostModel):
        return None
    if family == "gemm":
        return cost.gemm[a](b)
    return (cost.prefill_attn if family == "prefill_attn" else cost.decode_attn)(a, b)


def compare(a, b) -> list[tuple[str, float | None, float | None]]:
    rows = [(name, kernel_s(a, fam, x, y), kernel_s(b, fam, x, y)) for name, fam, x, y in KERNELS + ATTENTION]
    rows += [(f"step: {name}", a.step_time_s(p, d), b.step_time_s(p, d)) for name, p, d in STEPS]
    return rows


def _describe_target(arg: str) -> dict:
    if arg == "roofline":
        return {}
    path = PROFILES_DIR / f"{arg}.json" if (PROFILES_DIR / f"{arg}.json").exists() else arg
    return read_profile(path)


RUN_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
               "e2e_p50_ms", "e2e_p99_ms", "throughput_rps")


def compare_runs(runs, point: dict | None, profile: str | None):
    """Per point and metric: real median, min, max over the repeats; simulated median; inside the range;
    error to the real median. And the step-time error over all recorded steps."""
    import numpy as np
    import pandas as pd
    from calibration.fit_engine import step_errors
    from calibration.realruns import replay, replay_config
    from experiments.simulate import point_cost_model
    rows, step_rows = [], []
    by_point: dict[str, list] = {}
    for r in runs:
        by_point.setdefault(r.point, []).append(r)
    for label, group in by_point.items():
        cfg = replay_config(group[0], point)
        if profile is not None:
            cfg = dataclasses.replace(cfg, profile=profile)
        cost = point_cost_model(cfg)
        real = [g.summary for g in group]
        sim = [replay(g, replay_config(g, point), cost_model=cost).summary for g in group]
        for m in RUN_METRICS:
            rv = np.array([x.get(m, np.nan) for x in real], dtype=float)
            sv = np.array([x.get(m, np.nan) for x in sim], dtype=float)
            if not np.isfinite(rv).any():
                continue
            med, s_med = float(np.nanmedian(rv)), float(np.nanmedian(sv))
            rows.append({"point": label, "metric": m, "repeats": int(np.isfinite(rv).sum()), "real_median": med,
                         "real_min": float(np.nanmin(rv)), "real_max": float(np.nanmax(rv)), "sim_median": s_med,
                         "in_range": bool(np.nanmin(rv) <= s_med <= np.nanmax(rv)),
                         "err_to_median_pct": (s_med / med - 1) * 100 if med else np.nan,
                         "real_spread_pct": (np.nanmax(rv) - np.nanmin(rv)) / med * 100 if med else np.nan})
        e = step_errors(cost, group)
        if e:
            step_rows.append({"point": label, **e})
        cost_kind = cost.describe().get("kind", "?")
    return pd.DataFrame(rows), pd.DataFrame(step_rows), cost_kind


def main_runs(args) -> int:
    from pathlib import Path
    from calibration.realruns import RealRunError, read_runs
    from experiments.config import ConfigError, load_sweep_file
    try:
        point = load_sweep_file(args.config) if args.config else None
        if point is not None and point.get("grid"):
            raise ConfigError(f"--config {args.config}: give one point (no grid)")
        runs = [r for path in args.targets for r in read_runs(path)]
        metrics, steps, kind = compare_runs(runs, point, args.profile)
    except (RealRunError, ConfigError, CatalogError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = run_report(metrics, steps, kind, args)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        metrics.to_csv(out / "compare.csv", index=False)
        if len(steps):
            steps.to_csv(out / "compare_steps.csv", index=False)
        (out / "compare.md").write_text(text)
    return 0


def run_report(metrics, steps, kind: str, args) -> str:
    lines = [f"Real runs vs simulation (cost model: {kind}{', ' + args.profile if args.profile else ''})", "",
             "| point | metric | repeats | real median | real range | sim | in range | err % |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in metrics.iterrows():
        lines.append(f"| {r['point']} | {r['metric']} | {r['repeats']} | {r['real_median']:.4g} | "
                     f"{r['real_min']:.4g}-{r['real_max']:.4g} | {r['sim_median']:.4g} | "
                     f"{'yes' if r['in_range'] else 'no'} | {r['err_to_median_pct']:+.1f} |")
    if len(metrics):
        lines += ["", f"{int(metrics['in_range'].sum())} of {len(metrics)} simulated values inside the real range; "
                      f"{int((metrics['err_to_median_pct'].abs() <= 5).sum())} within 5% of the real median."]
    if len(steps):
        lines += ["", "| point | steps | step error median | p90 | total time | noise floor median | p90 |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['point']} | {r['steps']} | {r['median_ape_pct']}% | {r['p90_ape_pct']}% | "
                  f"{r['total_time_err_pct']:+}% | {r.get('noise_floor_median_ape_pct', float('nan'))}% | "
                  f"{r.get('noise_floor_p90_ape_pct', float('nan'))}% |" for _, r in steps.iterrows()]
        lines += ["", "Noise floor: each step against the median of its run's steps of the same shape (seen 5+ "
                      "times), the error of a model that knew every shape's typical time."]
    return "\n".join(lines) + "\n"


def _looks_like_run(target: str) -> bool:
    from pathlib import Path
    p = Path(target)
    return p.is_dir() or p.suffix.lower() == ".csv" or (p.suffix.lower() == ".json" and _not_profile(p))


def _not_profile(p) -> bool:
    try:
        return json.loads(p.read_text()).get("format") not in ("batchsim-profile/1", "batchsim-stepfit/1")
    except (OSError, ValueError, AttributeError):
        return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    if "--config" in argv or (first is not None and _looks_like_run(first)):
        ap = argparse.ArgumentParser(prog="python -m calibration.compare", description=__doc__.splitlines()[0])
        ap.add_argument("targets", nargs="+", metavar="RUN")
        ap.add_argument("--config", help="POINT.yaml (default: the configuration vllm_run recorded)")
        ap.add_argument("--profile", help="cost model to simulate with (default: the point's own)")
        ap.add_argument("--out", help="folder for compare.csv and compare.md")
        return main_runs(ap.parse_args(argv))
    ap = argparse.ArgumentParser(prog="python -m calibration.compare", description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--model", help="default: the profiles' model")
    ap.add_argument("--gpu", help="default: the profiles' GPU")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        found = [_describe_target(x) for x in (args.a, args.b)]
        ref = next((p for p in found if p), None)
        if ref is None and not (args.model and args.gpu):
            ap.error("comparing roofline with roofline needs --model and --gpu")
        model = get_model(args.model or ref["model"])
        gpu = get_gpu(args.gpu or ref["gpu"]) if (args.gpu or ref["gpu"] in _gpus()) else None
        tp, dtype = (ref["tp"], ref["dtype"]) if ref else (1, "bf16")
        costs = [load_cost_model(x, model, gpu or get_gpu("h100-sxm"), tp, dtype) for x in (args.a, args.b)]
    except CatalogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = compare(*costs)
    if args.json:
        print(json.dumps([{"shape": n, "a_s": x, "b_s": y} for n, x, y in rows], indent=1))
        return 0
    print(f"A = {args.a}\nB = {args.b}\n{'shape':34s} {'A ms':>10s} {'B ms':>10s} {'B/A':>6s}")
    for name, x, y in rows:
        if x is None or y is None:
            continue
        print(f"{name:34s} {x * 1e3:10.4f} {y * 1e3:10.4f} {y / x:6.2f}")
    return 0


def _gpus():
    from costmodels.catalog import GPUS
    return GPUS


if __name__ == "__main__":
    sys.exit(main())

"""Fit our step model to real engine runs, judge it on runs it did not see, and write it as a profile.

    python -m fidelity.fit_engine RUN [RUN ...] --out PROFILE.json [--config POINT.yaml]
                                     [--holdout LABEL ...] [--keep-bad-fit] [--no-moe-term]

RUN: a `fidelity.vllm_run` folder (or one run in it), a `vllm bench serve --save-detailed` JSON, a
GuideLLM benchmarks JSON, or a per-request CSV (fidelity/realruns.py). The result is a whole-step model
(costmodels/stepmodel.py) that `experiments.run` takes as `profile: PROFILE.json`:

- Runs with engine steps (vllm_run records every vLLM step: its requests' new and cached tokens and its
  wall time) fit the step terms directly: non-negative least squares on relative error over every step,
  the same fit as fidelity.stepfit. A MoE model (num_experts in its config.json) gets one more term,
  the experts its tokens reach per step (costmodels.stepmodel.MoeTerm; `--no-moe-term` leaves it out).
  The per-request fixed latency is measured, not fitted: the floor (10th percentile) of the time from
  the client's send to the request reaching vLLM's scheduler (input processing, IPC; above the floor it
  is waiting for a step to end, which our engine models) plus the median time from the step that sampled
  a request's first token to the client receiving it (output processing, streaming).
- Runs with per-request times on the engine's clock and no steps (LLMServingSim's run format: queued,
  scheduled, first- and last-token times) fit four step terms in closed form, in well under a second
  (fidelity/request_fit.py): each request's decode interval holds exactly output - 1 steps, and the
  work of those steps is rebuilt from every request's times; per_step_s, per_token_s,
  per_decode_seq_s and per_decode_ctx_s by relative-error least squares. The fixed latency is 0: those
  times are the engine's own (in-process AsyncLLM, no front end). `--fit timestamps` fits any run
  without steps this way.
- Runs with client-side times only (vllm bench serve, GuideLLM, CSV) fit five step terms and the fixed
  latency by replay (`--fit replay`, the default for them): our engine replays each run's exact requests (same send times, same lengths) and
  Nelder-Mead minimises the squared log error of TTFT p50/p90, TPOT p50/p90, E2E p50 and throughput
  (these five terms also for a MoE model: no MoE term in a fit by replay).

Held out: runs are grouped by point (a point's repeats stay together). With `--holdout LABEL`, runs whose
point or name contains a label are left out of the fit and the profile's error is reported on them; without
it, each point is left out in turn (leave-one-point-out) and the profile itself is fitted on all of them.
The report (PROFILE.md beside PROFILE.json) gives per held-out run the real and simulated p50/p99 TTFT,
TPOT, ITL, E2E, throughput and the step-time error. A fit whose held-out error exceeds the thresholds
(--max-step-error-pct on the median step, --max-metric-error-pct on the median metric) is refused: the
profile is written as PROFILE.refused.json and the command exits 3, unless --keep-bad-fit.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from commandline.argtypes import non_negative_float, positive_int
from commandline.exits import refuse, run_main
from commandline.outputs import OutputError, out_file
from commandline.parser import Parser
from costmodels.catalog import CatalogError
from fidelity.realruns import RealRun, RealRunError, read_runs, replay, replay_config
from fidelity.request_fit import DECODE_INTERVALS, RequestFitError, fit_step_terms
from fidelity.runchecks import failed_requests_line
from fidelity.stepfit import (TERMS, StepFitCostModel, fit_held_out, fit_step_model, step_error_summary,
                              step_features)
from costmodels.stepmodel import MoeTerm
from experiments.config import ConfigError, load_sweep_file

METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
           "e2e_p50_ms", "e2e_p99_ms", "throughput_rps")
REPLAY_TERMS = ("per_step_s", "per_token_s", "per_decode_seq_s", "per_decode_ctx_s", "per_attn_pair_s")
REPLAY_TARGETS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms", "throughput_rps")


class FitError(ValueError):
    """Runs that cannot be fitted as asked; one line."""


# ---- the pieces ----
def step_data(runs: list[RealRun]) -> tuple[list[dict], np.ndarray]:
    """Every recorded engine step of `runs`: what our cost model is asked (prefill, decode, num_logits) and
    its measured time."""
    args, y = [], []
    for r in runs:
        if r.steps is None:
            continue
        for pf, dc, nl, d in zip(r.steps["prefill"], r.steps["decode"], r.steps["num_logits"], r.steps["duration_s"]):
            if (pf or dc) and d > 0:
                args.append({"prefill": [tuple(x) for x in pf], "decode": list(dc), "num_logits": int(nl)})
                y.append(float(d))
    return args, np.asarray(y)


def step_errors(cost_model, runs: list[RealRun]) -> dict | None:
    """Relative error of the model's price of every recorded step: median and p90 of |error|, the bias of
    the summed time (throughput), and the noise floor: the same statistics for the best any model of the
    step's shape could do, each step against the median of the steps of its run with the same shape
    (prefills, number of decodes, decode context to 64 tokens), over shapes seen at least 5 times."""
    args, y = step_data(runs)
    if not len(y):
        return None
    out = step_error_summary(y, [cost_model.step_time_s(**a) for a in args])
    floor = []
    for r in runs:
        a, t = step_data([r])
        keys = [(tuple(map(tuple, x["prefill"])), len(x["decode"]), round(sum(x["decode"]) / 64)) for x in a]
        df = pd.DataFrame({"key": keys, "y": t})
        med = df.groupby("key")["y"].transform("median")
        n = df.groupby("key")["y"].transform("size")
        floor.extend((np.abs(df["y"] / med - 1))[n >= 5].tolist())
    if floor:
        out["noise_floor_median_ape_pct"] = round(float(np.median(floor) * 100), 2)
        out["noise_floor_p90_ape_pct"] = round(float(np.percentile(floor, 90) * 100), 2)
        out["noise_floor_steps"] = len(floor)
    return out


def measured_latency(runs: list[RealRun]) -> dict | None:
    """The fixed per-request latency outside the engine's steps, measured on runs that carry engine-side
    times (vllm_run). Input side: send -> the scheduler has it, its 10th percentile: a request sent during
    a step waits for the step to end before the engine core reads it (our engine models that wait as
    queueing), and a burst of sends queues in the front end, so only the floor is fixed (on this machine
    the floor was the same as a lone closed-loop user's median). Output side: the end of the step that
    sampled the first token -> the client has it, its median."""
    ins, outs = [], []
    for r in runs:
        q = r.requests
        if {"engine_arrival_s", "engine_first_token_s"} <= set(q.columns):
            ins.extend((q["engine_arrival_s"] - q["arrival_s"]).dropna().tolist())
            outs.extend((q["first_token_s"] - q["engine_first_token_s"]).dropna().tolist())
    if not ins or not outs:
        return None
    i, o = max(0.0, float(np.percentile(ins, 10))), max(0.0, float(np.median(outs)))
    return {"request_latency_s": i + o, "input_s": i, "output_s": o, "requests": len(ins)}


def compare_run(run: RealRun, cfg, cost_model) -> dict:
    """Real and simulated metrics of one run, the simulation replaying its exact requests."""
    sim = replay(run, cfg, cost_model=cost_model).summary
    real = run.summary
    row = {"run": run.name, "point": run.point}
    for m in METRICS:
        rv, sv = real.get(m, np.nan), sim.get(m, np.nan)
        row[f"real_{m}"], row[f"sim_{m}"] = rv, sv
        row[f"err_{m}"] = (sv / rv - 1) * 100 if rv and np.isfinite(rv) and np.isfinite(sv) else np.nan
    e = step_errors(cost_model, [run])
    if e:
        row.update({f"step_{k}": v for k, v in e.items()})
    return row


def moe_term(model_shape) -> MoeTerm | None:
    """The MoE term's shape (coefficient 0) for a MoE model, None for a dense one."""
    if not getattr(model_shape, "num_experts", 0):
        return None
    return MoeTerm(model_shape.num_moe_layers, model_shape.num_experts, model_shape.experts_per_token)


def fit_moe_step_model(args: list[dict], y: np.ndarray, moe: MoeTerm, source: str, dtype: str) -> StepFitCostModel:
    """fit_step_model with the MoE column (expert passes of the step's tokens) beside the dense terms: the
    same relative-error NNLS and the same random 20% of steps held out."""
    tokens = [sum(n for n, _ in a["prefill"]) + len(a["decode"]) for a in args]
    x = np.array([np.append(step_features(**a), moe.active_experts(t)) for a, t in zip(args, tokens)])
    coef, held_out = fit_held_out(x, y, 0.2, 0)
    return StepFitCostModel(tuple(float(c) for c in coef[:-1]), source, None, held_out, dtype,
                            moe=dataclasses.replace(moe, per_active_expert_s=float(coef[-1])))


def fit_on_steps(runs: list[RealRun], source: str, dtype: str, moe: MoeTerm | None = None) -> StepFitCostModel:
    args, y = step_data(runs)
    need = len(TERMS) + (moe is not None)
    if len(y) < need:
        raise FitError(f"{len(y)} recorded engine steps in the fit runs; need at least {need}")
    if moe is None:
        model = fit_step_model(args, y, source=source, holdout=0.2, seed=0, dtype=dtype)
    else:
        model = fit_moe_step_model(args, y, moe, source, dtype)
    lat = measured_latency(runs)
    return dataclasses.replace(model, request_latency_s=lat["request_latency_s"] if lat else 0.0)


def _initial_guess(runs: list[RealRun]) -> np.ndarray:
    tpot = np.nanmin([r.summary["tpot_p50_ms"] for r in runs]) / 1e3
    ttft = np.nanmin([r.summary["ttft_p50_ms"] for r in runs]) / 1e3
    prompt = float(np.median(np.concatenate([r.requests["prompt_tokens"].to_numpy() for r in runs])))
    per_step = 0.8 * tpot if np.isfinite(tpot) else 1e-2
    per_token = max(1e-8, (ttft - per_step) / max(prompt, 1.0) * 0.5) if np.isfinite(ttft) else 1e-5
    return np.array([per_step, per_token, 0.05 * per_step, 1e-8, 1e-10, 0.2 * ttft if np.isfinite(ttft) else 1e-3])


def fit_by_replay(runs: list[RealRun], cfgs: list, source: str, dtype: str, maxiter: int = 150) -> StepFitCostModel:
    """Step terms and fixed latency fitted so that replays match the runs' client-side metrics."""
    idx = [TERMS.index(t) for t in REPLAY_TERMS]
    real = [r.summary for r in runs]

    def model_of(x: np.ndarray) -> StepFitCostModel:
        theta = np.exp(x)
        coef = np.zeros(len(TERMS))
        coef[idx] = theta[:-1]
        return StepFitCostModel(tuple(coef), source, None, None, dtype, float(theta[-1]))

    def loss(x: np.ndarray) -> float:
        m = model_of(x)
        total, n = 0.0, 0
        for run, cfg, rs in zip(runs, cfgs, real):
            ss = replay(run, cfg, cost_model=m).summary
            for k in REPLAY_TARGETS:
                a, b = rs.get(k, np.nan), ss.get(k, np.nan)
                if a and b and np.isfinite(a) and np.isfinite(b) and a > 0 and b > 0:
                    total += np.log(b / a) ** 2
                    n += 1
        return total / max(n, 1)

    x0 = np.log(_initial_guess(runs))
    res = minimize(loss, x0, method="Nelder-Mead", options={"maxiter": maxiter, "xatol": 1e-3, "fatol": 1e-6})
    model = model_of(res.x)
    return dataclasses.replace(model, held_out={"replay_fit_rmse_log": round(float(np.sqrt(res.fun)), 4)})


def fit_on_timestamps(runs: list[RealRun], cfgs: list, source: str, dtype: str) -> StepFitCostModel:
    """Four step terms in closed form from the requests' own times (fidelity/request_fit.py)."""
    budgets = [int(getattr(c.policy, "max_num_batched_tokens", 2048) or 2048) for c in cfgs]
    dps = [int(c.deployment.data_parallel_size) if c.deployment is not None else 1 for c in cfgs]
    try:
        return fit_step_terms(runs, budgets, dps, source, dtype)
    except RequestFitError as e:
        raise FitError(f"{', '.join(r.name for r in runs)}: {e}") from None


def fit(runs: list[RealRun], cfgs: list, source: str, dtype: str, replay_iterations: int = 200,
        use_moe_term: bool = True, method: str = "auto") -> StepFitCostModel:
    if all(r.steps is not None for r in runs):
        return fit_on_steps(runs, source, dtype, moe_term(cfgs[0].model) if use_moe_term else None)
    if any(r.steps is not None for r in runs):
        raise FitError("mix of runs with and without engine steps; fit them separately")
    if method == "timestamps" or (method == "auto" and all(r.format == "llmservingsim" for r in runs)):
        return fit_on_timestamps(runs, cfgs, source, dtype)
    return fit_by_replay(runs, cfgs, source, dtype, replay_iterations)


def _summarise_errors(rows: list[dict]) -> dict:
    df = pd.DataFrame(rows)
    errs = df[[f"err_{m}" for m in METRICS if f"err_{m}" in df]].abs().to_numpy().ravel()
    errs = errs[np.isfinite(errs)]
    out = {"runs": len(df), "metric_median_abs_err_pct": round(float(np.median(errs)), 2) if len(errs) else None,
           "metric_max_abs_err_pct": round(float(np.max(errs)), 2) if len(errs) else None}
    if "step_median_ape_pct" in df:
        w = df["step_steps"].to_numpy(dtype=float)
        out["step_median_ape_pct"] = round(float(np.average(df["step_median_ape_pct"], weights=w)), 2)
        out["step_p90_ape_pct"] = round(float(np.average(df["step_p90_ape_pct"], weights=w)), 2)
    return out


# ---- the command ----
def parse_args(argv):
    ap = Parser(prog="python -m fidelity.fit_engine", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="real runs (see the module docstring for the formats)")
    ap.add_argument("--out", required=True, help="the profile to write (PROFILE.json)")
    ap.add_argument("--config", help="POINT.yaml: the engine the runs ran (needed unless vllm_run recorded it)")
    ap.add_argument("--holdout", nargs="*", default=None, help="point labels (substrings) to leave out of the fit")
    ap.add_argument("--max-step-error-pct", type=non_negative_float, default=10.0,
                    help="refuse the fit above this held-out median step error (default 10)")
    ap.add_argument("--max-metric-error-pct", type=non_negative_float, default=15.0,
                    help="refuse the fit above this held-out median metric error (default 15)")
    ap.add_argument("--replay-iterations", type=positive_int, default=200,
                    help="Nelder-Mead iterations of a fit by replay (runs without engine steps)")
    ap.add_argument("--fit", choices=("auto", "timestamps", "replay"), default="auto",
                    help="how runs without engine steps are fitted: timestamps (closed form from per-request "
                         "times), replay, or auto (timestamps for engine-clock runs, replay for client-side ones)")
    ap.add_argument("--keep-bad-fit", action="store_true", help="write the profile even when the thresholds fail")
    ap.add_argument("--no-moe-term", action="store_true",
                    help="fit a MoE model with the dense terms only (to see what the MoE term buys)")
    return ap.parse_args(argv)


def _point_config(args) -> dict | None:
    if not args.config:
        return None
    raw = load_sweep_file(args.config)
    if raw.get("grid"):
        raise FitError(f"--config {args.config}: give one point (no grid)")
    return raw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    try:
        out_file(out)   # a folder, a link loop or a read-only place: said now, not after the fit
        point = _point_config(args)
        runs = [r for path in args.runs for r in read_runs(path)]
        cfgs = [replay_config(r, point) for r in runs]
        labels = sorted({r.point for r in runs})
        dtype = cfgs[0].dtype
        source = (f"fidelity.fit_engine on {len(runs)} real run(s) ({', '.join(sorted({r.format for r in runs}))})"
                  f", {time.strftime('%Y-%m-%d')}")
        if args.holdout:
            test = [i for i, r in enumerate(runs) if any(h in r.point or h in r.name for h in args.holdout)]
            if not test or len(test) == len(runs):
                raise FitError(f"--holdout {' '.join(args.holdout)}: must leave out some runs, not "
                               f"{'none' if not test else 'all'} (points: {', '.join(labels)})")
            train = [i for i in range(len(runs)) if i not in test]
            folds = [(train, test)]
        elif len(labels) > 1:
            folds = [([i for i, r in enumerate(runs) if r.point != p], [i for i, r in enumerate(runs) if r.point == p])
                     for p in labels]
        else:
            folds = []
        rows, fitted = [], {}
        for k, (train, test) in enumerate(folds):
            m = fitted[tuple(train)] = fit([runs[i] for i in train], [cfgs[i] for i in train], source, dtype,
                                           args.replay_iterations, not args.no_moe_term, args.fit)
            rows += [dict(compare_run(runs[i], cfgs[i], m), fold=k) for i in test]
            _say(f"fold {k + 1}/{len(folds)}: fitted on {len(train)} run(s), judged on "
                 f"{', '.join(sorted({runs[i].point for i in test}))}")
        final_idx = folds[0][0] if args.holdout else list(range(len(runs)))
        model = fitted.get(tuple(final_idx)) or fit([runs[i] for i in final_idx], [cfgs[i] for i in final_idx],
                                                    source, dtype, args.replay_iterations, not args.no_moe_term,
                                                    args.fit)
        held = _summarise_errors(rows) if rows else {"runs": 0, "note": "one point only: nothing held out"}
        held["scheme"] = ("--holdout " + " ".join(args.holdout)) if args.holdout else (
            "leave-one-point-out" if folds else "none")
        # the fit's own check: a random 20% of steps (or of requests' decode intervals), or a replay fit's
        # final log error
        held["within_fit"] = model.held_out or {}
        lat = measured_latency([runs[i] for i in final_idx])
        prov = {"runs": [r.name for r in runs], "fitted_on": [runs[i].name for i in final_idx],
                "formats": sorted({r.format for r in runs}), "engines": sorted({str(r.meta.get("vllm_version") or
                                                                                    r.meta.get("backend") or "?")
                                                                                for r in runs}),
                "devices": sorted({str(r.meta.get("device", "?")) for r in runs}),
                "request_latency": lat or ({"method": "none: the requests' times are the engine's own"}
                                           if (model.held_out or {}).get("of") == DECODE_INTERVALS
                                           else {"method": "replay fit"}),
                "command": "python -m fidelity.fit_engine " + " ".join(argv)}
        model = dataclasses.replace(model, held_out=held, provenance=prov)
        data = dict(model.to_json(), model_shape=dataclasses.asdict(cfgs[0].model), dtype=dtype)
        bad = _bad(held, args)
        target = out if not bad or args.keep_bad_fit else out.with_suffix(".refused.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, indent=1, default=float))
        report = write_report(target.with_suffix(".md"), model, rows, held, bad, failed_requests_line(runs))
    except (RealRunError, FitError, ConfigError, CatalogError, OutputError) as e:
        return refuse(e)
    print(report)
    if bad:
        print("\n" + "!" * 72 + "\nFIT REFUSED: " + "; ".join(bad) + "\n" + "!" * 72, file=sys.stderr)
        if not args.keep_bad_fit:
            print(f"not written as a usable profile; inspect {target} or rerun with --keep-bad-fit", file=sys.stderr)
            return 3
    print(f"profile: {target} (use it as `profile: {target}`)")
    return 0


def _bad(held: dict, args) -> list[str]:
    bad = []
    s = held.get("step_median_ape_pct")
    if s is not None and s > args.max_step_error_pct:
        bad.append(f"held-out median step error {s:.1f}% > {args.max_step_error_pct:g}%")
    m = held.get("metric_median_abs_err_pct")
    if m is not None and m > args.max_metric_error_pct:
        bad.append(f"held-out median metric error {m:.1f}% > {args.max_metric_error_pct:g}%")
    return bad


def write_report(path: Path, model: StepFitCostModel, rows: list[dict], held: dict, bad: list[str],
                 failed: str | None = None) -> str:
    lines = [f"# Step model fitted to real runs", "", f"Source: {model.source}", "",
             "| term | value |", "|---|---|"]
    lines += [f"| {t} | {c:.4g} |" for t, c in zip(TERMS, model.coefficients) if c]
    if model.moe:
        lines.append(f"| per_active_expert_s (x {model.moe.num_moe_layers} MoE layers x experts hit) | "
                     f"{model.moe.per_active_expert_s:.4g} |")
    lines += [f"| request_latency_s | {model.request_latency_s:.4g} |", ""]
    lines += [f"Held out ({held.get('scheme')}): " + ", ".join(f"{k} {v}" for k, v in held.items()
                                                              if k not in ("scheme", "within_fit")), ""]
    if held.get("within_fit"):
        lines += ["Within the fit (left out of it at random): " + ", ".join(
            f"{k} {v}" for k, v in held["within_fit"].items()), ""]
    if rows:
        df = pd.DataFrame(rows)
        lines += ["| run | metric | real | sim | error % |", "|---|---|---|---|---|"]
        for _, r in df.iterrows():
            for m in METRICS:
                if np.isfinite(r.get(f"real_{m}", np.nan)):
                    lines.append(f"| {Path(r['run']).name} | {m} | {r[f'real_{m}']:.4g} | {r[f'sim_{m}']:.4g} | "
                                 f"{r[f'err_{m}']:+.1f} |")
            if "step_median_ape_pct" in r and np.isfinite(r["step_median_ape_pct"]):
                lines.append(f"| {Path(r['run']).name} | step time |APE median {r['step_median_ape_pct']}% | "
                             f"p90 {r['step_p90_ape_pct']}% | total {r['step_total_time_err_pct']:+}% |")
    if failed:
        lines += ["", failed]
    if bad:
        lines += ["", "**Refused:** " + "; ".join(bad)]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


if __name__ == "__main__":
    run_main(main, (RealRunError, FitError, ConfigError, CatalogError),
             kept="nothing written (a fit is written only once it is complete)")

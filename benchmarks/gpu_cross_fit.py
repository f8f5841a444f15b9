"""Fit on one real vLLM run, apply to the others: what a user's own run on a GPU buys for other models and
GPUs (the LLMServingSim runs in ../shared/real-runs/llmservingsim/).

    python -m benchmarks.gpu_cross_fit --out results/gpu-fidelity [--shared PATH]

For every run it fits, in closed form from the requests' own times (fidelity/request_fit.py, no replay):
- `step terms`: four terms (per_step_s, per_token_s, per_decode_seq_s, per_decode_ctx_s) in seconds, the
  profile `python -m fidelity.fit_engine RUN` writes; it describes that model on that GPU;
- `prior scale`: two (scale on the datasheet prior's step price, per_step_s added per step), which carry
  to another model or GPU by scaling that one's own prior.
and replays every run (the one fitted, the same GPU with another model, the same model on another GPU)
with each, next to the plain prior. Writes cross_fit.csv and cross_fit.md (TTFT, TPOT and E2E mean
errors per fit run and target run, the fitted parameters, the fit's error on the 20% of requests it left
out, and the fit's time). Without ../shared (or its llmservingsim runs) it says so and exits 0; a
`--shared` folder without real-runs/ is refused (exit 2).
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_fidelity import LSS_DIR, _lss_metrics, say  # noqa: E402
from benchmarks.shared_data import shared_folder  # noqa: E402
from commandline.outputs import OutputError, out_dir  # noqa: E402
from commandline.parser import Parser  # noqa: E402

METRICS = ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms")


def _runs(shared: Path) -> dict:
    from experiments.simulate import point_cost_model
    from fidelity.llmservingsim import read_run, replay_point
    from fidelity.realruns import replay_config
    out = {}
    for d in sorted(p for p in (shared / LSS_DIR).iterdir() if (p / "vllm_requests.jsonl").exists()):
        run = read_run(d)
        cfg = replay_config(run, replay_point(run, run.meta["model_id"]))
        prior = point_cost_model(dataclasses.replace(cfg, profile="roofline"))
        dp = cfg.deployment.data_parallel_size if cfg.deployment is not None else 1
        out[d.name] = (run, cfg, prior, int(cfg.policy.max_num_batched_tokens), int(dp))
    return out


def relation(a: str, b: str) -> str:
    """How two runs (folder names <GPU>_<model>) relate."""
    ga, ma = a.split("_", 1)
    gb, mb = b.split("_", 1)
    return "itself" if a == b else "same GPU, other model" if ga == gb else \
        "same model, other GPU" if ma == mb else "other GPU and model"


def cross_fit(shared: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fits, cross): one row per fit run with its parameters; one per (fit run, target run, method)."""
    from fidelity.realruns import replay
    from costmodels.scaled import ScaledCostModel
    from fidelity.request_fit import RequestFitError, fit_prior_scale, fit_step_terms
    runs = _runs(shared)
    real = {n: _lss_metrics(r[0].requests) for n, r in runs.items()}
    fits, rows = [], []
    for name, (run, cfg, prior, budget, dp) in runs.items():
        t0 = time.perf_counter()
        try:
            steps = fit_step_terms([run], [budget], [dp], f"{name} (timestamps)", cfg.dtype)
            t1 = time.perf_counter()
            scale, per_step, held = fit_prior_scale(run, prior, budget, dp)
        except RequestFitError as e:
            say(f"{name}: not fitted ({e})")
            continue
        t2 = time.perf_counter()
        held, steps_held = held or {}, steps.held_out or {}   # None: too few requests to leave any out
        c = dict(zip(("per_step_s", "per_decode_seq_s", "per_token_s", "per_decode_ctx_s"),
                     (steps.coefficients[i] for i in (0, 2, 3, 5))))
        fits.append({"fit_run": name, **{f"steps_{k}": v for k, v in c.items()},
                     "steps_held_out_median_ape_pct": steps_held.get("median_ape_pct", math.nan),
                     "steps_held_out_p90_ape_pct": steps_held.get("p90_ape_pct", math.nan),
                     "steps_fit_s": round(t1 - t0, 3), "scale": scale, "scale_per_step_s": per_step,
                     "scale_held_out_median_ape_pct": held.get("median_ape_pct", math.nan),
                     "scale_held_out_p90_ape_pct": held.get("p90_ape_pct", math.nan), "scale_fit_s": round(t2 - t1, 3)})
        say(f"fit on {name}: step terms {', '.join(f'{k} {v:.3g}' for k, v in c.items())} "
            f"(held out {steps_held.get('median_ape_pct', '-')}%); prior x {scale:.3f} + {per_step * 1e3:.2f} ms "
            f"a step (held out {held.get('median_ape_pct', '-')}%)")
        for target, (trun, tcfg, tprior, _, _) in runs.items():
            models = {"step terms": steps, "prior scale": ScaledCostModel(tprior, scale, per_step, name)}
            for method, cm in models.items():
                m = _lss_metrics(replay(trun, tcfg, cost_model=cm).requests)
                row = {"fit_run": name, "target_run": target, "relation": relation(name, target), "method": method}
                for k in METRICS:
                    row[f"err_{k}"] = m[k] / real[target][k] - 1 if real[target][k] else math.nan
                rows.append(row)
    for target, (trun, tcfg, tprior, _, _) in runs.items():   # the plain prior, for reference
        m = _lss_metrics(replay(trun, tcfg, cost_model=tprior).requests)
        rows.append({"fit_run": "-", "target_run": target, "relation": "no fit", "method": "prior",
                     **{f"err_{k}": m[k] / real[target][k] - 1 for k in METRICS}})
    return pd.DataFrame(fits), pd.DataFrame(rows)


def report(fits: pd.DataFrame, cross: pd.DataFrame, out: Path) -> str:
    from experiments.report import md_table
    if fits.empty:
        text = "# Fit on one run, apply to the others\n\nNo run had enough requests to fit.\n"
        (out / "cross_fit.md").write_text(text)
        return text
    f = fits.copy()
    for k in f.columns:
        if k.startswith("steps_per") or k == "scale_per_step_s":
            f[k] = f[k].map(lambda v: f"{v:.3g}")
    f["scale"] = f["scale"].map(lambda v: f"{v:.3f}")
    t = cross.copy()
    for k in METRICS:
        t[f"err_{k}"] = t[f"err_{k}"].map(lambda v: f"{v:+.0%}")
    text = "\n".join([
        "# Fit on one run, apply to the others (vLLM 0.19.0, LLMServingSim's runs)", "",
        "Fitted in closed form from each run's per-request times (fidelity/request_fit.py): `step terms`, "
        "four terms in seconds (the profile `python -m fidelity.fit_engine RUN` writes); `prior scale`, two "
        "(scale on the datasheet prior's step price, per_step_s per step) that carry to another model or GPU "
        "through that one's own prior. Held out: the fit's |error| on the decode intervals of the 20% of "
        "requests it left out. `python -m benchmarks.gpu_cross_fit`.", "",
        "## The fits", "", md_table(f), "",
        "## Errors, simulated / real - 1", "", md_table(t), ""])
    (out / "cross_fit.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = Parser(prog="python -m benchmarks.gpu_cross_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/gpu-fidelity", help="folder for cross_fit.csv and cross_fit.md")
    ap.add_argument("--shared", default=None, help="the shared data folder (default: ../shared)")
    a = ap.parse_args(argv)
    try:
        out_dir(a.out)
    except OutputError as e:
        ap.error(str(e))
    shared = shared_folder(ap, a.shared)
    if shared is None or not (shared / LSS_DIR).is_dir():
        print(f"gpu_cross_fit: no real-runs/llmservingsim in {shared or '../shared beside the checkout'}: skipped")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    fits, cross = cross_fit(shared)
    fits.to_csv(out / "cross_fit_params.csv", index=False)
    cross.to_csv(out / "cross_fit.csv", index=False)
    print(report(fits, cross, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

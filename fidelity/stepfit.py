"""Whole-step cost model fitted to real engine iterations, and the overhead refit of a kernel profile.

`StepFitCostModel` prices a step as a non-negative sum of physical terms fitted by relative-error least
squares on measured iterations (fidelity.torch_backend records): it is the fallback when no kernel profile
(calibration.capture) exists for a machine, and validate fits it on a separate calibration run so the
validation itself stays held out. Ignores: anything its terms cannot express (cache effects of
very long contexts, kernel-selection jumps), which shows up as its error in the fidelity report.
Profiles saved before a term existed load with that term at 0.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.optimize import nnls

from costmodels.stepmodel import FORMAT, TERMS, StepFitCostModel, read_stepfit, step_features  # noqa: F401


def step_error_summary(measured_s, priced_s) -> dict:
    """How a model's prices of steps err against their measured times: the count, median and p90 of
    |relative error| (percent) and the error of their summed time (throughput), as the step tables report
    them (fidelity.fit_engine.step_errors, fidelity.run_ticks)."""
    y, pred = np.asarray(measured_s, dtype=float), np.asarray(priced_s, dtype=float)
    err = pred / y - 1
    return {"steps": int(len(y)), "median_ape_pct": round(float(np.median(np.abs(err)) * 100), 2),
            "p90_ape_pct": round(float(np.percentile(np.abs(err), 90) * 100), 2),
            "total_time_err_pct": round(float((pred.sum() / y.sum() - 1) * 100), 2)}


def fit_step_model(cost_args: Sequence[dict], measured_s: Sequence[float], source: str = "?",
                   reference_step_s: float | None = None, holdout: float = 0.0, seed: int = 0,
                   dtype: str | None = None) -> StepFitCostModel:
    """Non-negative least squares on relative error, so short decode steps weigh as much as long prefills
    (see _fit_relative). With `holdout` > 0 that fraction of the steps (drawn at
    random) is left out of the fit and the model's error on it is recorded in `held_out`."""
    x = np.array([step_features(**a) for a in cost_args])
    y = np.asarray(measured_s, dtype=float)
    if len(y) < len(TERMS):
        raise ValueError(f"need at least {len(TERMS)} measured steps to fit, got {len(y)}")
    coef, held_out = fit_held_out(x, y, holdout, seed)
    return StepFitCostModel(tuple(float(c) for c in coef), source, reference_step_s, held_out, dtype)


def fit_held_out(x: np.ndarray, y: np.ndarray, holdout: float, seed: int) -> tuple[np.ndarray, dict | None]:
    """Non-negative coefficients for features `x` (one row per step) against measured seconds `y`, fitted on
    all but a random `holdout` fraction of the steps, and the error on those (`held_out`: steps, median and
    p90 absolute percentage error; None when nothing is held out)."""
    test = holdout_mask(len(y), holdout, seed)
    coef = _fit_relative(x[~test], y[~test])
    held_out = None
    if test.any():
        ape = np.abs(x[test] @ coef / y[test] - 1) * 100
        held_out = {"steps": int(test.sum()), "median_ape_pct": round(float(np.median(ape)), 2),
                    "p90_ape_pct": round(float(np.percentile(ape, 90)), 2)}
    return coef, held_out


def holdout_mask(n: int, holdout: float, seed: int) -> np.ndarray:
    """Which of n steps fit_step_model leaves out (a random `holdout` fraction; none when too few stay)."""
    test = np.random.default_rng(seed).random(n) < holdout if holdout > 0 else np.zeros(n, bool)
    if (~test).sum() < len(TERMS):
        test[:] = False
    return test


def _fit_relative(x: np.ndarray, y: np.ndarray, iterations: int = 10) -> np.ndarray:
    """Non-negative coefficients c with x @ c ~ y in relative terms. Dividing each row by its measurement
    y is biased low under multiplicative timing noise (it fits E[1/y] / E[1/y^2], about mean(y) x
    (1 - 2 var)); dividing by the model's own prediction instead (reweighted until it settles) fits the
    mean step time, so summed step times - throughput - come out unbiased."""
    coef, _ = nnls(x / y[:, None], np.ones_like(y))
    for _ in range(iterations):
        pred = x @ coef
        if not np.all(pred > 0):
            break
        new, _ = nnls(x / pred[:, None], y / pred)
        if np.allclose(new, coef, rtol=1e-6, atol=0):
            return new
        coef = new
    return coef


def kernel_only_s(cost_model, cost_args: Sequence[dict]) -> np.ndarray:
    """The model's step times with its explicit overheads taken out (ProfileCostModel.overheads: per step,
    per request, and per layer, which is a per-step constant too); other models are returned as they are."""
    total = np.array([cost_model.step_time_s(**a) for a in cost_args])
    o = getattr(cost_model, "overheads", None)
    if o is None:
        return total
    seqs = np.array([len(a["prefill"]) + len(a["decode"]) for a in cost_args], dtype=float)
    num_layers = getattr(getattr(cost_model, "model", None), "num_layers", 0)
    return total - o.per_step_s - o.per_request_s * seqs - getattr(o, "per_layer_s", 0.0) * num_layers


def fit_overheads(cost_model, cost_args: Sequence[dict], measured_s: Sequence[float]) -> tuple[float, float]:
    """(per_step_s, per_request_s) that make `cost_model`'s kernel time plus overheads match the measured
    steps: non-negative least squares of (measured - kernels) on [1, sequences in the step]. A model that
    carries explicit overheads has them taken out first (kernel_only_s), so the result replaces them
    (per-layer overhead included: it is folded into per_step_s). Overheads cannot be negative: when the
    kernels alone exceed the measurements, both come out 0 and the kernel tables are what is wrong."""
    seqs = np.array([len(a["prefill"]) + len(a["decode"]) for a in cost_args], dtype=float)
    kernels = kernel_only_s(cost_model, cost_args)
    y = np.asarray(measured_s, dtype=float)
    (per_step_s, per_request_s), _ = nnls(np.column_stack([np.ones_like(seqs), seqs]), y - kernels)
    return float(per_step_s), float(per_request_s)

"""Whole-step cost model fitted to real engine iterations, and the overhead refit of a kernel profile.

`StepFitCostModel` prices a step as a non-negative sum of physical terms fitted by relative-error least
squares on measured iterations (calibration.backend records): it is the fallback when no kernel profile
(calibration.run) exists for a machine, and validate fits it on a separate calibration run so the
validation itself stays held out. Ignores: anything its terms cannot express (cache effects of
very long contexts, kernel-selection jumps), which shows up as its error in the fidelity report.
Profiles saved before a term existed load with that term at 0.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import nnls

FORMAT = "batchsim-stepfit/1"
# Each term has a physical reason:
TERMS = (
    "per_step_s",           # fixed per step: scheduler, input preparation, weight reads of every layer
    "per_prefill_seq_s",    # one varlen attention call (and mask) per prefilling sequence per layer
    "per_decode_seq_s",     # one attention call per decoding sequence per layer, block-table gathers
    "per_token_s",          # GEMM FLOPs and activations grow with the tokens in the batch
    "per_attn_pair_s",      # causal prefill attention: new x (cached + new/2) query-key pairs
    "per_decode_ctx_s",     # decode attention streams each sequence's whole KV context
    "per_logit_s",          # LM head row + greedy sampling per sampled sequence
    "per_prefill_call_s",   # one attention call per distinct (new, cached) prefill shape: rows of one shape
                            # (a padded static batch) attend in one dense call
    "per_decode_call_s",    # a step with decodes runs them in one batched attention call (paged attention)
    "per_decode_padded_s",  # that call reads every decode padded to the longest context: decodes x longest
    "per_gemm_step_s",      # a step of more than one token runs its projections as matrix-matrix kernels; a
                            # one-token step runs cheaper matrix-vector ones
)


def step_features(prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                  num_logits: int | None = None) -> np.ndarray:
    """The term multipliers of one step, in TERMS order."""
    pf = np.asarray(prefill, dtype=float).reshape(-1, 2)
    dc = np.asarray(decode, dtype=float)
    new, cached = pf[:, 0], pf[:, 1]
    if num_logits is None:
        num_logits = len(pf) + len(dc)
    return np.array([1.0, len(pf), len(dc), new.sum() + len(dc), float(np.sum(new * (cached + (new + 1) / 2))),
                     dc.sum(), float(num_logits), float(len(set(map(tuple, pf.tolist())))), float(len(dc) > 0),
                     float(len(dc) * dc.max()) if len(dc) else 0.0, float(new.sum() + len(dc) > 1)])


@dataclass(frozen=True)
class StepFitCostModel:
    """Seconds per step = coefficients . step_features. `source` says which run it was fitted on;
    `held_out` its error on steps left out of the fit; `dtype` the dtype the real model ran in."""
    coefficients: tuple[float, ...]
    source: str = "?"
    reference_step_s: float | None = None  # the speed probe (calibration.backend) when fitted
    held_out: dict | None = None           # {"steps", "median_ape_pct", "p90_ape_pct"}
    dtype: str | None = None

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        if not len(prefill) and not len(decode):
            return 0.0
        return float(np.dot(self.coefficients, step_features(prefill, decode, num_logits)))

    def describe(self) -> dict:
        return {"kind": "stepfit", "source": self.source, "reference_step_s": self.reference_step_s,
                "held_out": self.held_out, **dict(zip(TERMS, self.coefficients))}

    def to_json(self) -> dict:
        return {"format": FORMAT, "terms": dict(zip(TERMS, self.coefficients)), "source": self.source,
                "reference_step_s": self.reference_step_s, "held_out": self.held_out, "dtype": self.dtype}


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
    test = holdout_mask(len(y), holdout, seed)
    coef = _fit_relative(x[~test], y[~test])
    held_out = None
    if test.any():
        ape = np.abs(x[test] @ coef / y[test] - 1) * 100
        held_out = {"steps": int(test.sum()), "median_ape_pct": round(float(np.median(ape)), 2),
                    "p90_ape_pct": round(float(np.percentile(ape, 90)), 2)}
    return StepFitCostModel(tuple(float(c) for c in coef), source, reference_step_s, held_out, dtype)


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


def read_stepfit(path: str | Path) -> StepFitCostModel | None:
    """The step model saved at `path`, or None when the file is some other kind of profile."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return StepFitCostModel(tuple(float(data["terms"].get(t, 0.0)) for t in TERMS), data.get("source", str(path)),
                            data.get("reference_step_s"), data.get("held_out"), data.get("dtype"))


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

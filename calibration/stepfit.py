"""Whole-step cost model fitted to real engine iterations, and the overhead refit of a kernel profile.

`StepFitCostModel` prices a step as a non-negative sum of physical terms fitted by relative-error least
squares on measured iterations (calibration.backend records): it is the fallback when no kernel profile
(calibration.run) exists for a machine, and validate fits it on a separate calibration run so the
validation itself stays held out. Ignores: anything its seven terms cannot express (cache effects of
very long contexts, kernel-selection jumps), which shows up as its error in the fidelity report.
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
)


def step_features(prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                  num_logits: int | None = None) -> np.ndarray:
    """The seven term multipliers of one step, in TERMS order."""
    pf = np.asarray(prefill, dtype=float).reshape(-1, 2)
    dc = np.asarray(decode, dtype=float)
    new, cached = pf[:, 0], pf[:, 1]
    if num_logits is None:
        num_logits = len(pf) + len(dc)
    return np.array([1.0, len(pf), len(dc), new.sum() + len(dc), float(np.sum(new * (cached + (new + 1) / 2))),
                     dc.sum(), float(num_logits)])


@dataclass(frozen=True)
class StepFitCostModel:
    """Seconds per step = coefficients . step_features. `source` says which run it was fitted on."""
    coefficients: tuple[float, ...]
    source: str = "?"
    reference_step_s: float | None = None  # the speed probe (calibration.backend) when fitted

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        if not len(prefill) and not len(decode):
            return 0.0
        return float(np.dot(self.coefficients, step_features(prefill, decode, num_logits)))

    def describe(self) -> dict:
        return {"kind": "stepfit", "source": self.source, "reference_step_s": self.reference_step_s,
                **dict(zip(TERMS, self.coefficients))}

    def to_json(self) -> dict:
        return {"format": FORMAT, "terms": dict(zip(TERMS, self.coefficients)), "source": self.source,
                "reference_step_s": self.reference_step_s}


def fit_step_model(cost_args: Sequence[dict], measured_s: Sequence[float], source: str = "?",
                   reference_step_s: float | None = None) -> StepFitCostModel:
    """Non-negative least squares on relative error (each row divided by its measurement), so short
    decode steps weigh as much as long prefills."""
    x = np.array([step_features(**a) for a in cost_args])
    y = np.asarray(measured_s, dtype=float)
    if len(y) < len(TERMS):
        raise ValueError(f"need at least {len(TERMS)} measured steps to fit, got {len(y)}")
    coef, _ = nnls(x / y[:, None], np.ones_like(y))
    return StepFitCostModel(tuple(float(c) for c in coef), source, reference_step_s)


def read_stepfit(path: str | Path) -> StepFitCostModel | None:
    """The step model saved at `path`, or None when the file is some other kind of profile."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return StepFitCostModel(tuple(float(data["terms"][t]) for t in TERMS), data.get("source", str(path)),
                            data.get("reference_step_s"))


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

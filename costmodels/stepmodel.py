"""Whole-step cost model: seconds per engine step as a non-negative sum of physical terms, fitted to a real
engine's own iterations (fidelity.stepfit on our torch backend, fidelity.fit_engine on real vLLM runs).

A step model is a small value: its coefficients, where they were fitted (`source`, `provenance`), their error
on steps left out of the fit (`held_out`), and a fixed per-request latency (`request_latency_s`: what a
serving stack adds outside the engine's steps, the API server and input processing before a request
reaches the scheduler, output processing and streaming after its tokens leave it). `experiments.run`
takes a saved one as `profile: PATH/stepfit.json`. Ignores: anything its terms cannot express (cache
effects of very long contexts, kernel-selection jumps), which shows up as its held-out error. Files saved
before a term existed load with that term at 0. A MoE model's fit carries one more term (`MoeTerm`): the
experts its tokens reach.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

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
class MoeTerm:
    """A MoE step runs, per MoE layer, every routed expert that at least one of its tokens picked: its
    weights read and one GEMM pass each (grouped MoE kernels skip experts without tokens; vLLM's CPU
    kernel is compiled code: the fits in docs/fidelity/vllm-cpu-moe test it, with mixed results). With
    T tokens each picking top-k of E experts at random, E (1 - (1 - k/E)^T) experts are hit: 2 for one
    decode, nearly all 8 of 8 at 16 tokens, so a MoE step's cost is concave in its tokens, which the
    linear per-token term cannot follow. Ignores skewed routing (a trained router), which hits fewer
    experts."""
    num_moe_layers: int
    num_experts: int
    experts_per_token: int
    per_active_expert_s: float = 0.0   # seconds per (MoE layer x expert hit)

    def active_experts(self, num_tokens: float) -> float:
        """Expected expert passes of a step with `num_tokens` tokens, summed over the MoE layers."""
        miss = (1.0 - self.experts_per_token / self.num_experts) ** num_tokens
        return self.num_moe_layers * self.num_experts * (1.0 - miss)


@dataclass(frozen=True)
class StepFitCostModel:
    """Seconds per step = coefficients . step_features. `source` says which run it was fitted on;
    `held_out` its error on steps left out of the fit; `dtype` the dtype the real model ran in."""
    coefficients: tuple[float, ...]
    source: str = "?"
    reference_step_s: float | None = None  # the speed probe (fidelity.torch_backend) when fitted
    held_out: dict | None = None           # {"steps", "median_ape_pct", "p90_ape_pct"}
    dtype: str | None = None
    request_latency_s: float = 0.0         # fixed per request, outside the engine steps (added to TTFT/E2E)
    provenance: dict | None = None         # what it was fitted on: runs, engine, device, command
    moe: MoeTerm | None = None             # MoE models: the experts a step's tokens reach

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        """coefficients . step_features, in plain Python: a step has a handful of sequences, and numpy's
        per-call overhead would dominate the simulator's time (tests check both agree)."""
        if not len(prefill) and not len(decode):
            return 0.0
        c = self.coefficients
        new = pairs = 0.0
        shapes = set()
        for n, k in prefill:
            new += n
            pairs += n * (k + (n + 1) / 2)
            shapes.add((n, k))
        nd = len(decode)
        ctx = float(sum(decode)) if nd else 0.0
        tokens = new + nd
        logits = len(prefill) + nd if num_logits is None else num_logits
        moe = self.moe.per_active_expert_s * self.moe.active_experts(tokens) if self.moe else 0.0
        return (c[0] + c[1] * len(prefill) + c[2] * nd + c[3] * tokens + c[4] * pairs + c[5] * ctx
                + c[6] * logits + c[7] * len(shapes) + c[8] * (nd > 0) + (c[9] * nd * max(decode) if nd else 0.0)
                + c[10] * (tokens > 1) + moe)

    def describe(self) -> dict:
        return {"kind": "stepfit", "source": self.source, "reference_step_s": self.reference_step_s,
                "held_out": self.held_out, "request_latency_s": self.request_latency_s,
                **dict(zip(TERMS, self.coefficients)), **({"moe": asdict(self.moe)} if self.moe else {})}

    def to_json(self) -> dict:
        return {"format": FORMAT, "terms": dict(zip(TERMS, self.coefficients)), "source": self.source,
                "reference_step_s": self.reference_step_s, "held_out": self.held_out, "dtype": self.dtype,
                "request_latency_s": self.request_latency_s, "provenance": self.provenance,
                **({"moe": asdict(self.moe)} if self.moe else {})}


def read_stepfit(path: str | Path) -> StepFitCostModel | None:
    """The step model saved at `path`, or None when the file is some other kind of profile."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return stepfit_from_json(data, str(path))


def stepfit_from_json(data: dict, where: str = "<dict>") -> StepFitCostModel:
    """A step model from its saved form; a malformed one is a ValueError naming `where` and the key."""
    terms = data.get("terms")
    if not isinstance(terms, dict):
        raise ValueError(f"{where}: step model lacks its \"terms\" mapping")
    unknown = set(terms) - set(TERMS)
    if unknown:
        raise ValueError(f"{where}: unknown step-model term(s) {', '.join(sorted(unknown))}")
    values = []
    for t in TERMS:
        v = terms.get(t, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"{where}: terms.{t} must be a non-negative number, not {v!r}")
        values.append(float(v))
    lat = data.get("request_latency_s", 0.0) or 0.0
    if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not np.isfinite(lat) or lat < 0:
        raise ValueError(f"{where}: request_latency_s must be a non-negative number, not {lat!r}")
    return StepFitCostModel(tuple(values), data.get("source", where), data.get("reference_step_s"),
                            data.get("held_out"), data.get("dtype"), float(lat), data.get("provenance"),
                            _moe_from_json(data.get("moe"), where))


def _moe_from_json(moe, where: str) -> MoeTerm | None:
    if moe is None:
        return None
    try:
        term = MoeTerm(int(moe["num_moe_layers"]), int(moe["num_experts"]), int(moe["experts_per_token"]),
                       float(moe["per_active_expert_s"]))
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{where}: moe must hold num_moe_layers, num_experts, experts_per_token and "
                         f"per_active_expert_s") from None
    if min(term.num_moe_layers, term.num_experts, term.experts_per_token) < 1 or \
            term.experts_per_token > term.num_experts or not term.per_active_expert_s >= 0:
        raise ValueError(f"{where}: moe must have 1 <= experts_per_token <= num_experts, layers >= 1 and "
                         f"per_active_expert_s >= 0, not {moe}")
    return term

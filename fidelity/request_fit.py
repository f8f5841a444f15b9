"""Step time fitted in closed form to per-request timestamps, for real runs that recorded no engine steps.

A request that decodes from its first token (t_f) to its last (t_l) emits output - 1 tokens, one per
engine step, so [t_f, t_l] holds exactly output - 1 steps and its length is the sum of their times. What
the engine did in those steps is rebuilt from every request's own times, each spread evenly over its
phases: its prompt over [scheduled, first token] (chunked prefill), its output over [first, last token],
its context growing from the prompt to prompt + output. On a grid of `dt` seconds that gives, for each
request, the prefill tokens, decode tokens and decode context (KV read) of the steps inside its decode
interval, and one linear equation per request:

    t_l - t_f = per_step_s (output - 1) + per_token_s (prefill + decode tokens)
                + per_decode_seq_s (decode tokens) + per_decode_ctx_s (context tokens read)

solved by non-negative least squares on relative error (fidelity.stepfit._fit_relative): four parameters,
no replay, well under a second per run. Two forms of the same fit:

- step terms (`fit_step_terms`): the four terms above, a StepFitCostModel (a profile) of this model on
  this GPU; it does not carry to another model or GPU;
- prior scale (`fit_prior_scale`): step time = scale x the prior's price of the rebuilt step +
  per_step_s, two parameters: the share of the prior's kernel time the real kernels take, and the
  engine's per-step time the prior does not price. It carries to another model or GPU by scaling that
  one's own prior (costmodels/scaled.py).

Held out: a random 20% of the requests are left out of the fit and its error on their decode intervals
is reported (median and p90 of |error|). With data_parallel_size d the requests are shared by d engines
stepping side by side: each engine is taken to see 1/d of the rebuilt work. Ignores: preemption (a
preempted request's interval also holds its recompute), prefix-cache hits (a hit prompt's tokens count as
computed), speculative decoding (several tokens a step), and the spread of a phase's work within it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from costmodels.stepmodel import TERMS, StepFitCostModel
from fidelity.stepfit import _fit_relative, holdout_mask

# Grid step: a hundredth of the median decode interval (whole bins are integrated), at most 50 ms (real
# runs' intervals are tens of seconds, their steps tens of ms); below a step the grid only costs time.
MAX_DT_S, BINS_PER_INTERVAL = 0.05, 100
HOLDOUT = 0.2
DECODE_INTERVALS = "decode intervals"   # what the held-out error of this fit is measured on
STEP_TERMS = ("per_step_s", "per_token_s", "per_decode_seq_s", "per_decode_ctx_s")


class RequestFitError(ValueError):
    """Requests that cannot be fitted; one line."""


@dataclass(frozen=True)
class Rebuilt:
    """One engine's work on a grid, rebuilt from the requests: per bin (left edges `t`, width `dt`), the
    steps per second and the prefill tokens, decode tokens and decode context read per second, and the
    requests whose prefill runs (per second: each request's one prefill spread over its prefill phase)."""
    t: np.ndarray
    dt: float
    steps: np.ndarray
    prefill: np.ndarray
    decode: np.ndarray
    context: np.ndarray
    prefills: np.ndarray | None = None

    def integrate(self, rate: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The integral of `rate` over each [a_i, b_i) (whole bins)."""
        c = np.concatenate([[0.0], np.cumsum(rate * self.dt)])
        i0 = np.clip(np.searchsorted(self.t, a), 0, len(self.t))
        i1 = np.clip(np.searchsorted(self.t, b), 0, len(self.t))
        return c[i1] - c[i0]


def _phases(requests: pd.DataFrame) -> pd.DataFrame:
    fin = requests[(requests["status"] == "finished") & np.isfinite(requests["first_token_s"])
                   & np.isfinite(requests["finish_s"])]
    start = fin["scheduled_s"] if "scheduled_s" in fin else fin["arrival_s"]
    out = pd.DataFrame({"start": start.to_numpy(float), "first": fin["first_token_s"].to_numpy(float),
                        "last": fin["finish_s"].to_numpy(float), "prompt": fin["prompt_tokens"].to_numpy(float),
                        "output": fin["output_tokens"].to_numpy(float)})
    return out[out["first"] >= out["start"]]


def grid_step_s(requests: pd.DataFrame) -> float:
    p = _phases(requests)
    span = (p["last"] - p["first"])[(p["output"] > 1) & (p["last"] > p["first"])]
    return float(min(MAX_DT_S, max(1e-4, span.median() / BINS_PER_INTERVAL))) if len(span) else MAX_DT_S


def rebuild(requests: pd.DataFrame, data_parallel_size: int = 1, budget: int = 2048,
            dt: float | None = None) -> Rebuilt:
    """The work of one engine per `dt` bin (default grid_step_s; see the module docstring)."""
    p = _phases(requests)
    if p.empty:
        raise RequestFitError("no finished requests with first- and last-token times")
    dt = dt or grid_step_s(requests)
    t = np.arange(p["start"].min(), p["last"].max() + dt, dt)
    n = len(t)

    def spread(a, b, value, slope=None):
        """Sum over requests of value_i (+ slope_i x t) on the bins whose left edge is in [a_i, b_i)."""
        i0, i1 = np.searchsorted(t, a), np.searchsorted(t, b)
        d = np.zeros(n + 1)
        np.add.at(d, i0, value)
        np.add.at(d, i1, -value)
        out = np.cumsum(d)[:n]
        if slope is not None:
            ds = np.zeros(n + 1)
            np.add.at(ds, i0, slope)
            np.add.at(ds, i1, -slope)
            out = out + np.cumsum(ds)[:n] * t
        return out

    pre = p[p["first"] > p["start"]]
    prefill = spread(pre["start"], pre["first"], pre["prompt"] / (pre["first"] - pre["start"]))
    dec = p[(p["output"] > 1) & (p["last"] > p["first"])]
    rate = (dec["output"] - 1) / (dec["last"] - dec["first"])
    decode = spread(dec["first"], dec["last"], rate)
    decoding = spread(dec["first"], dec["last"], np.ones(len(dec)))
    # context of request j at time t: prompt + rate (t - first); times its rate
    context = spread(dec["first"], dec["last"], rate * (dec["prompt"] - rate * dec["first"]), rate * rate)
    # every decoding request emits one token a step: the steps per second are their (mean) rate; with
    # nothing decoding, a prefill-only step takes the whole token budget
    steps = np.where(decoding > 0, decode / np.maximum(decoding, 1e-12), prefill / data_parallel_size / budget)
    d = float(data_parallel_size)
    prefills = spread(pre["start"], pre["first"], 1.0 / (pre["first"] - pre["start"]))
    return Rebuilt(t, dt, steps, prefill / d, decode / d, context / d, prefills / d)


def equations(requests: pd.DataFrame, rebuilt: Rebuilt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, seconds, steps) per request with a decode interval: features in STEP_TERMS order."""
    p = _phases(requests)
    p = p[(p["output"] > 1) & (p["last"] > p["first"])]
    a, b = p["first"].to_numpy(), p["last"].to_numpy()
    steps = p["output"].to_numpy() - 1
    decode = rebuilt.integrate(rebuilt.decode, a, b)
    tokens = rebuilt.integrate(rebuilt.prefill, a, b) + decode
    context = rebuilt.integrate(rebuilt.context, a, b)
    x = np.column_stack([steps, tokens, decode, context])
    ok = (b - a) > 4 * rebuilt.dt   # whole-bin integrals need intervals of several bins
    return x[ok], (b - a)[ok], steps[ok]


def _held_out(x: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[np.ndarray, dict | None]:
    test = holdout_mask(len(y), HOLDOUT, seed)
    if (~test).sum() < x.shape[1]:
        raise RequestFitError(f"{len(y)} requests with a decode interval; need at least {x.shape[1]}")
    coef = _fit_relative(x[~test], y[~test])
    held = None
    if test.any():
        ape = np.abs(x[test] @ coef / y[test] - 1) * 100
        held = {"requests": int(test.sum()), "median_ape_pct": round(float(np.median(ape)), 2),
                "p90_ape_pct": round(float(np.percentile(ape, 90)), 2), "of": DECODE_INTERVALS}
    return coef, held


def fit_step_terms(runs: list, budgets: list[int], dps: list[int], source: str, dtype: str | None = None,
                   dt: float | None = None) -> StepFitCostModel:
    """The four step terms (STEP_TERMS) fitted on the decode intervals of every request of `runs`
    (RealRun), each rebuilt with its engine's token budget and data-parallel size."""
    xs, ys = [], []
    for run, budget, dp in zip(runs, budgets, dps):
        x, y, _ = equations(run.requests, rebuild(run.requests, dp, budget, dt))
        xs.append(x)
        ys.append(y)
    coef, held = _held_out(np.vstack(xs), np.concatenate(ys))
    full = np.zeros(len(TERMS))
    for name, c in zip(STEP_TERMS, coef):
        full[TERMS.index(name)] = c
    return StepFitCostModel(tuple(float(c) for c in full), source, None, held, dtype)


def prior_seconds(rebuilt: Rebuilt, prior, budget: int | None = None) -> np.ndarray:
    """Per bin, the prior's time of the steps it holds. Without `budget`: steps x the price of the bin's
    mean step (its decodes, their context sum, one prefill chunk of the bin's mean prefill tokens a step).
    With it, as the engine schedules them: the prefill tokens ride in as few steps as carry them (one a
    prefilling request, more where its prompt outgrows the budget left beside the decodes), the others
    decode only; a step that mixes the two costs more than its parts on some GPUs
    (costmodels/attention_kernel.py), so spreading the prefill over every step would overprice it."""
    out = np.zeros(len(rebuilt.t))
    sums = hasattr(prior, "step_time_sums_s")

    def price(prefill, nd, ctx):
        if sums:
            return prior.step_time_sums_s(prefill, nd, ctx if nd else 0)
        return prior.step_time_s(prefill, [max(1, ctx // max(nd, 1))] * nd)

    for k in np.flatnonzero(rebuilt.steps > 0):
        s = rebuilt.steps[k]
        nd = int(round(rebuilt.decode[k] / s))
        ctx = int(round(rebuilt.context[k] / s))
        if budget is None or rebuilt.prefills is None or not nd:
            chunk = int(round(rebuilt.prefill[k] / s))
            prefill = [(chunk, 0)] if chunk >= 1 else []
            if nd or prefill:
                out[k] = s * rebuilt.dt * price(prefill, nd, ctx)
            continue
        mixed = min(s, max(rebuilt.prefills[k], rebuilt.prefill[k] / max(budget - nd, 1)))   # per second
        chunk = int(round(rebuilt.prefill[k] / mixed)) if mixed > 0 else 0
        if chunk >= 1:
            seconds = (s - mixed) * price([], nd, ctx) + mixed * price([(chunk, 0)], nd, ctx)
        else:
            seconds = s * price([], nd, ctx)
        out[k] = rebuilt.dt * seconds
    return out


def fit_prior_scale(run, prior, budget: int, dp: int = 1, dt: float | None = None) -> tuple[float, float, dict | None]:
    """(scale, per_step_s, held-out error): each request's decode interval = scale x the prior's time of
    the rebuilt steps in it + per_step_s x its steps."""
    rb = rebuild(run.requests, dp, budget, dt)
    p = _phases(run.requests)
    p = p[(p["output"] > 1) & (p["last"] > p["first"])]
    a, b = p["first"].to_numpy(), p["last"].to_numpy()
    x = np.column_stack([rb.integrate(prior_seconds(rb, prior, budget) / rb.dt, a, b), p["output"].to_numpy() - 1])
    ok = (b - a) > 4 * rb.dt
    coef, held = _held_out(x[ok], (b - a)[ok])
    return float(coef[0]), float(coef[1]), held

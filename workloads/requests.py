"""What every workload source shares (workloads/synthetic.py and workloads/traces.py both import it, so the
dependency goes one way): the arrival description, the generated request list, and how lengths are fitted to
the model's context limit."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simcore.request import RequestSpec
from workloads.errors import WorkloadError

PROCESSES = ("poisson", "gamma", "constant", "closed")
OPEN_LOOP_PROCESSES = ("poisson", "gamma", "constant")
LONG_PROMPTS = ("reject", "clip")  # a prompt longer than max_model_len - 1: rejected (as vLLM) or cut


@dataclass(frozen=True)
class Arrival:
    """`poisson`/`gamma`/`constant`: open loop at `rate_per_s` (inf: everything at t = 0), gamma inter-arrivals
    with coefficient of variation `cv` (cv = 1 is Poisson, > 1 bursty), constant: evenly spaced sends 1 /
    rate apart from t = 0 (inference-perf's and GuideLLM's constant mode). `closed`: `concurrency` users, each
    sending its next request `think_time_s` after its previous one finishes. `rate_profile`: a rate that
    changes over time (workloads/rates.py; poisson or constant only), `rate_per_s` then its mean."""
    process: str
    rate_per_s: float | None = None
    cv: float = 1.0
    concurrency: int | None = None
    think_time_s: float = 0.0
    rate_profile: object = None   # workloads.rates.RateProfile

    @property
    def is_closed(self) -> bool:
        return self.process == "closed"


@dataclass(frozen=True)
class GeneratedRequests:
    specs: Sequence[RequestSpec]     # a tuple, or compact columns (simcore.request.RequestSpecs); arrival_s
                                     # is 0 for closed-loop traffic (set when a user sends it)
    num_clipped_prompts: int         # prompts cut to max_model_len - 1 (only with long_prompts: clip)
    num_clipped_outputs: int         # outputs cut so prompt + output <= max_model_len


def clip_to_model(prompts: np.ndarray, outputs: np.ndarray, max_model_len: int, long_prompts: str):
    """Fit lengths to the model's hard limit. A prompt of max_model_len tokens or more is left as it is
    (the engine rejects it, as vLLM does) unless `long_prompts` is "clip", which cuts it to max_model_len - 1.
    An output is cut so prompt + output <= max_model_len (generation stops at the context limit). Returns
    (prompts, outputs, clipped prompt mask, clipped output mask)."""
    long = prompts > max_model_len - 1
    if long_prompts == "clip":
        prompts = np.minimum(prompts, max_model_len - 1)
    fits = prompts <= max_model_len - 1
    room = np.maximum(1, max_model_len - prompts)
    clipped_o = fits & (outputs > room)
    outputs = np.where(fits, np.minimum(outputs, room), outputs)
    return prompts, outputs, long & (long_prompts == "clip"), clipped_o


def parse_long_prompts(v, key: str) -> str:
    if v not in LONG_PROMPTS:
        raise WorkloadError(f"{key}: expected reject (the engine refuses a prompt >= max_model_len, as vLLM) or "
                            f"clip (cut it to max_model_len - 1), got {v!r}")
    return v

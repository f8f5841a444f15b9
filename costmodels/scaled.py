"""A cost model's price scaled and shifted per step: what fitting the datasheet prior to a real run gives
(fidelity/request_fit.py `fit_prior_scale`), carried to another model or GPU through that one's prior."""
from __future__ import annotations

import numpy as np


class ScaledCostModel:
    """A cost model's price x `scale` + `per_step_s` per step (a fit of the prior to a real run, carried
    to another model or GPU). Keeps the base's front end and its context-sum entry points."""

    def __init__(self, base, scale: float, per_step_s: float, source: str = "?"):
        if not all(hasattr(base, m) for m in ("step_time_sums_s", "decode_step_time_fn", "decode_steps_time_s")):
            raise ValueError(f"{type(base).__name__}: a scaled cost model needs one priced by context sums "
                             "(the roofline or a measured profile)")
        self.base, self.scale, self.per_step_s, self.source = base, scale, per_step_s, source
        fe = getattr(base, "frontend", None)
        if fe is not None:
            self.frontend = fe
        if hasattr(base, "step_time_in_dp_group_s"):   # an MoE model's DP ranks (simcore/dp_lockstep.py)
            self.step_time_in_dp_group_s = self._in_dp_group_s

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        if not len(prefill) and not len(decode):
            return 0.0
        return self.scale * self.base.step_time_s(prefill, decode, num_logits) + self.per_step_s

    def _in_dp_group_s(self, group, prefill=(), decode=(), num_logits=None) -> float:
        if not len(prefill) and not len(decode):
            return 0.0
        return self.scale * self.base.step_time_in_dp_group_s(group, prefill, decode, num_logits) \
            + self.per_step_s

    def step_time_sums_s(self, prefill, num_decode, decode_context_sum, num_logits=None) -> float:
        if not len(prefill) and not num_decode:
            return 0.0
        return self.scale * self.base.step_time_sums_s(prefill, num_decode, decode_context_sum, num_logits) \
            + self.per_step_s

    def decode_step_time_fn(self, num_seqs, num_logits=None):
        fn, a, b = self.base.decode_step_time_fn(num_seqs, num_logits), self.scale, self.per_step_s
        return lambda context_sum: a * fn(context_sum) + b

    def decode_steps_time_s(self, num_seqs, context_sums, num_logits=None):
        return self.scale * np.asarray(self.base.decode_steps_time_s(num_seqs, context_sums, num_logits)) \
            + self.per_step_s

    def describe(self) -> dict:
        return {"kind": "scaled-prior", "scale": self.scale, "per_step_s": self.per_step_s, "source": self.source,
                "base": self.base.describe() if hasattr(self.base, "describe") else type(self.base).__name__}

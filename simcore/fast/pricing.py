"""Pricing the fast engine's steps: the cost model's `step_time_s`, or its context-sum entry points when it
implements simcore.costmodel.ContextSumPricing (lazy decoders' contexts are then never listed)."""
from __future__ import annotations

from simcore.batch import split_shape
from simcore.costmodel import ContextSumPricing


class StepPricer:
    """Prices the engine's steps through one cost model (chosen once: sums or per-request contexts)."""

    def __init__(self, cost_model):
        self.cost = cost_model
        self.by_sums = isinstance(cost_model, ContextSumPricing)
        self.decode_fns: dict = {}   # the cost model's decode-step function by batch size

    def step_time_s(self, explicit: list, num_lazy: int, padded, decoders, running) -> float:
        """A step of `explicit` (request, new tokens, reserved) plus `num_lazy` lazy decoders (first in the
        batch), or a padded batch's rows."""
        cost = self.cost
        if padded is not None:
            prefill, decode = split_shape(padded)
            return cost.step_time_s(prefill=prefill, decode=decode, num_logits=len(padded))
        prefill, decode, num_logits = [], [], num_lazy
        for req, n, _ in explicit:   # split_shape and rules.samples, inlined (the hot loop)
            c = req.num_computed_tokens
            if n > 1 or c == 0:
                prefill.append((n, c))
            else:
                decode.append(c + 1)
            if c + n >= req.spec.num_prompt_tokens + req.num_generated_tokens:   # req.num_tokens
                num_logits += 1
        if not num_lazy:
            return cost.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits)
        step = decoders.step
        if self.by_sums:   # lazy decoders come first in the batch; only their sum is needed
            lazy_sum = decoders.base_context_sum + num_lazy * (step + 1)
            return cost.step_time_sums_s(prefill, num_lazy + len(decode), lazy_sum + sum(decode), num_logits)
        lazy_ctx = [r.base_computed + step + 1 for r in running if r.lazy]
        return cost.step_time_s(prefill=prefill, decode=lazy_ctx + decode, num_logits=num_logits)

    def decode_fn(self, rows: int, ctx: int, decoders, running):
        """A function from the context sum of a quiet step (`rows` decodes, all sampling: padded rows of
        context `ctx`, or with ctx 0 the lazy decoders now in `running`) to its time."""
        fn = self.decode_fns.get(rows)
        if fn is not None:
            return fn
        cost = self.cost
        if self.by_sums:
            fn = self.decode_fns[rows] = cost.decode_step_time_fn(rows, rows)
            return fn
        # any cost model: rebuild the contexts (step j adds j to each; the sum adds rows * j)
        contexts0 = [ctx] * rows if ctx else [r.base_computed + decoders.step + 1 for r in running]
        sum0 = sum(contexts0)
        return lambda context_sum: cost.step_time_s(
            prefill=[], decode=[c + (context_sum - sum0) // rows for c in contexts0], num_logits=rows)

    def decode_steps_time_s(self, rows: int, ctx: int, context_sums, decoders, running):
        """Times of many quiet steps (as `decode_fn`), from an array of their context sums."""
        if self.by_sums:
            return self.cost.decode_steps_time_s(rows, context_sums, rows)
        fn = self.decode_fn(rows, ctx, decoders, running)
        return [fn(s) for s in context_sums.tolist()]

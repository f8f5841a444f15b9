"""vLLM V1's async scheduling as a request's admission sees it: a request that arrives while a step runs
waits one step more than under a synchronous engine.

With async scheduling the engine core schedules step n+1 while step n runs (vLLM's batch queue of two,
`EngineCore.step_with_batch_queue`): when a step ends, the next one is already on the GPU and the
scheduler picks the step after it. A request that arrives during a step is added to the waiting queue at
that step's end, just after that decision was made, so it is scheduled one decision later: it waits for the
rest of its arrival step, the whole next step, and then runs (2.5 steps on average to its first token,
against 1.5 for a synchronous engine). An engine with nothing to run schedules an arrival at once, as
vLLM's does. On by default on CUDA since vLLM 0.14 (vllm-project/vllm PR #27614; docs/sources.md, "Async
scheduling"); off in vLLM's CPU build and with pipeline parallelism (the V1 model runner turns it off).

Both engines (simcore/engine.py, simcore/fast/engine.py) hold such arrivals here and release them into
their waiting queue right after their next decision; `EngineLimits.async_scheduling` turns it on.
"""
from __future__ import annotations


class ArrivalsInStep:
    """Requests that arrived while the step in flight ran, in arrival order."""

    __slots__ = ("held",)

    def __init__(self):
        self.held: list = []

    def hold(self, req) -> None:
        self.held.append(req)

    def release_into(self, waiting) -> bool:
        """Append the held requests to `waiting` (their arrival order kept); True if there were any."""
        if not self.held:
            return False
        waiting.extend(self.held)
        self.held.clear()
        return True

    def remove(self, req) -> bool:
        """Drop `req` if held (it left at the gateway); True if it was."""
        for i, r in enumerate(self.held):
            if r is req:
                del self.held[i]
                return True
        return False

    def __len__(self) -> int:
        return len(self.held)


def async_scheduling_of(cost_model) -> bool:
    """Whether a cost model represents an async-scheduled engine: its own `async_scheduling` (a kernel
    profile on a GPU: yes, costmodels/profile.py), else its `eff.async_scheduling` (the roofline prior and
    the [aic] model: vLLM V1 on CUDA); a model with neither (a step model fitted to runs, a stub): no."""
    flag = getattr(cost_model, "async_scheduling", None)
    if isinstance(flag, bool):
        return flag
    return bool(getattr(getattr(cost_model, "eff", None), "async_scheduling", False))

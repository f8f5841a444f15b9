"""Hand-built requests and engine views for policy tests (no SimPy)."""
from __future__ import annotations

from simcore.kvcache import cdiv
from simcore.request import Request, RequestSpec, Status
from simcore.view import EngineView

BLOCK = 16


def waiting(rid, prompt, output=100, *, arrival=None, max_new=None, priority=0, generated=0, preemptions=0):
    """A queued request (new, or preempted for recompute when `preemptions` > 0)."""
    spec = RequestSpec(rid, float(rid) if arrival is None else arrival, prompt, output, max_new, priority=priority)
    return Request(spec, Status.WAITING, num_generated_tokens=generated, num_preemptions=preemptions)


def decoding(rid, prompt, generated, output=100, *, blocks=None, arrival=None, max_new=None, priority=0):
    """A running request whose next step is one decode token (KV for prompt + generated - 1 tokens)."""
    spec = RequestSpec(rid, float(rid) if arrival is None else arrival, prompt, output, max_new, priority=priority)
    computed = prompt + generated - 1
    return Request(spec, Status.RUNNING, computed, generated,
                   cdiv(computed, BLOCK) if blocks is None else blocks)


def prefilling(rid, prompt, computed, output=100, *, blocks=None, arrival=None, max_new=None):
    """A running request part-way through its prompt."""
    spec = RequestSpec(rid, float(rid) if arrival is None else arrival, prompt, output, max_new)
    return Request(spec, Status.RUNNING, computed, 0, cdiv(computed, BLOCK) if blocks is None else blocks)


def view(waiting=(), running=(), *, free=1000, total=None, max_model_len=8192, state=None, now=0.0):
    return EngineView(now, list(waiting), list(running), free,
                      total if total is not None else free + sum(r.num_blocks for r in running),
                      BLOCK, max_model_len, policy_state=state)

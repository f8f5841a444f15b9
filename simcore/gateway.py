"""Admission control in front of one engine replica, as a load balancer or API gateway does it: a cap on the
requests waiting or outstanding (beyond it a new request is refused, an HTTP 429), a maximum time in the
queue before the first admission (beyond it the request is dropped), and a client time-out (a client whose
first token has not come after that long abandons the request, and the engine frees its work).

Each ends the request as the engine's own refusals do (status rejected, with its reason), so every count,
flag and goodput rule treats it alike. A request abandoned while it runs leaves at the end of the step in
flight, as vLLM handles an abort between steps (vllm/v1/engine/core.py `abort_requests`); a token that step
samples for it reaches nobody. The rules here serve both engines: the SimPy engine (simcore/engine.py, the
`watch` process below) and the fast path (simcore/fast/gateway.py, the same watch as events of its loop).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from simcore.request import Request, Status

GATEWAY_FULL, QUEUE_TIMEOUT, CLIENT_TIMEOUT = "gateway_full", "queue_timeout", "client_timeout"
GATEWAY_REASONS = (GATEWAY_FULL, QUEUE_TIMEOUT, CLIENT_TIMEOUT)


@dataclass(frozen=True)
class GatewayLimits:
    """None: no such limit. Counts are the replica's own: `max_waiting` requests queued (new or preempted),
    `max_outstanding` requests arrived and not yet ended (queued or running)."""
    max_waiting: int | None = None
    max_outstanding: int | None = None
    max_queue_s: float | None = None
    client_timeout_s: float | None = None

    @property
    def has_deadlines(self) -> bool:
        return self.max_queue_s is not None or self.client_timeout_s is not None


def refusal(limits: GatewayLimits, num_waiting: int, num_outstanding: int) -> str | None:
    """GATEWAY_FULL when a new request finds a cap reached, else None."""
    if limits.max_waiting is not None and num_waiting >= limits.max_waiting:
        return GATEWAY_FULL
    if limits.max_outstanding is not None and num_outstanding >= limits.max_outstanding:
        return GATEWAY_FULL
    return None


class Deadlines:
    """Each admitted-to-the-queue request's queue deadline and client deadline, in arrival order (each is
    arrival + a constant, so two FIFO queues are already sorted)."""

    def __init__(self, limits: GatewayLimits):
        self.limits = limits
        self.queue: deque[tuple[float, Request]] = deque()
        self.client: deque[tuple[float, Request]] = deque()

    def add(self, req: Request, now_s: float) -> None:
        if self.limits.max_queue_s is not None:
            self.queue.append((now_s + self.limits.max_queue_s, req))
        if self.limits.client_timeout_s is not None:
            self.client.append((now_s + self.limits.client_timeout_s, req))

    def next_s(self) -> float | None:
        times = [q[0][0] for q in (self.queue, self.client) if q]
        return min(times) if times else None

    def due(self, now_s: float) -> list[tuple[Request, str]]:
        """Requests whose deadline is now and that it still applies to, with the reason: a queue deadline
        to one never admitted (still waiting), a client deadline to one without a first token."""
        out = []
        while self.queue and self.queue[0][0] <= now_s:
            req = self.queue.popleft()[1]
            if req.admitted_s is None and req.status is Status.WAITING and req.reject_reason is None:
                out.append((req, QUEUE_TIMEOUT))
        while self.client and self.client[0][0] <= now_s:
            req = self.client.popleft()[1]
            if req.first_token_s is None and req.reject_reason is None and req.status is not Status.FINISHED:
                out.append((req, CLIENT_TIMEOUT))
        return out


def gateway_counts(reject_reasons) -> dict:
    """The results-row counts of what the gateway ended, from the requests' reject reasons: refused on
    arrival (429), dropped at the queue deadline, abandoned by their clients."""
    reasons = list(reject_reasons)
    return {"num_gateway_refused": reasons.count(GATEWAY_FULL), "num_dropped": reasons.count(QUEUE_TIMEOUT),
            "num_abandoned": reasons.count(CLIENT_TIMEOUT)}


def watch(engine):
    """SimPy process: at each deadline, end the requests it applies to (`engine.end_at_gateway`)."""
    env, deadlines = engine.env, engine.deadlines
    while True:
        t = deadlines.next_s()
        if t is None:
            engine.deadline_wake = env.event()
            yield engine.deadline_wake
            continue
        if t > env.now:
            yield env.timeout(t - env.now)
        for req, reason in deadlines.due(env.now):
            engine.end_at_gateway(req, reason)

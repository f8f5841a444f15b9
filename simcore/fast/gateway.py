"""Admission control (simcore/gateway.py) on a fast engine: the same rules (`refusal`, `Deadlines`), with the
SimPy engine's watch process (`simcore.gateway.watch`) as an event source of the fast event loop.

The watch is one SimPy process per replica. It starts at time 0 before its engine; while no deadline is
pending it waits for a wake event, which the first request to join the queue triggers (an event at that
instant, numbered then); otherwise it sleeps until the earliest deadline (`now + (t - now)`, SimPy's own
float operations) and there ends the requests the deadline still applies to. Its pending event is never
cancelled, so a fast engine keeps it as (time, seq) and processes it in SimPy's order: the single engine
as one more source (and a quiet stretch ends at the step in flight when it comes), a cluster in its
driver-event heap.
"""
from __future__ import annotations

from simcore.gateway import Deadlines, GatewayLimits, refusal

INF = float("inf")
INIT, WAKE, TIMEOUT = "init", "wake", "timeout"   # what the watch's pending event is


class FastGateway:
    """The gateway of one fast engine (`engine`): its caps, and, with deadlines, its watch. `push(t, seq)`
    is called with each event the watch schedules (a cluster's heap); `due_s`/`due_seq` is the pending one
    (INF: it waits for a wake)."""

    def __init__(self, engine, limits: GatewayLimits, init_seq: float, push=None):
        self.engine, self.limits, self.push = engine, limits, push
        self.deadlines = Deadlines(limits) if limits.has_deadlines else None
        self.armed = False   # the watch waits on its wake event, untriggered (SimPy: engine.deadline_wake)
        self.due_s, self.due_seq, self.kind = INF, 0, None
        if self.deadlines is not None:
            self._schedule(0.0, init_seq, INIT)

    def refusal(self, num_waiting: int, num_outstanding: int) -> str | None:
        return refusal(self.limits, num_waiting, num_outstanding)

    def added(self, req, now: float) -> None:
        """`req` joined the queue at `now`: its deadlines; a waiting watch is woken (an event now)."""
        self.deadlines.add(req, now)
        if self.armed:
            self.armed = False
            self._schedule(now, self._number(), WAKE)

    def _number(self) -> int:
        holder = self.engine.traffic.holder   # whoever holds the event counter now
        seq = holder.seq
        holder.seq += 1
        return seq

    def _schedule(self, t: float, seq, kind: str) -> None:
        self.due_s, self.due_seq, self.kind = t, seq, kind
        if self.push is not None:
            self.push(t, seq, self)

    def fire(self, now: float) -> None:
        """The watch's pending event at `now` (the caller holds the event counter): after a sleep, the due
        requests end; then it sleeps until the next deadline, or waits for a wake."""
        deadlines, engine = self.deadlines, self.engine
        after_sleep = self.kind is TIMEOUT
        self.due_s, self.kind = INF, None
        while True:
            if after_sleep:
                for req, reason in deadlines.due(now):
                    engine.end_at_gateway(req, reason, now)
            t = deadlines.next_s()
            if t is None:
                self.armed = True
                return
            if t > now:
                self._schedule(now + (t - now), self._number(), TIMEOUT)
                return
            after_sleep = True

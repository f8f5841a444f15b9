"""Autoscaling (simcore/autoscaler.py) on the fast cluster (simcore/fast/cluster.py): the same rules
(`Autoscaling`: routing among the serving replicas, each look's decision, start-ups, drains, GPU time),
with the SimPy process's events as driver events of the cluster's loop, numbered as SimPy numbers them.

The SimPy scaler is a process started after the engines (its first look is numbered once their processes
have started, before the arrivals'); each look schedules the next one, and a start-up's own process is
started with an urgent event after the look, so its timer is numbered after the next look's.
"""
from __future__ import annotations

from simcore.autoscaler import Autoscaling

START, LOOK, SERVE = "scaler_start", "scaler_look", "scaler_serve"
SCALER_KINDS = (START, LOOK, SERVE)


class FastAutoscaling(Autoscaling):
    """The autoscaler of a fast cluster whose replicas are `replicas`; `schedule(t, kind, payload)` puts an
    event in the cluster's heap, numbered by whoever holds the event counter."""

    def __init__(self, replicas, router, limits, num_requests: int, schedule):
        super().__init__(replicas, router, limits, num_requests)
        self.schedule = schedule
        self.sampled: list[tuple[float, float]] | None = None   # ttft_p99_s: (time, TTFT) since the last look
        if limits.signal == "ttft_p99_s":
            self.sampled = []
            for replica in replicas:
                replica.first_token_sink = self.sampled

    def first_tokens(self):
        out, self.sampled[:] = list(self.sampled), []
        return out

    def on_event(self, kind: str, payload, now: float) -> None:
        """The scaler's event `kind` at `now` (the caller holds the event counter)."""
        if kind is SERVE:
            self.serve(payload, now)
            return
        started = self.look(now) if kind is LOOK else None
        if self.idle():
            self.finish(now)
        else:
            self.schedule(now + self.limits.interval_s, LOOK, None)
        if started is not None:
            self.schedule(now + self.limits.startup_s, SERVE, started)

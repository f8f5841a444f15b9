"""Autoscaling a cluster of replicas (simcore/cluster.py) as Kubernetes' HPA or KEDA does it: every
`interval_s` a signal is read over the serving replicas; above `scale_up_above` one replica is started, below
`scale_down_below` one is drained; after any action none for `cooldown_s`. A started replica serves only
after `startup_s` (loading weights, capturing CUDA graphs); a draining one takes no new request and leaves
when the step that ends its last one ends. GPU time is counted from a replica's start to its leaving (a
replica still serving at the end: to the scaler's last look, at most `interval_s` after the last request).

The rules (`Autoscaling`) are shared by the SimPy engine (`AutoscaledCluster`, a process) and the fast
path (simcore/fast/autoscaling.py, events of its own loop), so both take the same decisions. Ignored:
scaling by more than one replica per decision, failed starts, requests routed to a replica that is starting
(they wait at the router's choice among the serving ones).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from simcore.cluster import Cluster, ReplicaLoad
from simcore.errors import SimulationError
from simcore.request import RequestSpec

SIGNALS = ("waiting_per_replica", "running_per_replica", "kv_usage", "ttft_p99_s")
OFF, STARTING, SERVING, DRAINING = "off", "starting", "serving", "draining"


@dataclass(frozen=True)
class AutoscalingLimits:
    min_replicas: int
    max_replicas: int
    signal: str
    scale_up_above: float
    scale_down_below: float
    startup_s: float
    interval_s: float = 15.0     # Kubernetes HPA's default sync period (--horizontal-pod-autoscaler-sync-period)
    cooldown_s: float = 60.0
    window_s: float = 60.0       # ttft_p99_s: first tokens of the last window_s seconds


@dataclass(frozen=True)
class ScalingEvent:
    time_s: float
    replica_id: int
    kind: str          # start, serve, drain, leave


class Autoscaling(Cluster):
    """The scaler's rules over `max_replicas` engines (SimPy's or the fast path's), of which only the serving
    ones receive requests; its clock is the caller's, so that both engines share every decision: `look(now)`
    every `interval_s`, `serve(i, now)` when a start-up ends, `after_step(replica_id, now)` after each applied
    step, `finish(now)` at its last look. `events` is the scaling log; `gpu_s` the GPU time per replica."""

    def __init__(self, engines, router, limits: AutoscalingLimits, num_requests: int):
        super().__init__(engines, router)
        self.num_requests = num_requests   # the scaler stops once all have been routed and none is left
        if not 1 <= limits.min_replicas <= limits.max_replicas == len(engines):
            raise SimulationError("autoscaling: needs 1 <= min_replicas <= max_replicas engines")
        self.limits = limits
        self.state = [SERVING if i < limits.min_replicas else OFF for i in range(len(engines))]
        self.since = [0.0 if i < limits.min_replicas else None for i in range(len(engines))]
        self.gpu_s = [0.0] * len(engines)
        self.events: list[ScalingEvent] = [ScalingEvent(0.0, i, "serve") for i in range(limits.min_replicas)]
        self.last_action_s = -float("inf")
        self.end_s = 0.0   # the scaler's last look
        self.ttfts: deque[tuple[float, float]] = deque()

    # ---- routing among the serving replicas only ----
    def loads(self, spec: RequestSpec) -> list[ReplicaLoad]:
        # only theirs are built: a day's fleet is mostly off, and routing builds them for every request
        return super().loads(spec, [i for i, s in enumerate(self.state) if s == SERVING])

    def route(self, spec: RequestSpec) -> int:
        loads = self.loads(spec)
        i = self.router.route(spec, loads, self.num_routed)
        if self.state[i] != SERVING:
            raise SimulationError(f"router {self.router.name} picked replica {i}, which is {self.state[i]}")
        self.num_routed += 1
        self.routed_to.append(i)
        return i

    # ---- the scaler ----
    def signal(self, now: float) -> float:
        serving = [e for e, s in zip(self.engines, self.state) if s == SERVING]
        kind = self.limits.signal
        if kind == "waiting_per_replica":
            return sum(len(e.waiting) for e in serving) / len(serving)
        if kind == "running_per_replica":
            return sum(len(e.running) for e in serving) / len(serving)
        if kind == "kv_usage":
            return float(np.mean([e.pool.num_used_blocks / e.pool.num_blocks for e in serving]))
        return self._ttft_p99_s(now)

    def first_tokens(self):
        """(time, TTFT) of the first tokens sampled since the last call, in the order the engines sampled them."""
        raise NotImplementedError

    def _ttft_p99_s(self, now: float) -> float:
        self.ttfts.extend(self.first_tokens())
        while self.ttfts and self.ttfts[0][0] < now - self.limits.window_s:
            self.ttfts.popleft()
        return float(np.percentile([t for _, t in self.ttfts], 99)) if self.ttfts else 0.0

    def idle(self) -> bool:
        """No request left anywhere and none to come: the scaler stops, so the run can end."""
        return self.num_routed >= self.num_requests and not any(e.waiting or e.running for e in self.engines)

    def look(self, now: float) -> int | None:
        """One look of the scaler at `now`: the replica it started (whose start-up the caller times), else None."""
        lim = self.limits
        self._leave_drained(now)
        if now - self.last_action_s < lim.cooldown_s:
            return None
        value = self.signal(now)
        active = [i for i, s in enumerate(self.state) if s in (SERVING, STARTING)]
        if value > lim.scale_up_above and len(active) < lim.max_replicas:
            return self._start(self.state.index(DRAINING) if DRAINING in self.state else self.state.index(OFF),
                               now)
        if value < lim.scale_down_below and sum(s == SERVING for s in self.state) > lim.min_replicas \
                and STARTING not in self.state:
            serving = [i for i, s in enumerate(self.state) if s == SERVING]
            e = self.engines
            self._drain(max(serving, key=lambda i: (-(len(e[i].waiting) + len(e[i].running)), i)), now)
        return None

    def finish(self, now: float) -> None:
        """The run's end: GPU time up to the scaler's last look."""
        self.end_s = now
        for i, s in enumerate(self.state):
            if s != OFF:
                self.gpu_s[i] += now - self.since[i]
                self.since[i] = now

    def _start(self, i: int, now: float) -> int | None:
        self.last_action_s = now
        if self.state[i] == DRAINING:   # a draining replica is taken back at once: it is still loaded
            self.state[i] = SERVING
            self.events.append(ScalingEvent(now, i, "serve"))
            return None
        self.state[i], self.since[i] = STARTING, now
        self.events.append(ScalingEvent(now, i, "start"))
        return i

    def serve(self, i: int, now: float) -> None:
        """Replica `i`'s start-up ended: it serves."""
        self.state[i] = SERVING
        self.events.append(ScalingEvent(now, i, "serve"))

    def _drain(self, i: int, now: float) -> None:
        self.state[i] = DRAINING
        self.events.append(ScalingEvent(now, i, "drain"))
        self.last_action_s = now
        self._leave_drained(now)

    def after_step(self, replica_id: int, now: float) -> None:
        """A replica applied a step: a draining replica leaves with the step that ends its last request."""
        if self.state[replica_id] == DRAINING:
            self._leave_drained(now)

    def _leave_drained(self, now: float) -> None:
        for i, s in enumerate(self.state):
            e = self.engines[i]
            if s == DRAINING and not (e.waiting or e.running or e.draining):
                self.state[i] = OFF
                self.gpu_s[i] += now - self.since[i]
                self.since[i] = None
                self.events.append(ScalingEvent(now, i, "leave"))

    def replica_timeline(self) -> list[tuple[float, int]]:
        """(time, replicas holding a GPU: starting, serving or draining) at each change."""
        n, out = 0, []
        for ev in self.events:
            n += {"start": 1, "leave": -1}.get(ev.kind, 0) + (1 if ev.kind == "serve" and ev.time_s == 0.0 else 0)
            if out and out[-1][0] == ev.time_s:
                out[-1] = (ev.time_s, n)
            elif not out or out[-1][1] != n:
                out.append((ev.time_s, n))
        return out


class AutoscaledCluster(Autoscaling):
    """The autoscaler on the SimPy engine: a process that looks every `interval_s`, one per start-up."""

    def __init__(self, engines, router, limits: AutoscalingLimits, num_requests: int):
        super().__init__(engines, router, limits, num_requests)
        self.env = engines[0].env
        self.num_events_seen = 0
        self.arrival_s: dict[int, float] = {}   # ttft_p99_s: each request's arrival
        for e in self.engines:   # a draining replica leaves with the step that ends its last request
            e.on_step = self._after_step
        self.env.process(self._scaler())

    def submit(self, spec: RequestSpec) -> None:
        if self.limits.signal == "ttft_p99_s":   # the first-token events carry only the request's id
            self.arrival_s[spec.request_id] = spec.arrival_s
        super().submit(spec)

    def first_tokens(self):
        events = self.engines[0].log.events
        out = [(e.time_s, e.time_s - self.arrival_s[e.request_id]) for e in events[self.num_events_seen:]
               if e.kind == "first_token"]
        self.num_events_seen = len(events)
        return out

    def _scaler(self):
        env = self.env
        while not self.idle():
            yield env.timeout(self.limits.interval_s)
            started = self.look(env.now)
            if started is not None:
                env.process(self._serve_after_startup(started))
        self.finish(env.now)

    def _serve_after_startup(self, i: int):
        yield self.env.timeout(self.limits.startup_s)
        self.serve(i, self.env.now)

    def _drain(self, i: int, now: float | None = None) -> None:
        super()._drain(i, self.env.now if now is None else now)

    def _after_step(self, engine, batch) -> None:
        self.after_step(engine.replica_id, self.env.now)

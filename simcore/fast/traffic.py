"""Traffic of the fast engines (simcore/fast/engine.py, simcore/fast/cluster.py): open-loop arrivals and
closed-loop users, as simcore/arrivals.py's SimPy processes order their events.

Events are ordered as SimPy orders them: by time, then by creation order (`seq`, one counter for the whole
simulation). Whoever is processing an event holds the counter (`holder`: the engine or cluster that runs
the event loop, or in a cluster the replica whose event it is), so events created anywhere get SimPy's order.
"""
from __future__ import annotations

import heapq
from dataclasses import replace

from simcore.request import RequestSpecs

INF = float("inf")


class Traffic:
    """The arrivals of `specs` (sorted by arrival) or, with `closed = (concurrency, think_time_s)`, the
    closed-loop users who send them in order; each request goes to `submit(index, spec, now)`. `owner`
    runs the event loop and holds the event counter (`seq`) between events."""

    def __init__(self, specs, closed: tuple[int, float] | None, submit, owner):
        self.specs, self.closed, self.submit = specs, closed, submit
        self.holder = owner
        self.timers: list = []           # (time, seq, user): think timers of closed-loop users
        # Urgent events created by the engine event being processed, started after it (`flush_deferred`):
        # users whose think timer starts (ints), and what `start_urgent` starts (a deployment's KV copies).
        self.deferred: list = []
        self.deferring = False           # an engine event is being processed
        self.start_urgent = None
        self.next_arrival, self.arrival_s, self.arrival_seq = 0, INF, 0
        self.arrival_times = ()
        self.next_spec = 0
        self.watch = None                # a single engine's gateway watch (simcore/fast/gateway.py), if any

    def start(self) -> None:
        """Before the first event: closed-loop users send their first requests at time 0 (as
        ClosedLoopUsers.start, before the clock runs), or the open-loop arrival process is started."""
        self.deferring = True
        if self.closed:
            for user in range(min(self.closed[0], len(self.specs))):
                self.send(user, 0.0)
        else:
            self.arrival_s, self.arrival_seq = 0.0, -1   # the arrival process starts after the engines
            specs = self.specs   # arrival times as plain floats, read without building the specs
            self.arrival_times = (specs.arrival_s if isinstance(specs, RequestSpecs)
                                  else [s.arrival_s for s in specs])
        self.deferring = False

    def on_done(self, req, now: float) -> None:
        """A closed-loop user's request finished or was rejected: it sends the next after its think time."""
        user = req.spec.user_id
        think = self.closed[1]
        if think <= 0:
            self.send(user, now)
        elif self.deferring:  # the engine acts first at this instant (see flush_deferred)
            self.deferred.append(user)
        else:
            self.think(user, now)

    def think(self, user: int, now: float) -> None:
        """The user's think timer (ClosedLoopUsers._after_think's timeout), numbered now."""
        holder = self.holder
        heapq.heappush(self.timers, (now + self.closed[1], holder.seq, user))
        holder.seq += 1

    def send(self, user: int, now: float) -> None:
        k = self.next_spec
        if k < len(self.specs):
            self.next_spec += 1
            self.submit(k, replace(self.specs[k], arrival_s=now, user_id=user), now)

    def flush_deferred(self, now: float) -> None:
        """The urgent events of the engine event just processed: SimPy starts each user's think process
        (and a deployment each KV copy's process) with an urgent event after the engine has scheduled its
        next step, so their timers come after that step in creation order."""
        for item in self.deferred:
            if item.__class__ is int:
                self.think(item, now)
            else:
                self.start_urgent(item, now)
        self.deferred.clear()

    def next_external(self) -> tuple[float, int]:
        """(time, seq) of the next arrival, think timer or gateway event: what can change an engine's state
        from outside."""
        ext = (self.arrival_s, self.arrival_seq)
        if self.timers and self.timers[0][:2] < ext:
            ext = self.timers[0][:2]
        watch = self.watch   # a gateway deadline may end a waiting request
        if watch is not None and (watch.due_s, watch.due_seq) < ext:
            ext = (watch.due_s, watch.due_seq)
        return ext

    def arrivals(self, now: float, first: bool) -> None:
        """simcore.arrivals.open_loop: submit the due arrival(s), then sleep until the next one."""
        k, specs, times, submit = self.next_arrival, self.specs, self.arrival_times, self.submit
        n = len(times)
        if not first:
            submit(k, specs[k], now)
            k += 1
        while k < n and times[k] <= now:
            submit(k, specs[k], now)
            k += 1
        self.next_arrival = k
        if k < n:
            holder = self.holder
            self.arrival_s, self.arrival_seq = now + (times[k] - now), holder.seq
            holder.seq += 1
        else:
            self.arrival_s = INF

"""Traffic of the fast engines (simcore/fastpath.py, simcore/fastcluster.py): open-loop arrivals and
closed-loop users, as simcore/arrivals.py's SimPy processes order their events.

Events are ordered as SimPy orders them: by time, then by creation order (`seq`, one counter for the whole
simulation). Whoever is processing an event holds the counter (`holder`: the traffic itself, or in a
cluster the replica whose event it is), so events created anywhere get SimPy's order.
"""
from __future__ import annotations

import heapq
from dataclasses import replace

from simcore.request import RequestSpecs

INF = float("inf")


class FastTraffic:
    """Mixed into a fast engine or cluster, which provides `specs`, `closed` (None, or (concurrency,
    think_time_s)), `seq`, `holder` and `_submit(k, spec, now)` (a replica's submit, or the router's)."""

    def _start_traffic(self) -> None:
        """Before the first event: closed-loop users send their first requests at time 0 (as
        ClosedLoopUsers.start, before the clock runs), or the open-loop arrival process is started."""
        self.timers: list = []           # (time, seq, user): think timers of closed-loop users
        self.deferred: list[int] = []     # users whose think timer is created after the engine acts
        self.arr_k, self.arr_t, self.arr_e = 0, INF, 0
        self.deferring = True
        if self.closed:
            self.next_spec = 0
            for user in range(min(self.closed[0], len(self.specs))):
                self._send(user, 0.0)
        else:
            self.arr_t, self.arr_e = 0.0, -1   # the arrival process starts after the engines
            specs = self.specs   # arrival times as plain floats, read without building the specs
            self.arr_times = specs.arrival_s if isinstance(specs, RequestSpecs) else [s.arrival_s for s in specs]
        self.deferring = False

    def _on_done(self, req, now: float) -> None:
        """A closed-loop user's request finished or was rejected: it sends the next after its think time."""
        user = req.spec.user_id
        think = self.closed[1]
        if think <= 0:
            self._send(user, now)
        elif self.deferring:  # the engine acts first at this instant (see _flush_timers)
            self.deferred.append(user)
        else:
            self._think(user, now)

    def _think(self, user: int, now: float) -> None:
        """The user's think timer (ClosedLoopUsers._after_think's timeout), numbered now."""
        holder = self.holder
        heapq.heappush(self.timers, (now + self.closed[1], holder.seq, user))
        holder.seq += 1

    def _send(self, user: int, now: float) -> None:
        k = self.next_spec
        if k < len(self.specs):
            self.next_spec += 1
            self._submit(k, replace(self.specs[k], arrival_s=now, user_id=user), now)

    def _flush_timers(self, now: float) -> None:
        """Think timers of requests that ended in the engine event just processed: SimPy starts each user's
        think process with an urgent event after the engine has scheduled its next step, so their timers
        come after that step in creation order."""
        for user in self.deferred:
            self._think(user, now)
        self.deferred.clear()

    def _next_external(self) -> tuple[float, int]:
        """(time, seq) of the next arrival or think timer: what can change the engine's state from outside."""
        ext = (self.arr_t, self.arr_e)
        if self.timers and self.timers[0][:2] < ext:
            ext = self.timers[0][:2]
        return ext

    def _arrivals(self, now: float, first: bool) -> None:
        """simcore.arrivals.open_loop: submit the due arrival(s), then sleep until the next one."""
        k, specs, times = self.arr_k, self.specs, self.arr_times
        n = len(times)
        if not first:
            self._submit(k, specs[k], now)
            k += 1
        while k < n and times[k] <= now:
            self._submit(k, specs[k], now)
            k += 1
        self.arr_k = k
        if k < n:
            self.arr_t, self.arr_e = now + (times[k] - now), self.seq
            self.seq += 1
        else:
            self.arr_t = INF

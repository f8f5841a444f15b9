"""A cluster of replicas behind a router on the fast path: simcore/cluster.py's semantics without SimPy.

Each replica is a fast engine (simcore/fastpath.py) with its own queue, KV pool and lazy decoders; arrivals,
closed-loop users and the router (simcore/cluster.py's `Cluster.route`, the same code the SimPy cluster uses)
live here, and one event loop takes the earliest event of all of them in SimPy's order (time, then creation
order, one counter for the whole simulation). So every table equals the SimPy cluster's bitwise
(tests/test_fastcluster.py), routing decisions and ties included.

What the single fast engine does in bulk, a replica here does step by step: every engine step is an event,
because another replica's event may route a request to it, or end a closed-loop request whose user then
sends, between any two of its steps, and the router reads its live state (queue, running, KV blocks) then.
A replica still skips the per-request work of its decoding requests (lazy decoders) and, with a shortcut
policy, the general `schedule`; while nothing reaches it, its next quiet step goes in flight without asking
the policy (`quiet_step`, simcore/stretch.py). Per-request and per-iteration rows go to one set of columns shared by all
replicas, in the order SimPy's shared log would hold them.
"""
from __future__ import annotations

import heapq
from array import array

import numpy as np

from simcore.cluster import Cluster
from simcore.engine import EngineLimits
from simcore.fastpath import INF, UNFINISHED, WAIT_ENDS, FastEngine, FastLog
from simcore.fasttraffic import FastTraffic
from simcore.request import RequestSpecs

# The fast engine's per-request columns (indexed by the spec's place in the workload): one set for all replicas.
REQUEST_COLUMNS = ("request_ids", "col_arrival", "col_admitted", "col_first", "col_finish", "col_preemptions",
                   "col_status", "reject_reasons")
LOG_ARRAYS = ("rec_f", "rec_i", "itl_v", "itl_c", "itl_e")   # iteration rows and ITL samples, in event order
EVENT_LOG = ("log", "events")   # the request events, when recorded


class FastCluster(FastTraffic):
    """`num_replicas` identical fast engines behind `router`; open loop (`specs` sorted by arrival) or
    closed loop (`closed = (concurrency, think_time_s)`), as experiments/simulate.py wires the SimPy cluster."""

    def __init__(self, policy, cost_model, limits: EngineLimits, specs, router, num_replicas: int,
                 closed: tuple[int, float] | None = None, record_events: bool = False):
        self._build_replicas(policy, cost_model, [limits] * num_replicas, specs, closed, record_events)
        self.cluster = Cluster(self.replicas, router)

    def _build_replicas(self, policy, cost_model, limits: list[EngineLimits], specs, closed,
                        record_events: bool) -> None:
        """One fast engine per item of `limits`, sharing this traffic, the event counter and the columns."""
        self.specs = specs if isinstance(specs, RequestSpecs) else list(specs)   # compact columns stay so
        self.closed = closed
        self.seq, self.holder = 0, self
        self.own_events: list = []   # the driver's own events, (time, seq, kind, payload): KV copies (fastdisagg)
        # Replica 0 builds the request columns from the specs; every replica then writes into the same ones.
        self.replicas = [FastEngine(policy, cost_model, lim, self.specs if i == 0 else (), closed=closed,
                                    traffic=self, record_events=record_events) for i, lim in enumerate(limits)]
        first = self.replicas[0]
        first.specs = []
        for i, replica in enumerate(self.replicas):
            replica.replica_id = i
            for name in REQUEST_COLUMNS + LOG_ARRAYS + EVENT_LOG:
                setattr(replica, name, getattr(first, name))
        self.col_replica = np.zeros(len(self.specs), dtype=np.int32)   # where each request ran (its row's)
        self.rec_r = array("i")   # the replica of each iteration row

    # ---- arrivals: routed, then submitted to the replica (which holds the event counter meanwhile) ----
    def _submit(self, k: int, spec, now: float) -> None:
        i = self.cluster.route(spec)
        self.col_replica[k] = i
        self._submit_to(self.replicas[i], k, spec, now)

    def _submit_to(self, replica: FastEngine, k: int, spec, now: float) -> None:
        # a rejection may end a closed-loop user's request, who then sends again: lend the counter
        self._lend(replica, replica._submit, k, spec, now)

    def _lend(self, replica: FastEngine, fn, *args) -> None:
        """Call `fn(*args)`, which may create events on `replica`, with the event counter lent to it."""
        holder = self.holder
        if replica is holder:
            fn(*args)
            return
        replica.seq, self.holder = holder.seq, replica
        fn(*args)
        holder.seq, self.holder = replica.seq, holder

    # ---- the event loop ----
    def simulate(self) -> FastLog:
        replicas = self.replicas
        n = len(replicas)
        for i, replica in enumerate(replicas):   # the engine processes start first, in replica order
            replica.eng_kind, replica.eng_t, replica.eng_e = "resume", 0.0, i - n - 1
        self._start_traffic()
        first_arrival = True
        own = self.own_events
        while True:
            t, e, source = self.arr_t, self.arr_e, None
            if self.timers and self.timers[0][:2] < (t, e):
                (t, e), source = self.timers[0][:2], self.timers
            if own and own[0][:2] < (t, e):
                (t, e), source = own[0][:2], own
            for replica in replicas:
                if replica.eng_kind is not None and (replica.eng_t < t or (replica.eng_t == t and replica.eng_e < e)):
                    t, e, source = replica.eng_t, replica.eng_e, replica
            if t == INF:
                break
            if source is None:
                self._arrivals(t, first_arrival)
                first_arrival = False
            elif source is self.timers:
                self._send(heapq.heappop(self.timers)[2], t)
            elif source is own:
                _, _, kind, payload = heapq.heappop(own)
                self._driver_event(kind, payload, t)
            else:
                self._replica_event(source, t)
        return self._log()

    def _replica_event(self, replica: FastEngine, now: float) -> None:
        """The replica's pending event, processed with the event counter lent to it."""
        replica.seq, self.holder = self.seq, replica
        kind = replica.eng_kind
        if kind in WAIT_ENDS:   # the engine resumes one event later (simcore/fastpath.py)
            replica.eng_kind, replica.eng_e = "resume", replica.seq
            replica.seq += 1
        elif kind == "swapwait" and not replica.swap_wait_over(now):
            pass   # it waits for its wake event (disaggregation: a KV copy ending)
        else:
            self.deferring = True
            if kind == "complete":
                replica._complete(now)
                self.rec_r.append(replica.replica_id)
            replica._next(now)
            if self.deferred:
                self._flush_timers(now)
            self.deferring = False
        self.seq, self.holder = replica.seq, self

    def _driver_event(self, kind: str, payload, now: float) -> None:
        raise NotImplementedError(kind)   # a plain cluster schedules none (simcore/fastdisagg.py does)

    # ---- results ----
    def _log(self) -> FastLog:
        """The cluster's log: one FastLog over all replicas (their shared columns), plus where each request
        and each iteration ran."""
        first = self.replicas[0]
        for replica in self.replicas[1:]:   # never finished (the caller reports them)
            for req in replica.requests.values():
                replica._record(req, UNFINISHED)
        first.num_logged = sum(r.num_logged for r in self.replicas)
        first.specs, self.specs = self.specs, []
        log = first._log()
        log.replica_id = self.col_replica
        log.iteration_replica_id = np.frombuffer(self.rec_r, dtype=np.int32)
        return log

    @property
    def prefix_caches(self) -> list:
        """Each replica's prefix-caching pool (empty without prefix caching)."""
        return [r.prefix_cache for r in self.replicas if r.prefix_cache is not None]

"""A cluster of replicas behind a router on the fast path: simcore/cluster.py's semantics without SimPy.

Each replica is a fast engine (simcore/fast/engine.py) with its own queue, KV pool and lazy decoders;
arrivals, closed-loop users and the router (simcore/cluster.py's `Cluster.route`, the same code the SimPy
cluster uses) live here, and one event loop takes the earliest event of all of them in SimPy's order (time,
then creation order, one counter for the whole simulation). So every table equals the SimPy cluster's
bitwise (tests/test_fastcluster.py), routing decisions and ties included.

What the single fast engine does in bulk, a replica here does step by step: every engine step is an event,
because another replica's event may route a request to it, or end a closed-loop request whose user then
sends, between any two of its steps, and the router reads its live state (queue, running, KV blocks) then.
A replica still skips the per-request work of its decoding requests (lazy decoders) and, with a shortcut
policy, the general `schedule`; while nothing reaches it, its next quiet step goes in flight without asking
the policy (`FastEngine.quiet_step`). Per-request and per-iteration rows go to one set of columns shared by
all replicas, in the order SimPy's shared log would hold them.
"""
from __future__ import annotations

import heapq

import numpy as np

from simcore.cluster import Cluster
from simcore.fast.autoscaling import SCALER_KINDS, START, FastAutoscaling
from simcore.fast.engine import COMPLETE, IDLE, RESUME, SWAP_WAIT, WAIT_ENDS, FastEngine
from simcore.fast.gateway import FastGateway
from simcore.fast.log import Events, FastLog, NoEvents, RequestColumns, StepLog, fast_log
from simcore.fast.traffic import INF, Traffic
from simcore.limits import EngineLimits
from simcore.request import RequestSpecs


class ReplicaEvents:
    """The replicas' pending events in the loop's order, for the earliest in O(log n) rather than a scan of
    every replica at every event: a heap of (time, seq, replica index) with lazy deletion. A replica's
    event is (`due_s`, `due_seq`) unless it is IDLE; `update` re-reads the replicas that may have changed,
    and an entry that no longer matches its replica is dropped when it reaches the top. Ties keep the
    scan's order: SimPy's (time, seq), then the lower replica index (seqs are unique, so never reached)."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.heap: list = []
        self.queued: list = [None] * len(replicas)   # each replica's (time, seq) in the heap, if any
        self.update(replicas)

    def update(self, replicas) -> None:
        heap, queued = self.heap, self.queued
        for r in replicas:
            if r.state is not IDLE:
                i, key = r.replica_id, (r.due_s, r.due_seq)
                if queued[i] != key:
                    queued[i] = key
                    heapq.heappush(heap, (r.due_s, r.due_seq, i))

    def first(self):
        """The replica whose event comes first, or None: stale entries are dropped on the way."""
        heap, replicas, queued = self.heap, self.replicas, self.queued
        while heap:
            t, e, i = heap[0]
            r = replicas[i]
            if r.state is not IDLE and r.due_s == t and r.due_seq == e:
                return r
            heapq.heappop(heap)
            if queued[i] == (t, e):
                queued[i] = None
        return None

    def taken(self, replica) -> None:
        """`replica`'s event (the heap's first) is being processed: its entry leaves the heap."""
        heapq.heappop(self.heap)
        self.queued[replica.replica_id] = None


class FastCluster:
    """`num_replicas` identical fast engines behind `router`; open loop (`specs` sorted by arrival) or
    closed loop (`closed = (concurrency, think_time_s)`), as experiments/simulate.py wires the SimPy cluster.
    With `autoscaling` (simcore.autoscaler.AutoscalingLimits; `num_replicas` = its max_replicas) the replicas
    are autoscaled (simcore/fast/autoscaling.py): `cluster` is then the scaler, with its log and GPU time."""

    def __init__(self, policy, cost_model, limits: EngineLimits, specs, router, num_replicas: int,
                 closed: tuple[int, float] | None = None, record_events: bool = False, autoscaling=None,
                 iteration_sink=None, itl_sink=None):
        self._build_replicas(policy, cost_model, [limits] * num_replicas, specs, closed, record_events,
                             iteration_sink, itl_sink)
        if autoscaling is None:
            self.cluster = Cluster(self.replicas, router)
        else:   # started after the engines, before the arrivals (SimPy's order)
            self.cluster = FastAutoscaling(self.replicas, router, autoscaling, len(specs), self._schedule_event)
            self.scaler_after_step = self.cluster.after_step
            heapq.heappush(self.own_events, (0.0, -1.5, START, None))

    def _build_replicas(self, policy, cost_model, limits: list[EngineLimits], specs, closed,
                        record_events: bool, iteration_sink=None, itl_sink=None) -> None:
        """One fast engine per item of `limits`, sharing this traffic, the event counter, the columns and logs.
        With `iteration_sink` the iteration rows (with their replica) and with `itl_sink` the ITL samples
        go to them in chunks as the run goes (simcore/fast/log.py StepLog), so a long run holds neither."""
        specs = specs if isinstance(specs, RequestSpecs) else list(specs)   # compact columns stay so
        self.seq = 0
        self.traffic = Traffic(specs, closed, self._submit, self)
        self.columns = RequestColumns(specs)
        self.steps = StepLog(iteration_sink, itl_sink, with_replicas=True)
        self.log = Events() if record_events else NoEvents()
        self.own_events: list = []   # the driver's own events, (time, seq, kind, payload): KV copies (fast/disagg.py)
        self.replicas = [FastEngine(policy, cost_model, lim, (), closed=closed, cluster=self) for lim in limits]
        n = len(self.replicas)
        for i, replica in enumerate(self.replicas):
            replica.replica_id = i
            if limits[i].gateway is not None:   # each replica's watch starts just before its engine
                replica.gateway = FastGateway(replica, limits[i].gateway, i - n - 1.5, self._push_watch)
        self.replica_of_request = np.zeros(len(specs), dtype=np.int32)   # where each request ran (its row's)
        self.scaler_after_step = None   # autoscaling: a draining replica leaves with its last step
        # Replicas whose pending event may have changed since the loop last looked (everything that changes
        # one from outside goes through `_lend`): the loop re-reads only these (`ReplicaEvents`).
        self.touched: list = []

    # ---- arrivals: routed, then submitted to the replica (which holds the event counter meanwhile) ----
    def _submit(self, k: int, spec, now: float) -> None:
        i = self.cluster.route(spec)
        self.replica_of_request[k] = i
        self._submit_to(self.replicas[i], k, spec, now)

    def _submit_to(self, replica: FastEngine, k: int, spec, now: float) -> None:
        # a rejection may end a closed-loop user's request, who then sends again: lend the counter
        self._lend(replica, replica._submit, k, spec, now)

    def _lend(self, replica: FastEngine, fn, *args) -> None:
        """Call `fn(*args)`, which may create events on `replica`, with the event counter lent to it."""
        self.touched.append(replica)
        traffic = self.traffic
        holder = traffic.holder
        if replica is holder:
            fn(*args)
            return
        replica.seq, traffic.holder = holder.seq, replica
        fn(*args)
        holder.seq, traffic.holder = replica.seq, holder

    # ---- the event loop ----
    def simulate(self) -> FastLog:
        replicas = self.replicas
        n = len(replicas)
        for i, replica in enumerate(replicas):   # the engine processes start first, in replica order
            replica.state, replica.due_s, replica.due_seq = RESUME, 0.0, i - n - 1
        due = ReplicaEvents(replicas)
        traffic = self.traffic
        traffic.start()
        first_arrival = True
        own, timers, touched = self.own_events, traffic.timers, self.touched
        while True:
            if touched:
                due.update(touched)
                touched.clear()
            t, e, source = traffic.arrival_s, traffic.arrival_seq, None
            if timers and timers[0][:2] < (t, e):
                (t, e), source = timers[0][:2], timers
            if own and own[0][:2] < (t, e):
                (t, e), source = own[0][:2], own
            replica = due.first()
            if replica is not None and (replica.due_s < t or (replica.due_s == t and replica.due_seq < e)):
                t, e, source = replica.due_s, replica.due_seq, replica
            if t == INF:
                break
            if source is None:
                traffic.arrivals(t, first_arrival)
                first_arrival = False
            elif source is timers:
                traffic.send(heapq.heappop(timers)[2], t)
            elif source is own:
                _, _, kind, payload = heapq.heappop(own)
                self._driver_event(kind, payload, t)
                # a gateway's watch acts on its own replica (through `_lend` when it ends a user's request);
                # the autoscaler's and a deployment's rarer events may act on any
                touched.extend((payload.engine,) if kind == "gateway" else replicas)
            else:
                due.taken(replica)
                self._replica_event(replica, t)
                touched.append(replica)
        return self._log()

    def _replica_event(self, replica: FastEngine, now: float) -> None:
        """The replica's pending event, processed with the event counter lent to it."""
        traffic = self.traffic
        replica.seq, traffic.holder = self.seq, replica
        state = replica.state
        if state in WAIT_ENDS:   # the engine resumes one event later (simcore/fast/engine.py)
            replica.state, replica.due_seq = RESUME, replica.seq
            replica.seq += 1
        elif state is SWAP_WAIT and not replica.swap_wait_over(now):
            pass   # it waits for its wake event (disaggregation: a KV copy ending)
        else:
            traffic.deferring = True
            if state is COMPLETE:
                replica.complete_step(now)
                self.steps.iteration_replicas.append(replica.replica_id)   # flushed with its row
                if self.scaler_after_step is not None:
                    self.scaler_after_step(replica.replica_id, now)
            replica.next_decision(now)
            if traffic.deferred:
                traffic.flush_deferred(now)
            traffic.deferring = False
            self.steps.flush_if_due()
        self.seq, traffic.holder = replica.seq, self

    def _driver_event(self, kind: str, payload, now: float) -> None:
        """A gateway watch's event (with the counter lent to its replica) or the autoscaler's; a plain
        cluster schedules no other (simcore/fast/disagg.py does)."""
        if kind == "gateway":
            traffic, replica = self.traffic, payload.engine
            replica.seq, traffic.holder = self.seq, replica
            traffic.deferring = True   # ended users think after the watch has slept again
            payload.fire(now)
            if traffic.deferred:
                traffic.flush_deferred(now)
            traffic.deferring = False
            self.seq, traffic.holder = replica.seq, self
        elif kind in SCALER_KINDS:
            self.cluster.on_event(kind, payload, now)
        else:
            raise NotImplementedError(kind)

    def _push_watch(self, t: float, seq, watch) -> None:
        heapq.heappush(self.own_events, (t, seq, "gateway", watch))

    def _schedule_event(self, t: float, kind: str, payload) -> None:
        """A driver event at `t`, numbered now (the cluster holds the counter during the scaler's events)."""
        heapq.heappush(self.own_events, (t, self.seq, kind, payload))
        self.seq += 1

    # ---- results ----
    def _log(self) -> FastLog:
        """The cluster's log: one FastLog over all replicas (their shared columns), plus where each request
        and each iteration ran."""
        for replica in self.replicas:   # never finished (the caller reports them)
            replica.record_unfinished()
        specs, self.traffic.specs = self.traffic.specs, []
        log = fast_log(self.columns, self.steps, specs, self.log.events)
        log.replica_id = self.replica_of_request
        log.iteration_replica_id = np.frombuffer(self.steps.iteration_replicas, dtype=np.int32)
        return log

    @property
    def prefix_caches(self) -> list:
        """Each replica's prefix-caching pool (empty without prefix caching)."""
        return [r.prefix_cache for r in self.replicas if r.prefix_cache is not None]

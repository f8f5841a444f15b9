"""The fast engine: `simcore.engine`'s semantics for one replica without SimPy, for any policy.

The same request records, the same decisions (the policy's own `schedule`, or its `schedule_decodes`
shortcut in the common case), the same KV accounting, the same float operations for every time and the same
event order (SimPy's: time, then creation order), so every table equals the SimPy engine's, bitwise
(tests/test_fastpath.py). Why it is fast: no Python work per running request per step while they all
decode. Decoding requests are lazy decoders (simcore/fast/decoders.py: progress = base + the decoders'
step count); a quiet stretch of decode-only steps is planned at once (simcore/fast/stretch.py) and logged
as arrays; per-request work happens at events only. Per-token gaps are logged as weighted samples (gap,
count). Preemption, admission and KV allocation (swap and prefix caching included) are
simcore/decisions.py's, shared with the SimPy engine. Several replicas behind a router
(simcore/fast/cluster.py) and a disaggregated deployment (simcore/fast/disagg.py) run fast engines as
replicas, one event loop for all. Not modelled (experiments/fast.py falls back to the SimPy engine):
pipeline parallelism, real-hardware executors.
"""
from __future__ import annotations

import heapq
from collections import deque

from simcore.async_scheduling import ArrivalsInStep
from simcore.batch import QUIET, Batch, DecodeShortcut, split_shape
from simcore.decisions import DecisionApplier
from simcore.errors import SimulationError, scheduled_nothing
from simcore.fast.decoders import BY_ORDER, LazyDecoders
from simcore.fast.gateway import FastGateway
from simcore.fast.request import FastRequest
from simcore.fast.log import (FINISHED, REJECTED, UNFINISHED, Events, FastLog, NoEvents, RequestColumns, StepLog,
                              fast_log)
from simcore.fast.pricing import StepPricer
from simcore.fast.state import EngineState, InFlightStep
from simcore.fast.stretch import plan_more_quiet_steps, plan_quiet_steps
from simcore.fast.traffic import INF, Traffic
from simcore.limits import EngineLimits, engine_settings_error
from simcore.request import RequestSpec, RequestSpecs, Status
from simcore.rules import reject_reason
from simcore import speculative
from simcore.view import EngineView

RUNNING = Status.RUNNING
IDLE, RESUME, WOKEN, TIMED = EngineState.IDLE, EngineState.RESUME, EngineState.WOKEN, EngineState.TIMED
SWAP_WAIT, COMPLETE = EngineState.SWAP_WAIT, EngineState.COMPLETE
WAIT_ENDS = (TIMED, WOKEN)   # a timed wait's timeout fired, or its wake event was processed
ARRIVAL, TIMER, GATEWAY = "arrival", "timer", "gateway"   # the event loop's other sources


def padded_tokens(padded) -> int:
    """Tokens a padded shape computes; its rows are usually identical (static batching: up to 256 per step)."""
    first = padded[0]
    return first[0] * len(padded) if padded.count(first) == len(padded) else sum(n for n, _ in padded)


class FastEngine(DecisionApplier):
    """Runs a whole workload: open loop (`specs` sorted by arrival) or closed loop (`closed = (concurrency,
    think_time_s)`, specs taken in order). Running requests that decode are lazy decoders (`decoders`):
    they all take one token in every decode step. Before the policy's general `schedule` they are made
    explicit again, as that walks them one by one anyway.

    In a cluster (simcore/fast/cluster.py) the cluster owns the traffic, the request columns, the step log
    and the event loop; it calls `next_decision` and `complete_step` at this engine's events (`state`,
    `due_s`, `due_seq`), and `received`, `release` and `swap_wait_over` for disaggregation."""

    def __init__(self, policy, cost_model, limits: EngineLimits, specs, closed: tuple[int, float] | None = None,
                 iteration_sink=None, itl_sink=None, record_events: bool = False, cluster=None):
        error = engine_settings_error(policy, limits.preemption_mode, limits.enable_prefix_caching, limits.kv_groups)
        if error:
            raise ValueError(error)
        self.policy, self.limits = policy, limits
        self.pricer = StepPricer(cost_model)
        self.check_invariants = limits.check_invariants
        self._make_pools(limits)   # prefix caching: block identities, every step explicit (vLLM caches per step)
        self.loading: list[FastRequest] = []   # requests whose prefix is loading from the host tier
        self.shortcut = getattr(policy, "schedule_decodes", None)
        if self.hybrid_kv is not None:   # sliding groups free blocks at each request's own phase: every step explicit
            self.shortcut = None
        # Speculative decoding (simcore/speculative.py): every step explicit (a lazy decoder takes one token
        # a step; a verification takes a drawn number), each priced and applied as the SimPy engine does.
        self._set_up_speculation(limits, policy)
        if self.speculation is not None:
            self.shortcut = None
        self.holds_slots = bool(getattr(policy, "holds_slots_until_drained", False))
        self.block_size, self.max_model_len = limits.block_size, limits.max_model_len
        self.num_blocks = self.pool.num_blocks
        self.replica_id = 0
        self.requests: dict[int, FastRequest] = {}   # live requests only: released when they leave
        self.num_admissions = 0
        self.waiting: deque[FastRequest] = deque()
        self.running: list[FastRequest] = []
        self.draining: list[FastRequest] = []
        self.prefilling: set[FastRequest] = set()   # running requests still prefilling (never lazy)
        self.policy_state = None
        self.decoders = LazyDecoders(self.block_size, self.prefix_cache)
        self.explicit_step = False   # the lazy decoders were made explicit for the step in flight
        # The view of a `schedule_decodes` call: asked very often, so one object brought up to date.
        self.shortcut_view = EngineView(0.0, (), (), 0, self.num_blocks, self.block_size, self.max_model_len,
                                        self.draining, decoders=self.decoders)
        if cluster is None:   # its own traffic, columns and logs
            specs = specs if isinstance(specs, RequestSpecs) else list(specs)   # compact columns stay so
            self.traffic = Traffic(specs, closed, self._submit, self)
            self.columns = RequestColumns(specs)
            self.steps = StepLog(iteration_sink, itl_sink)
            self.log = Events() if record_events else NoEvents()
        else:   # the cluster's, shared by its replicas
            self.traffic, self.columns, self.steps = cluster.traffic, cluster.columns, cluster.steps
            self.log = cluster.log
        self.events = self.log.events   # None unless recording
        # In a cluster, every step is an event of its own (see _stretch); `quiet_step`: the step in flight
        # is quiet and nothing has reached this engine since.
        self.one_step = cluster is not None
        self.quiet_step = False
        # async scheduling (simcore/async_scheduling.py): arrivals while a step is in flight join the queue
        # after the next decision; `released`: some just did, so the step put in flight now goes alone
        # (the decision after it must see them)
        self.late = ArrivalsInStep() if limits.async_scheduling else None
        self.released = False
        # Called with (request, now) when a request finishes or is rejected: closed-loop users, or a
        # disaggregated deployment's decode-side hook (simcore/fast/disagg.py).
        self.on_done = self.traffic.on_done if closed else None
        # Disaggregation (simcore/fast/disagg.py): a prefill replica hands each request off after its first
        # token (`sending`: KV held until `release`); a decode replica receives prefilled requests.
        self.handoff = limits.handoff_after_first_token
        self.on_handoff = None            # called with (request, now) for each request handed off
        self.sending: list[FastRequest] = []
        self.receiving: list[FastRequest] = []
        self.joining: list[FastRequest] = []   # received decodes, lazy from the next decision on
        self.swap_woken = None            # (time, seq) of a wake while sleeping through a swap-out
        self.seq = 0                      # creation order of events, SimPy's tie-break at equal times
        # The pending event: what it does, when, and its place in the order. The engine process starts first.
        self.state, self.due_s, self.due_seq = RESUME, 0.0, -2
        self.in_flight = InFlightStep()
        # Admission control (simcore/fast/gateway.py; a cluster sets up its replicas'); its watch starts
        # before the engine. `abandoning`: clients that left while their request's step runs.
        self.gateway, self.abandoning = None, []
        self.first_token_sink = None   # a list given (time, TTFT) of each first token (autoscaling's signal)
        if limits.gateway is not None and cluster is None:
            self.gateway = FastGateway(self, limits.gateway, -3)
            self.traffic.watch = self.gateway if self.gateway.deadlines is not None else None

    @property
    def prefix_caches(self) -> list:
        """The prefix-caching pool, as a one-item list (empty without prefix caching); as FastCluster's."""
        return [self.prefix_cache] if self.prefix_cache is not None else []

    # ---- requests arriving ----
    def _submit(self, k: int, spec: RequestSpec, now: float) -> None:
        req = FastRequest(spec, k)
        self.quiet_step = False
        columns = self.columns
        columns.arrival_s[k] = spec.arrival_s
        if self.events is not None:
            self.log.event(now, req, "arrived")
        reason = reject_reason(spec, self.policy, self.max_model_len, self.num_blocks, self.block_size,
                               self.limits.kv_groups, self.speculation)
        gateway = self.gateway
        if reason is None and gateway is not None:
            reason = gateway.refusal(len(self.waiting), len(self.waiting) + len(self.running))
        if reason:
            req.status, req.reject_reason, req.finish_s = Status.REJECTED, reason, now
            if self.events is not None:
                self.log.event(now, req, "rejected")
            columns.reject_reasons[k] = reason
            columns.record(req, REJECTED)
            columns.num_left += 1
            if self.on_done is not None:
                self.on_done(req, now)
            return
        self.requests[spec.request_id] = req
        if self.late is not None and self.state is COMPLETE:   # simcore.engine: arrived while a step ran
            self.late.hold(req)
        else:
            self.waiting.append(req)
        if gateway is not None and gateway.deadlines is not None:
            gateway.added(req, now)   # (its wake, if any, is numbered before the engine's)
        self._wake_up(now)

    def end_at_gateway(self, req: FastRequest, reason: str, now: float, in_step: bool | None = None) -> None:
        """simcore.engine.Engine.end_at_gateway: `req` leaves with `reason` now or, running in the step in
        flight (`in_step`, default: one is), when that step ends (`complete_step`)."""
        if in_step is None:
            in_step = self.state is COMPLETE
        if req.status is RUNNING and in_step:
            req.reject_reason = reason
            self.abandoning.append(req)
            return
        self.quiet_step = False
        self.prefilling.discard(req)   # running, it is never a lazy decoder: it has no first token
        self._remove_ended(req)
        req.status, req.reject_reason, req.finish_s = Status.REJECTED, reason, now
        del self.requests[req.request_id]
        columns = self.columns
        columns.reject_reasons[req.index] = reason
        columns.record(req, REJECTED)
        columns.num_left += 1
        if self.events is not None:
            self.log.event(now, req, "rejected")
        if self.on_done is not None:
            self.on_done(req, now)

    def _wake_up(self, now: float) -> None:
        """simcore.engine.Engine._wake_up: the waiting engine's `_wake` event succeeds now."""
        state = self.state
        if state is IDLE or state is TIMED:  # wake the idle engine (its `_wake` event succeeds now)
            # A plain wait resumes on the wake event; a timed wait (`wake | timeout`) one event later, when
            # the condition it waits on fires (SimPy's AnyOf schedules itself when the wake is processed).
            self.state, self.due_s, self.due_seq = (RESUME if state is IDLE else WOKEN), now, self.seq
            self.seq += 1
        elif state is SWAP_WAIT and self.swap_woken is None:   # asleep, then waiting on this wake event
            self.swap_woken = (now, self.seq)
            self.seq += 1

    # ---- the event loop ----
    def simulate(self) -> FastLog:
        traffic = self.traffic
        traffic.start()
        first_arrival = True
        timers = traffic.timers
        steps = self.steps
        streaming = steps.iteration_sink is not None
        idle, timed, woken = IDLE, TIMED, WOKEN   # (locals: read at every event)
        watch = traffic.watch
        while True:   # the earliest of the engine's event, the next arrival and the first timer: (time, seq)
            t, e, source = self.due_s, self.due_seq, self.state
            if source is idle:
                t = INF
            at = traffic.arrival_s
            if at < t or (at == t and traffic.arrival_seq < e):
                t, e, source = at, traffic.arrival_seq, ARRIVAL
            if timers:
                tt, te, _ = timers[0]
                if tt < t or (tt == t and te < e):
                    t, e, source = tt, te, TIMER
            if watch is not None and (watch.due_s < t or (watch.due_s == t and watch.due_seq < e)):
                t, e, source = watch.due_s, watch.due_seq, GATEWAY
            if t == INF:
                break
            if source is ARRIVAL:
                traffic.arrivals(t, first_arrival)
                first_arrival = False
            elif source is TIMER:
                traffic.send(heapq.heappop(timers)[2], t)
            elif source is GATEWAY:   # ended users think after the watch has slept again
                traffic.deferring = True
                watch.fire(t)
                if traffic.deferred:
                    traffic.flush_deferred(t)
                traffic.deferring = False
            elif source is timed or source is woken:   # a wait ended: the engine resumes one event later
                self.state, self.due_seq = RESUME, self.seq
                self.seq += 1
            else:
                traffic.deferring = True
                if source is COMPLETE:
                    self.complete_step(t)
                self.next_decision(t)
                if traffic.deferred:
                    traffic.flush_deferred(t)
                traffic.deferring = False
                if streaming:
                    steps.flush_if_due()
        return self._log()

    # ---- one engine decision ----
    def _view(self, now: float) -> EngineView:
        """The view for the policy's general `schedule` (every running request explicit)."""
        return EngineView(now, self.waiting, self.running, self.num_blocks - self.pool.num_used_blocks,
                          self.num_blocks, self.block_size, self.max_model_len, self.draining, self.policy_state,
                          self.prefix_cache, hybrid_kv=self.hybrid_kv,
                          **self.spec_view_args)

    def decide(self, now: float) -> Batch | DecodeShortcut:
        """The policy's decision now: its `schedule_decodes` shortcut when it offers one and every running
        request decodes (lazy decoders stay lazy), else its `schedule` over explicit records."""
        if (self.shortcut is not None and not self.prefilling and not self.explicit_step and self.running
                and (self.prefix_cache is None or not (self.waiting or self.loading))):   # prefix hits: general
            view = self.shortcut_view
            view.now_s, view.waiting, view.running, view.draining = now, self.waiting, self.running, self.draining
            view.num_free_blocks, view.policy_state = self.num_blocks - self.pool.num_used_blocks, self.policy_state
            shortcut = self.shortcut(view)
            if shortcut is not None:
                return shortcut
        self.decoders.clear(self.running)
        self.explicit_step = True
        return self.policy.schedule(self._view(now))

    def next_decision(self, now: float) -> None:
        """The engine process goes on at `now`: decide, and put the next step (or wait) in place."""
        if self.quiet_step:
            self.quiet_step = False
            if self._continue_quiet(now):
                return
        if self.joining:
            self._join_decoders()
        late = self.late
        while True:
            if self.host_loads is not None:
                self.host_loads.before_decision(self, now)
            if not (self.waiting or self.running):
                if late is not None and late.release_into(self.waiting):
                    continue   # nothing else to run: scheduled at once (simcore.engine)
                break
            batch = self.decide(now)
            if late is not None:
                self.released = late.release_into(self.waiting)
            if batch is QUIET and self.running:   # the most common answer (one shared value): a quiet stretch
                self._stretch(now, None)
                return
            if isinstance(batch, DecodeShortcut):
                self._start_shortcut(batch, now)
                return
            self.policy_state = batch.policy_state
            if not batch.scheduled and (self.sending or self.receiving) and batch.wake_at_s is None:
                self._wait_for_transfers(batch.preempt, now)
                return
            if batch.scheduled:
                self._start(batch.scheduled, 0, batch.preempt, batch.preempt_at, batch.padded_shape, now)
                return
            if batch.preempt:   # vLLM's empty step (simcore/engine.py): no forward pass, decide again
                swap_out_s = self._preempt(batch.preempt, now)
                if swap_out_s:   # the engine process sleeps through the copy (a plain timeout)
                    self.state, self.due_s, self.due_seq = RESUME, now + swap_out_s, self.seq
                    self.seq += 1
                    return
                continue
            wake_at_s = self._wake_at_s(batch.wake_at_s)
            if wake_at_s is None or wake_at_s <= now:
                if self._release_loaded():
                    continue
                raise scheduled_nothing(self.policy.name, now, len(self.waiting), len(self.running),
                                        self.pool.num_free_blocks, self.num_blocks)
            self.state, self.due_s, self.due_seq = TIMED, now + (wake_at_s - now), self.seq
            self.seq += 1
            return
        if self.loading:   # idle but for host loads: a timed wait for the first to end (or an arrival)
            self.state, self.due_s, self.due_seq = TIMED, now + (self.host_loads.next_done_s - now), self.seq
            self.seq += 1
            return
        self.state = IDLE

    def _preempt(self, victims, now_s: float) -> float:
        """simcore.decisions' preemption; the victims also leave `prefilling` (back in the queue, never lazy)."""
        transfer_s = super()._preempt(victims, now_s)
        self.prefilling.difference_update(self.requests[rid] for rid in victims)
        return transfer_s

    def _wait_for_transfers(self, preempt, now: float) -> None:
        """simcore.engine.Engine's wait while KV transfers hold blocks (disaggregation): apply the policy's
        preemptions, sleep through any swap-out, then wait for a transfer to end (`_wake_up`)."""
        swap_out_s = self._preempt(preempt, now) if preempt else 0.0
        if swap_out_s:
            self.state, self.due_s, self.due_seq = SWAP_WAIT, now + swap_out_s, self.seq
            self.seq += 1
            self.swap_woken = None
        else:
            self.state = IDLE

    def swap_wait_over(self, now: float) -> bool:
        """The swap-out sleep of `_wait_for_transfers` ended: True when the engine goes on at once (its wake
        event was processed during the sleep), else it waits for the wake (pending, or still to come)."""
        woken, self.swap_woken = self.swap_woken, None
        if woken is None:
            self.state = IDLE
            return False
        if woken < (now, self.due_seq):
            return True
        self.state, (self.due_s, self.due_seq) = RESUME, woken
        return False

    # ---- disaggregation: hand-off and reception of prefilled requests (simcore/fast/disagg.py) ----
    def received(self, req: FastRequest, now: float) -> None:
        """The KV of `req` (see `receive`) has arrived: it runs from the next step on."""
        self.receiving.remove(req)
        req.status = RUNNING
        self.running.append(req)
        self.quiet_step = False
        req.order = self.num_admissions   # its place in `running` (finish order within a step)
        self.num_admissions += 1
        if not req.num_generated_tokens:   # its first token still to sample here: a one-token prefill step
            self.prefilling.add(req)
        elif self.shortcut is not None:    # a decode: it joins the lazy decoders at the next decision
            self.joining.append(req)
        self._wake_up(now)

    def _join_decoders(self) -> None:
        """Received decodes become lazy decoders before the next decision (not mid-step: the step in flight
        is not theirs). After a general step `complete_step` has made every running decode lazy already."""
        if not self.explicit_step:
            for req in self.joining:
                if not req.lazy:
                    self.decoders.add(req)
        self.joining.clear()

    def release(self, req: FastRequest, now: float) -> None:
        """The KV of a handed-off request has been copied out: free its blocks here."""
        self.sending.remove(req)
        self.pool.free(req)
        req.status = Status.FINISHED
        del self.requests[req.request_id]
        self._wake_up(now)

    # ---- starting a step ----
    def _start_shortcut(self, shortcut: DecodeShortcut, now: float) -> None:
        if shortcut.decode_running and not shortcut.admitted:   # quiet
            if not self.running:
                raise scheduled_nothing(self.policy.name, now, len(self.waiting), None,
                                        self.pool.num_free_blocks, self.num_blocks)
            self._stretch(now, shortcut.padded_shape)
            return
        num_lazy = self.decoders.count if shortcut.decode_running else 0
        if num_lazy:
            growth = self.decoders.growth()
            if growth > self.pool.num_free_blocks:
                raise SimulationError(f"KV pool over capacity: decodes need {growth} blocks")
            self.pool.num_used_blocks += growth
        self._start(shortcut.admitted, num_lazy, (), (), shortcut.padded_shape, now)

    def _start(self, scheduled, num_lazy: int, preempt, preempt_at, padded, now: float) -> None:
        """Apply a decision (simcore/decisions.py: preempt, admit, allocate), price it, put its step in flight."""
        transfer_s = self._preempt(preempt, now) if preempt and not preempt_at else 0.0
        swap_s, admitted = self._admit_and_allocate(scheduled, preempt, preempt_at, now)
        if admitted:
            k = self.num_admissions
            for req in admitted:
                req.order = k
                k += 1
            self.num_admissions = k
            self.prefilling.update(admitted)
        if len(admitted) == len(scheduled):   # every one admitted, in batch order: no lookups by id
            explicit = [(req, s.num_new_tokens, s.num_reserved_tokens) for req, s in zip(admitted, scheduled)]
        else:
            requests = self.requests
            explicit = [(requests[s.request_id], s.num_new_tokens, s.num_reserved_tokens) for s in scheduled]
        if self.speculation is not None:   # simcore.engine's formula, on the same rows in the same order
            rows = [(req, n) for req, n, _ in explicit]
            prefill, decode = split_shape([(n, req.num_computed_tokens) for req, n in rows])
            duration_s = speculative.step_time_s(self.pricer.cost, self.speculation, prefill, decode,
                                                 speculative.num_logits(rows))
        else:
            duration_s = self.pricer.step_time_s(explicit, num_lazy, padded, self.decoders, self.running)
        if transfer_s or swap_s:
            duration_s += transfer_s + swap_s
        step = self.in_flight
        step.explicit, step.num_lazy, step.num_preempted, step.padded_shape = explicit, num_lazy, len(preempt), padded
        step.start_s, step.duration_s = now, duration_s
        self.state, self.due_s, self.due_seq = COMPLETE, now + duration_s, self.seq
        self.seq += 1

    # ---- quiet stretches ----
    def _stretch(self, now: float, padded) -> None:
        """Every running request (all lazy decoders) decodes one token per step until the first finish, the
        first step whose KV growth exceeds the free blocks (a preemption: left to the policy), or the first
        external event (arrival, think timer) before a step ends (simcore/fast/stretch.py). All steps but
        the last are applied here at once; the last is left in flight and completed like any other step."""
        decoders = self.decoders
        num_dec, step = decoders.count, decoders.step
        if num_dec != len(self.running) or self.prefilling:
            raise SimulationError("fast path: a quiet stretch needs every running request decoding")
        if padded is not None:   # padded lock-step rows (static batching): one context, one token further a step
            rows, ctx = len(padded), padded[0][1] + 1   # every row's decode context, first step
            if padded[0] != (1, ctx - 1) or padded.count(padded[0]) != rows:   # (C-speed check: 256 rows)
                raise SimulationError("fast path: a quiet padded step needs identical one-token rows")
            ctx0 = rows * ctx
        else:
            rows, ctx = num_dec, 0
            ctx0 = decoders.base_context_sum + num_dec * (step + 1)
        if self.one_step or self.released:
            # In a cluster every step ends as an event of its own: another replica's event may route a
            # request here or start a think timer between any two steps, and SimPy numbers each step's event
            # when the one before it ends. The stretch goes on step by step (`quiet_step`). Requests just
            # released into the queue (async scheduling): this step alone, then the policy decides again.
            if not self._one_quiet_step(now, padded, rows, ctx, ctx0):
                raise SimulationError(f"{self.policy.name}: schedule_decodes answered a quiet step at t={now:.6f}s, "
                                      f"but the decodes need {decoders.growth()} blocks and "
                                      f"{self.num_blocks - self.pool.num_used_blocks} are free")
            if self.released:
                self.quiet_step = self.released = False
            return
        e0 = self.seq
        self.seq += 1
        traffic = self.traffic
        if traffic.deferred:
            traffic.flush_deferred(now)   # think timers created at this instant come after the first step
        pricer, running = self.pricer, self.running
        max_steps, used = decoders.by_finish[0][0] - step, self.pool.num_used_blocks
        external = traffic.next_external()
        ends, durs, useds = [now], [], []
        if not plan_quiet_steps(pricer.decode_fn(rows, ctx, decoders, running), rows, ctx0, step, self.block_size,
                                decoders.growth_by_phase, max_steps, used, self.num_blocks, e0, external,
                                ends, durs, useds):   # a long stretch: on in vectorised chunks
            plan_more_quiet_steps(lambda sums: pricer.decode_steps_time_s(rows, ctx, sums, decoders, running),
                                  rows, ctx0, step, self.block_size, decoders.growth_by_phase, max_steps, used,
                                  self.num_blocks, external, ends, durs, useds)
        m = len(durs)
        if m == 0:   # a quiet answer promises the decodes fit (simcore.batch.DecodeShortcut)
            raise SimulationError(f"{self.policy.name}: schedule_decodes answered a quiet step at t={now:.6f}s, "
                                  f"but the decodes need {decoders.growth()} blocks and "
                                  f"{self.num_blocks - self.pool.num_used_blocks} are free")
        if decoders.by_block_phase is not None:   # prefix caching: the pool allocates all m steps' blocks now
            decoders.cache_steps(m)
        else:   # every step's blocks, the last one's included, are allocated by its start
            self.pool.num_used_blocks = useds[m - 1]
        if m > 1:   # steps 0 .. m-2 happen here
            self.steps.log_quiet_steps(decoders.by_last_token, ends, durs, useds, num_dec, m - 1,
                                       (0, num_dec, rows - num_dec, num_dec, 0, len(self.waiting),
                                        num_dec + len(self.draining)))
            decoders.skip(m - 1, ends[m - 1])
        last = ((1, ctx + m - 2),) * rows if padded is not None else None
        in_flight = self.in_flight
        in_flight.explicit, in_flight.num_lazy, in_flight.num_preempted, in_flight.padded_shape = [], num_dec, 0, last
        in_flight.start_s, in_flight.duration_s = ends[m - 1], durs[m - 1]
        self.state, self.due_s = COMPLETE, ends[m]
        self.due_seq = e0 if m == 1 else self.seq + m - 2
        self.seq += m - 1

    def _one_quiet_step(self, now: float, padded, rows: int, ctx: int, context_sum: int) -> bool:
        """One quiet step put in flight alone (a cluster's replica): `rows` decodes (padded rows of context
        `ctx`, or the lazy decoders: ctx 0), `context_sum` their contexts' sum. False, with nothing changed,
        when its KV growth does not fit (the policy then decides: a preemption)."""
        decoders = self.decoders
        growth = decoders.growth()
        used = self.pool.num_used_blocks
        if growth > self.num_blocks - used:
            return False
        d = self.pricer.decode_fn(rows, ctx, decoders, self.running)(context_sum)
        if decoders.by_block_phase is not None:   # prefix caching: the pool allocates (and counts) the blocks
            decoders.cache_steps(1)
        else:
            self.pool.num_used_blocks = used + growth   # allocated at the step's start
        step = self.in_flight
        step.explicit, step.num_lazy, step.num_preempted, step.padded_shape = [], decoders.count, 0, padded
        step.start_s, step.duration_s = now, d
        self.state, self.due_s, self.due_seq = COMPLETE, now + d, self.seq
        self.seq += 1
        traffic = self.traffic
        if traffic.deferred:
            traffic.flush_deferred(now)   # think timers created at this instant come after the step
        self.quiet_step = True
        return True

    def _continue_quiet(self, now: float) -> bool:
        """After a quiet step in which nothing finished and nothing reached this replica (`quiet_step`), the
        policy's quiet answer still holds (simcore.batch.DecodeShortcut's promise): the next step goes in
        flight without asking it, unless its KV growth does not fit (False: the policy decides)."""
        padded = self.in_flight.padded_shape
        if padded is not None:   # lock-step rows one token further
            rows, ctx = len(padded), padded[0][1] + 2
            return self._one_quiet_step(now, ((1, ctx - 1),) * rows, rows, ctx, rows * ctx)
        decoders = self.decoders
        n = decoders.count
        return self._one_quiet_step(now, None, n, 0, decoders.base_context_sum + n * (decoders.step + 1))

    # ---- completing a step ----
    def complete_step(self, now: float) -> None:
        """The step in flight ends at `now`: tokens are sampled, requests finish or are handed off, the
        iteration row is logged."""
        step = self.in_flight
        explicit, num_lazy, num_preempted, padded = step.explicit, step.num_lazy, step.num_preempted, step.padded_shape
        steps = self.steps
        decoders = self.decoders
        if num_lazy:
            itl_gaps, itl_counts, itl_ends = steps.itl_gaps, steps.itl_counts, steps.itl_ends
            for lt, count in decoders.by_last_token.items():
                itl_gaps.append(now - lt)
                itl_counts.append(count)
                itl_ends.append(now)
            done = decoders.advance(now)
        else:
            done = []
        num_prefill, num_decode = 0, num_lazy
        gaps, new_decoders, prefilling = {}, [], self.prefilling
        if self.speculation is not None:
            num_prefill, num_decode = self._verify(explicit, now, gaps, done)
        for req, n, _ in (explicit if self.speculation is None else ()):
            c, g = req.num_computed_tokens, req.num_generated_tokens
            total = req.spec.num_prompt_tokens + g
            if total - c == 1 and g > 0:   # rules.is_decode, inlined (the hot loop)
                num_decode += 1
            else:
                num_prefill += n
            c += n
            req.num_computed_tokens = c
            if c == total and req.reject_reason is None:   # caught up, not abandoned: sample one token
                req.num_generated_tokens = g + 1
                if req.first_token_s is None:
                    req.first_token_s = now
                    if self.events is not None:
                        self.log.event(now, req, "first_token")
                    if self.first_token_sink is not None:
                        self.first_token_sink.append((now, now - req.spec.arrival_s))
                else:
                    lt = req.last_token_s
                    gaps[lt] = gaps.get(lt, 0) + 1
                req.last_token_s = now
                prefilling.discard(req)
                if g + 1 == req.spec.num_output_tokens:
                    done.append(req)
                else:
                    new_decoders.append(req)
        if gaps:
            itl_gaps, itl_counts, itl_ends = steps.itl_gaps, steps.itl_counts, steps.itl_ends
            for lt, count in gaps.items():
                itl_gaps.append(now - lt)
                itl_counts.append(count)
                itl_ends.append(now)
        handed_off = None
        if self.handoff and new_decoders:   # a prefill replica (disaggregation) decodes none: they leave
            handed_off, new_decoders = new_decoders, []   # holding their KV until it has been copied
            for req in handed_off:
                self.running.remove(req)
                req.status = Status.SENDING
            self.sending.extend(handed_off)
        if done:
            self.quiet_step = False   # a finish: the policy decides the next step
            if num_lazy and explicit:
                done.sort(key=BY_ORDER)   # finish order = batch order
            self._finish(done, now)
        if self.abandoning:   # their clients left during the step (simcore/gateway.py)
            for req in self.abandoning:
                reason, req.reject_reason = req.reject_reason, None
                self.end_at_gateway(req, reason, now, in_step=False)
            self.abandoning.clear()
        if self.check_invariants and (self.explicit_step or self.shortcut is None
                                      or not 0 <= self.pool.num_used_blocks <= self.num_blocks):
            self._check_invariants()
        if self.shortcut is not None:   # a policy without the shortcut never reads lazy decoders
            if self.explicit_step:
                self.explicit_step = False
                add = decoders.add
                for req in self.running:
                    if req not in prefilling:
                        add(req)
            else:
                for req in new_decoders:
                    decoders.add(req)
        num_padding = padded_tokens(padded) - (num_prefill + num_decode) if padded else 0
        # (array.fromlist: its own path for a list; extend takes the generic one)
        steps.iteration_floats.fromlist([step.start_s, step.duration_s])
        steps.iteration_ints.fromlist([num_prefill, num_decode, num_padding, num_lazy + len(explicit), num_preempted,
                                       len(self.waiting), len(self.running) + len(self.draining),
                                       self.pool.num_used_blocks])
        if self.on_done is not None:
            on_done = self.on_done
            for req in done:
                on_done(req, now)
        if handed_off:
            for req in handed_off:
                self.on_handoff(req, now)

    def _verify(self, explicit, now: float, gaps: dict, done: list) -> tuple[int, int]:
        """`complete_step`'s pass over the step's rows under speculative decoding (simcore.engine's rule):
        each row's drafts verified, its accepted tokens and bonus emitted as one chunk (one ITL gap), its next
        drafts proposed if it goes on. Returns (prefill tokens, decodes) for the iteration row."""
        num_prefill = num_decode = 0
        spec, draws, counters = self.speculation, self.draws, self.spec_counters
        for req, n, _ in explicit:
            g = req.num_generated_tokens
            if req.spec.num_prompt_tokens + g - req.num_computed_tokens == 1 and g > 0:   # rules.is_decode
                num_decode += n   # a verification computes 1 + its drafts
            else:
                num_prefill += n
            emitted = speculative.verified(req, n, draws, counters)
            if not emitted:
                continue
            if self._rewind_drafts:
                speculative.rewind(self.pool, req, spec)
            req.num_generated_tokens = g + emitted
            if req.first_token_s is None:
                req.first_token_s = now
                if self.events is not None:
                    self.log.event(now, req, "first_token")
            else:
                lt = req.last_token_s
                gaps[lt] = gaps.get(lt, 0) + 1
            req.last_token_s = now
            self.prefilling.discard(req)
            if g + emitted == req.spec.num_output_tokens:
                done.append(req)
                draws.forget(req.request_id)
            else:
                req.num_spec_tokens = spec.num_speculative_tokens
        return num_prefill, num_decode

    def _finish(self, done: list, now: float) -> None:
        if len(done) == 1:
            self.running.remove(done[0])
        else:
            gone = set(done)
            self.running = [r for r in self.running if r not in gone]
        requests, columns = self.requests, self.columns
        record = columns.record
        columns.num_left += len(done)
        for req in done:
            req.finish_s = now
            record(req, FINISHED)   # its row is final: nothing below changes it
            del requests[req.request_id]
        if self.events is not None:
            for req in done:
                self.log.event(now, req, "finished")
        self._release_finished(done)

    def _check_invariants(self) -> None:
        """The SimPy engine's per-iteration checks, as far as they are cheap here: the pool within capacity
        always; with every running request explicit (after a general step), the blocks they hold."""
        pool = self.pool
        if not 0 <= pool.num_used_blocks <= pool.num_blocks:
            raise SimulationError(f"KV accounting broken: pool says {pool.num_used_blocks} used of {pool.num_blocks}")
        if not 0 <= self.swap_space.num_used_blocks <= self.swap_space.num_blocks:
            raise SimulationError(f"host swap accounting broken: {self.swap_space.num_used_blocks} blocks used")
        if self.explicit_step or self.shortcut is None:
            held = sum(r.num_blocks for group in (self.running, self.draining, self.sending, self.receiving,
                                                  self.loading) for r in group) + self._num_waiting_blocks()
            expected = getattr(pool, "num_block_refs", pool.num_used_blocks)   # shared blocks, or two pools
            if held != expected:
                raise SimulationError(f"KV accounting broken: pool says {pool.num_used_blocks} used of "
                                      f"{pool.num_blocks}, requests hold {held}")

    # ---- results ----
    def record_unfinished(self) -> None:
        """Write the rows of the requests still here at the end (the caller reports them)."""
        for req in self.requests.values():
            self.columns.record(req, UNFINISHED)

    def _log(self) -> FastLog:
        self.record_unfinished()
        specs, self.traffic.specs = self.traffic.specs, []   # the run is over: the specs can go with this call
        return fast_log(self.columns, self.steps, specs, self.events)


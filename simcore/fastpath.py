"""The fast path: `simcore.engine`'s semantics for one replica without SimPy, for any policy.

The same request records, the same decisions (the policy's own `schedule`, or its `schedule_decodes`
shortcut in the common case), the same KV accounting, the same float operations for every time and the same
event order (SimPy's: time, then creation order), so every table equals the SimPy engine's, bitwise
(tests/test_fastpath.py). Why it is fast: no Python work per running request per step while they all
decode. Decoding requests are "lazy" (simcore/lazy.py: progress = base + D, the number of decode steps); a quiet
stretch of decode-only steps is priced in bulk (simcore/stretch.py) and logged as arrays; per-request
work happens at events only. Per-token gaps are logged as weighted samples (gap, count).
Preemption, admission and KV allocation (swap and prefix caching included) are simcore/apply.py's, shared
with the SimPy engine. Several replicas behind a router (simcore/fastcluster.py) and a disaggregated
deployment (simcore/fastdisagg.py) run fast engines as replicas, one event loop for all. Not modelled
(experiments/fast.py falls back to the SimPy engine): pipeline parallelism, real-hardware executors.
"""
from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np

from simcore.apply import ReplicaMechanics
from simcore.fasttraffic import FastTraffic
from simcore.batch import QUIET, Batch, DecodeShortcut, split_shape
from simcore.engine import EngineLimits, SimulationError
from simcore.kvcache import BlockPool, HostSwapSpace, PrefixCachingBlockPool
from simcore.lazy import BY_ORDER, FastRequest, LazyDecoders
from simcore.mechanics import reject_reason
from simcore.log import RequestEvent
from simcore.request import RequestSpec, RequestSpecs, Status
from simcore.stretch import NUM_INT_COLUMNS, QuietStretches
from simcore.view import EngineView

INF = float("inf")
WAIT_ENDS = ("timed", "woken")   # a timed wait's timeout fired, or its wake event was processed
RUNNING = Status.RUNNING


@dataclass
class FastLog:
    """What a fast run produced, as columns (experiments/fast.py turns them into the usual tables)."""
    request_id: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    admitted_s: np.ndarray         # float64, NaN where absent
    first_token_s: np.ndarray
    finish_s: np.ndarray
    num_preemptions: np.ndarray    # int32
    status: np.ndarray             # int8 codes: STATUS_NAMES
    reject_reason: dict            # spec index -> reason, for the rejected requests only
    iteration_floats: np.ndarray   # (num_iterations, 2): start_s, duration_s (rows not handed to a sink)
    iteration_ints: np.ndarray     # (num_iterations, 8) int32, ITERATION_COLUMNS order without replica_id
    itl_values_s: np.ndarray       # weighted ITL samples: gap, and how many sequences had it (empty when
                                   # they went to an `itl_sink` as the run went)
    itl_counts: np.ndarray
    itl_end_s: np.ndarray          # when each sample's gaps ended (nondecreasing)
    num_unfinished: int
    priority: np.ndarray | None = None   # the workload's priority class per request
    replica_id: np.ndarray | None = None              # a cluster's (simcore/fastcluster.py): where each ran
    iteration_replica_id: np.ndarray | None = None
    events: list | None = None     # RequestEvent list, with `record_events` only


# Per-request status codes in FastLog.status (one byte a request instead of a string reference).
STATUS_NAMES = ("unfinished", "finished", "rejected")
UNFINISHED, FINISHED, REJECTED = range(3)
ITERATION_CHUNK_ROWS = 262_144   # rows handed to `iteration_sink` at a time (12 MiB; Parquet row groups this size)


class _Request(FastRequest):
    """A fast request that knows its place in the workload (`k`: the spec's index), where its row goes."""
    __slots__ = ("k",)


def padded_tokens(padded) -> int:
    """Tokens a padded shape computes; its rows are usually identical (static batching: up to 256 per step)."""
    first = padded[0]
    return first[0] * len(padded) if padded.count(first) == len(padded) else sum(n for n, _ in padded)


class _NoEvents:
    """By default the fast engine keeps no per-request event list (a million requests would not fit): its
    tables are built from the request records at the end."""
    events = None

    def event(self, now_s, req, kind) -> None:
        pass

    def preemption(self, req, now_s) -> None:
        pass


class _Events(_NoEvents):
    """With `record_events`: the SimPy log's request events (simcore/log.py `RequestEvent`: arrived, rejected,
    admitted, preempted, first_token, finished), in the same order, for timeline tests."""

    def __init__(self):
        self.events: list[RequestEvent] = []

    def event(self, now_s, req, kind) -> None:
        self.events.append(RequestEvent(now_s, req.request_id, kind))

    def preemption(self, req, now_s) -> None:
        self.events.append(RequestEvent(now_s, req.request_id, "preempted"))


class FastEngine(ReplicaMechanics, LazyDecoders, QuietStretches, FastTraffic):
    """Runs a whole workload: open loop (`specs` sorted by arrival) or closed loop (`closed = (concurrency,
    think_time_s)`, specs taken in order). Running requests that decode are lazy: they all take one token
    in every decode step, kept by finish step (a heap), by block phase (KV growth), by the time of their
    last token (ITL) and by their context sum (pricing). Before the policy's general `schedule` they are
    made explicit again (`materialize`), as that walks them one by one anyway."""

    def __init__(self, policy, cost_model, limits: EngineLimits, specs, closed: tuple[int, float] | None = None,
                 iteration_sink=None, itl_sink=None, traffic: FastTraffic | None = None,
                 record_events: bool = False):
        if limits.preemption_mode not in ("recompute", "swap"):
            raise ValueError("the fast path models recompute or swap preemption")
        self.policy, self.cost, self.limits = policy, cost_model, limits
        self.check_invariants = limits.check_invariants
        self.prefix_cache = None
        if limits.enable_prefix_caching:   # block identities: every step explicit (vLLM caches per step)
            if not getattr(policy, "supports_prefix_caching", False) or limits.preemption_mode != "recompute":
                raise ValueError("engine.enable_prefix_caching: needs a policy that supports it and recompute")
            self.prefix_cache = PrefixCachingBlockPool(limits.num_gpu_blocks, limits.block_size)
        self.pool = self.prefix_cache or BlockPool(limits.num_gpu_blocks, limits.block_size)
        self.swap_space = HostSwapSpace(limits.num_swap_blocks)
        self.log = _Events() if record_events else _NoEvents()
        self.events = self.log.events   # None unless recording
        self.shortcut = getattr(policy, "schedule_decodes", None)
        # Prefix caching: lazy decoders by block phase, in batch order, for the pool's per-step work
        # (a block allocated when a decode starts one, registered when it fills: simcore/lazy.py)
        self.members = [[] for _ in range(limits.block_size)] if self.prefix_cache is not None else None
        self.holds_slots = bool(getattr(policy, "holds_slots_until_drained", False))
        self.vectorised = hasattr(cost_model, "decode_steps_time_s")
        self.by_sums = hasattr(cost_model, "step_time_sums_s")
        self.bs, self.total, self.max_model_len = limits.block_size, self.pool.num_blocks, limits.max_model_len
        self.block_size = self.bs
        self.specs = specs if isinstance(specs, RequestSpecs) else list(specs)   # compact columns stay so
        self._init_request_columns()
        self.requests: dict[int, FastRequest] = {}   # live requests only: released when they finish
        self.num_admissions = 0
        self.waiting: deque[FastRequest] = deque()
        self.running: list[FastRequest] = []
        self.draining: list[FastRequest] = []
        self.pref: set[FastRequest] = set()   # running requests still prefilling (never lazy)
        self.policy_state = None
        self.lazy_view = EngineView(0.0, (), (), 0, self.total, self.bs, self.max_model_len, self.draining,
                                    lazy=self)
        # lazy decoders
        self.D, self.t_last_d = 0, 0.0
        self.heap: list = []            # (D at which it finishes, admission order, request)
        self.phase = [0] * self.bs      # growing lazy decoders by base_comp % block_size
        self.base_sum = 0
        self.num_lazy = 0
        self.groups: dict = {}          # lazy decoders by the time of their last token
        self.explicit_mode = False      # lazy decoders were made explicit for this step
        self.closed = closed
        # Arrivals and closed-loop users: this engine's own, or a cluster's (simcore/fastcluster.py), which
        # then holds the event counter between events and lends it to the replica whose event it processes.
        self.traffic = traffic if traffic is not None else self
        self.holder = self
        self.one_step = traffic is not None   # in a cluster, every step is an event of its own (see _stretch)
        self.quiet_step = False   # one_step: the step in flight is quiet and nothing has reached us since
        # Called with (request, now) when a request finishes or is rejected: closed-loop users, or a
        # disaggregated deployment's decode-side hook (simcore/fastdisagg.py).
        self.on_done = self.traffic._on_done if closed else None
        # Disaggregation (simcore/fastdisagg.py): a prefill replica hands each request off after its first
        # token (`sending`: KV held until `release`); a decode replica receives prefilled requests.
        self.handoff = limits.handoff_after_first_token
        self.on_handoff = None            # called with (request, now) for each request handed off
        self.sending: list[FastRequest] = []
        self.receiving: list[FastRequest] = []
        self.joining: list[FastRequest] = []   # received decodes, lazy from the next decision on
        self.swap_woken = None            # (time, seq) of a wake while sleeping through a swap-out
        self.seq = 0                    # creation order of events, SimPy's tie-break at equal times
        self.rec_f, self.rec_i = array("d"), array("i")   # counts fit in int32: half the memory
        self.itl_v, self.itl_c, self.itl_e = array("d"), array("q"), array("d")   # gap, count, when it ended
        self.num_logged = 0
        # Called with (floats, ints) every ITERATION_CHUNK_ROWS iteration rows (experiments/fast.py streams
        # them to a file), so a long run does not hold them all; None keeps them for FastLog.
        self.iteration_sink = iteration_sink
        # With an iteration sink: called with (gap values, counts) at the same times, so the ITL samples do
        # not pile up either (their end times are then dropped); FastLog's ITL arrays are then empty.
        self.itl_sink = itl_sink if iteration_sink is not None else None
        self.pricers: dict = {}          # decode-step pricing functions by batch size

    @property
    def prefix_caches(self) -> list:
        """The prefix-caching pool, as a one-item list (empty without prefix caching); as FastCluster's."""
        return [self.prefix_cache] if self.prefix_cache is not None else []

    # ---- per-request rows: compact columns, written when a request leaves (its record is then released) ----
    def _init_request_columns(self) -> None:
        specs, n = self.specs, len(self.specs)
        if isinstance(specs, RequestSpecs):   # ids 0..n-1: unique by construction
            self.request_ids = specs.column("request_id")
            self.col_arrival = specs.column("arrival_s").copy()   # closed loop: send time
        else:
            self.request_ids = np.fromiter((s.request_id for s in specs), np.int64, n)
            if len(np.unique(self.request_ids)) < n:   # checked up front: finished requests are not kept
                ids, counts = np.unique(self.request_ids, return_counts=True)
                raise SimulationError(f"duplicate request id {int(ids[counts > 1][0])}")
            self.col_arrival = np.fromiter((s.arrival_s for s in specs), float, n)   # closed loop: send time
        self.col_admitted, self.col_first, self.col_finish = (np.full(n, np.nan) for _ in range(3))
        self.col_preemptions = np.zeros(n, dtype=np.int32)
        self.col_status = np.zeros(n, dtype=np.int8)   # UNFINISHED until it leaves
        self.reject_reasons: dict[int, str] = {}

    def _record(self, req, status: int) -> None:
        k = req.k
        if req.admitted_s is not None:
            self.col_admitted[k] = req.admitted_s
        if req.first_token_s is not None:
            self.col_first[k] = req.first_token_s
        if req.finish_s is not None:
            self.col_finish[k] = req.finish_s
        self.col_preemptions[k] = req.num_preemptions
        self.col_status[k] = status

    # ---- requests arriving and leaving ----
    def _submit(self, k: int, spec: RequestSpec, now: float) -> None:
        req = _Request(spec)
        req.k = k
        self.quiet_step = False
        self.col_arrival[k] = spec.arrival_s
        if self.events is not None:
            self.log.event(now, req, "arrived")
        reason = reject_reason(spec, self.policy, self.max_model_len, self.total, self.bs)
        if reason:
            req.status, req.reject_reason, req.finish_s = Status.REJECTED, reason, now
            if self.events is not None:
                self.log.event(now, req, "rejected")
            self.reject_reasons[k] = reason
            self._record(req, REJECTED)
            self.num_logged += 1
            if self.on_done is not None:
                self.on_done(req, now)
            return
        self.requests[spec.request_id] = req
        self.waiting.append(req)
        self._wake_up(now)

    def _wake_up(self, now: float) -> None:
        """simcore.engine.Engine._wake_up: the waiting engine's `_wake` event succeeds now."""
        kind = self.eng_kind
        if kind is None or kind == "timed":  # wake the idle engine (its `_wake` event succeeds now)
            # A plain wait resumes on the wake event; a timed wait (`wake | timeout`) one event later, when
            # the condition it waits on fires (SimPy's AnyOf schedules itself when the wake is processed).
            self.eng_kind, self.eng_t, self.eng_e = ("resume" if kind is None else "woken"), now, self.seq
            self.seq += 1
        elif kind == "swapwait" and self.swap_woken is None:   # asleep, then waiting on this wake event
            self.swap_woken = (now, self.seq)
            self.seq += 1

    # ---- the event loop ----
    def simulate(self) -> FastLog:
        self.eng_kind, self.eng_t, self.eng_e = "resume", 0.0, -2   # the engine process starts first
        self._start_traffic()
        first_arrival = True
        timers = self.timers
        while True:   # the earliest of the engine's event, the next arrival and the first timer: (time, seq)
            t, e, kind = self.eng_t, self.eng_e, self.eng_kind
            if kind is None:
                t = INF
            at = self.arr_t
            if at < t or (at == t and self.arr_e < e):
                t, e, kind = at, self.arr_e, "arrival"
            if timers:
                tt, te, _ = timers[0]
                if tt < t or (tt == t and te < e):
                    t, e, kind = tt, te, "timer"
            if t == INF:
                break
            if kind == "arrival":
                self._arrivals(t, first_arrival)
                first_arrival = False
            elif kind == "timer":
                self._send(heapq.heappop(timers)[2], t)
            elif kind in WAIT_ENDS:   # the engine resumes one event later (simcore/fasttraffic.py)
                self.eng_kind, self.eng_e = "resume", self.seq
                self.seq += 1
            else:
                self.deferring = True
                if kind == "complete":
                    self._complete(t)
                self._next(t)
                if self.deferred:
                    self._flush_timers(t)
                self.deferring = False
                if self.iteration_sink is not None and len(self.rec_f) >= 2 * ITERATION_CHUNK_ROWS:
                    self._flush_iterations()
        return self._log()

    # ---- one engine decision ----
    def _view(self, now: float) -> EngineView:
        """The view for the policy's general `schedule` (every running request explicit)."""
        return EngineView(now, self.waiting, self.running, self.total - self.pool.num_used_blocks, self.total,
                          self.bs, self.max_model_len, self.draining, self.policy_state, self.prefix_cache)

    def decide(self, now: float) -> Batch | DecodeShortcut:
        """The policy's decision now: its `schedule_decodes` shortcut when it offers one and every running
        request decodes (lazy decoders stay lazy), else its `schedule` over explicit records."""
        if (self.shortcut is not None and not self.pref and not self.explicit_mode and self.running
                and (self.members is None or not self.waiting)):   # prefix hits: admission stays general
            view = self.lazy_view   # asked very often: one object (lazy=self), brought up to date
            view.now_s, view.waiting, view.running, view.draining = now, self.waiting, self.running, self.draining
            view.num_free_blocks, view.policy_state = self.total - self.pool.num_used_blocks, self.policy_state
            shortcut = self.shortcut(view)
            if shortcut is not None:
                return shortcut
        self.materialize()
        return self.policy.schedule(self._view(now))

    def _next(self, now: float) -> None:
        if self.quiet_step:
            self.quiet_step = False
            if self._continue_quiet(now):
                return
        if self.joining:
            self._join_decoders()
        while self.waiting or self.running:
            batch = self.decide(now)
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
                    self.eng_kind, self.eng_t, self.eng_e = "resume", now + swap_out_s, self.seq
                    self.seq += 1
                    return
                continue
            if batch.wake_at_s is None or batch.wake_at_s <= now:
                raise SimulationError(f"{self.policy.name} scheduled nothing at t={now:.6f}s with "
                                      f"{len(self.waiting)} waiting, {len(self.running)} running, "
                                      f"{self.pool.num_free_blocks}/{self.total} blocks free")
            self.eng_kind, self.eng_t, self.eng_e = "timed", now + (batch.wake_at_s - now), self.seq
            self.seq += 1
            return
        self.eng_kind = None

    def _preempt(self, victims, now_s: float) -> float:
        """simcore.apply's preemption; the victims also leave `pref` (back in the queue, never lazy)."""
        transfer_s = super()._preempt(victims, now_s)
        self.pref.difference_update(self.requests[rid] for rid in victims)
        return transfer_s

    def _wait_for_transfers(self, preempt, now: float) -> None:
        """simcore.engine.Engine's wait while KV transfers hold blocks (disaggregation): apply the policy's
        preemptions, sleep through any swap-out, then wait for a transfer to end (`_wake_up`)."""
        swap_out_s = self._preempt(preempt, now) if preempt else 0.0
        if swap_out_s:
            self.eng_kind, self.eng_t, self.eng_e = "swapwait", now + swap_out_s, self.seq
            self.seq += 1
            self.swap_woken = None
        else:
            self.eng_kind = None

    def swap_wait_over(self, now: float) -> bool:
        """The swap-out sleep of `_wait_for_transfers` ended: True when the engine goes on at once (its wake
        event was processed during the sleep), else it waits for the wake (pending, or still to come)."""
        woken, self.swap_woken = self.swap_woken, None
        if woken is None:
            self.eng_kind = None
            return False
        if woken < (now, self.eng_e):
            return True
        self.eng_kind, (self.eng_t, self.eng_e) = "resume", woken
        return False

    # ---- disaggregation: hand-off and reception of prefilled requests (simcore/fastdisagg.py) ----
    def received(self, req: FastRequest, now: float) -> None:
        """The KV of `req` (see `receive`) has arrived: it runs from the next step on."""
        self.receiving.remove(req)
        req.status = RUNNING
        self.running.append(req)
        self.quiet_step = False
        req.order = self.num_admissions   # its place in `running` (finish order within a step)
        self.num_admissions += 1
        if not req.num_generated_tokens:   # its first token still to sample here: a one-token prefill step
            self.pref.add(req)
        elif self.shortcut is not None:    # a decode: it joins the lazy decoders at the next decision
            self.joining.append(req)
        self._wake_up(now)

    def _join_decoders(self) -> None:
        """Received decodes become lazy decoders before the next decision (not mid-step: the step in flight
        is not theirs). After a general step `_complete` has made every running decode lazy already."""
        if not self.explicit_mode:
            for req in self.joining:
                if not req.lazy:
                    self._lazify(req)
        self.joining.clear()

    def release(self, req: FastRequest, now: float) -> None:
        """The KV of a handed-off request has been copied out: free its blocks here."""
        self.sending.remove(req)
        self.pool.free(req)
        req.status = Status.FINISHED
        del self.requests[req.request_id]
        self._wake_up(now)

    def _start_shortcut(self, shortcut, now: float) -> None:
        if shortcut.decode_running and not shortcut.admitted:   # quiet
            if not self.running:
                raise SimulationError(f"{self.policy.name} scheduled nothing at t={now:.6f}s with "
                                      f"{len(self.waiting)} waiting, {self.pool.num_free_blocks}/{self.total} "
                                      "blocks free")
            self._stretch(now, shortcut.padded_shape)
            return
        num_lazy = self.num_lazy if shortcut.decode_running else 0
        if num_lazy:
            growth = self.decode_growth()
            if growth > self.pool.num_free_blocks:
                raise SimulationError(f"KV pool over capacity: decodes need {growth} blocks")
            self.pool.num_used_blocks += growth
        self._start(shortcut.admitted, num_lazy, (), (), shortcut.padded_shape, now)

    def _start(self, scheduled, num_lazy: int, preempt, preempt_at, padded, now: float) -> None:
        """Apply a decision (simcore/apply.py: preempt, admit, allocate), price it, put its step in flight."""
        transfer_s = self._preempt(preempt, now) if preempt and not preempt_at else 0.0
        swap_s, admitted = self._admit_and_allocate(scheduled, preempt, preempt_at, now)
        if admitted:
            k = self.num_admissions
            for req in admitted:
                req.order = k
                k += 1
            self.num_admissions = k
            self.pref.update(admitted)
        if len(admitted) == len(scheduled):   # every one admitted, in batch order: no lookups by id
            explicit = [(req, s.num_new_tokens, s.num_reserved_tokens) for req, s in zip(admitted, scheduled)]
        else:
            requests = self.requests
            explicit = [(requests[s.request_id], s.num_new_tokens, s.num_reserved_tokens) for s in scheduled]
        duration_s = self._price(explicit, num_lazy, padded)
        if transfer_s or swap_s:
            duration_s += transfer_s + swap_s
        self.inflight = (explicit, num_lazy, len(preempt), padded, now, duration_s)
        self.eng_kind, self.eng_t, self.eng_e = "complete", now + duration_s, self.seq
        self.seq += 1

    def _price(self, explicit: list, num_lazy: int, padded) -> float:
        if padded is not None:
            prefill, decode = split_shape(padded)
            return self.cost.step_time_s(prefill=prefill, decode=decode, num_logits=len(padded))
        prefill, decode, num_logits = [], [], num_lazy
        for req, n, _ in explicit:   # split_shape and mechanics.samples, inlined (the hot loop)
            c = req.num_computed_tokens
            if n > 1 or c == 0:
                prefill.append((n, c))
            else:
                decode.append(c + 1)
            if c + n >= req.spec.num_prompt_tokens + req.num_generated_tokens:   # req.num_tokens
                num_logits += 1
        if not num_lazy:
            return self.cost.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits)
        D = self.D
        if self.by_sums:   # lazy decoders come first in the batch; the roofline needs only their sum
            lazy_sum = self.base_sum + num_lazy * (D + 1)
            return self.cost.step_time_sums_s(prefill, num_lazy + len(decode), lazy_sum + sum(decode), num_logits)
        lazy_ctx = [r.base_comp + D + 1 for r in self.running if r.lazy]
        return self.cost.step_time_s(prefill=prefill, decode=lazy_ctx + decode, num_logits=num_logits)

    # ---- completing a step ----
    def _complete(self, now: float) -> None:
        explicit, num_lazy, num_preempted, padded, start_s, duration_s = self.inflight
        done = self._lazy_step_done(now) if num_lazy else []
        num_prefill, num_decode = 0, num_lazy
        gaps, new_decoders, pref = {}, [], self.pref
        for req, n, _ in explicit:
            c, g = req.num_computed_tokens, req.num_generated_tokens
            total = req.spec.num_prompt_tokens + g
            if total - c == 1 and g > 0:   # mechanics.is_decode, inlined (the hot loop)
                num_decode += 1
            else:
                num_prefill += n
            c += n
            req.num_computed_tokens = c
            if c == total:   # caught up: sample one token
                req.num_generated_tokens = g + 1
                if req.first_token_s is None:
                    req.first_token_s = now
                    if self.events is not None:
                        self.log.event(now, req, "first_token")
                else:
                    lt = req.last_token_s
                    gaps[lt] = gaps.get(lt, 0) + 1
                req.last_token_s = now
                pref.discard(req)
                if g + 1 == req.spec.num_output_tokens:
                    done.append(req)
                else:
                    new_decoders.append(req)
        for lt, count in gaps.items():
            self.itl_v.append(now - lt)
            self.itl_c.append(count)
            self.itl_e.append(now)
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
        if self.check_invariants and (self.explicit_mode or self.shortcut is None
                                      or not 0 <= self.pool.num_used_blocks <= self.total):
            self._check_invariants()
        if self.shortcut is not None:   # a policy without the shortcut never reads lazy decoders
            if self.explicit_mode:
                self.explicit_mode = False
                for req in self.running:
                    if req not in pref:
                        self._lazify(req)
            else:
                for req in new_decoders:
                    self._lazify(req)
        num_padding = padded_tokens(padded) - (num_prefill + num_decode) if padded else 0
        self.rec_f.fromlist([start_s, duration_s])   # (twice as fast as extend with a tuple)
        self.rec_i.fromlist([num_prefill, num_decode, num_padding, num_lazy + len(explicit), num_preempted,
                             len(self.waiting), len(self.running) + len(self.draining), self.pool.num_used_blocks])
        if self.on_done is not None:
            on_done = self.on_done
            for req in done:
                on_done(req, now)
        if handed_off:
            for req in handed_off:
                self.on_handoff(req, now)

    def _finish(self, done: list, now: float) -> None:
        if len(done) == 1:
            self.running.remove(done[0])
        else:
            gone = set(done)
            self.running = [r for r in self.running if r not in gone]
        requests, record = self.requests, self._record
        self.num_logged += len(done)
        for req in done:
            req.finish_s = now
            record(req, FINISHED)   # its row is final: nothing below changes it
            del requests[req.request_id]
        if self.events is not None:
            for req in done:
                self.log.event(now, req, "finished")
        if self.holds_slots:
            for req in done:
                req.status = Status.DRAINING
            self.draining.extend(done)
        else:
            free = self.pool.free
            for req in done:
                req.status = Status.FINISHED
                free(req)
        if self.draining and not self.running:
            for req in self.draining:
                self.pool.free(req)
                req.status = Status.FINISHED
            self.draining.clear()

    def _check_invariants(self) -> None:
        """The SimPy engine's per-iteration checks, as far as they are cheap here: the pool within capacity
        always; with every running request explicit (after a general step), the blocks they hold."""
        pool = self.pool
        if not 0 <= pool.num_used_blocks <= pool.num_blocks:
            raise SimulationError(f"KV accounting broken: pool says {pool.num_used_blocks} used of {pool.num_blocks}")
        if not 0 <= self.swap_space.num_used_blocks <= self.swap_space.num_blocks:
            raise SimulationError(f"host swap accounting broken: {self.swap_space.num_used_blocks} blocks used")
        if self.explicit_mode or self.shortcut is None:
            held = sum(r.num_blocks for group in (self.running, self.draining, self.sending, self.receiving)
                       for r in group)
            expected = pool.num_block_refs if self.prefix_cache is not None else pool.num_used_blocks
            if held != expected:
                raise SimulationError(f"KV accounting broken: pool says {pool.num_used_blocks} used of "
                                      f"{pool.num_blocks}, requests hold {held}")

    # ---- results ----
    def _flush_iterations(self) -> None:
        """Hand the iteration rows (and, with an ITL sink, the ITL samples) logged so far over; start afresh."""
        floats = np.frombuffer(self.rec_f, dtype=float).reshape(-1, 2).copy()
        ints = np.frombuffer(self.rec_i, dtype=np.int32).reshape(-1, NUM_INT_COLUMNS).copy()
        self.rec_f, self.rec_i = array("d"), array("i")
        self.iteration_sink(floats, ints)
        if self.itl_sink is not None:
            values, counts = np.frombuffer(self.itl_v, dtype=float), np.frombuffer(self.itl_c, dtype=np.int64)
            self.itl_v, self.itl_c, self.itl_e = array("d"), array("q"), array("d")
            self.itl_sink(values, counts)

    def _log(self) -> FastLog:
        for req in self.requests.values():   # never finished (the caller reports them)
            self._record(req, UNFINISHED)
        if self.iteration_sink is not None and (len(self.rec_f) or len(self.itl_v)):
            self._flush_iterations()
        specs, n = self.specs, len(self.specs)
        self.specs = []   # the run is over: the specs can go with this call
        if isinstance(specs, RequestSpecs):
            prompt, output, priority = (specs.column(c).astype(np.int64)
                                        for c in ("num_prompt_tokens", "num_output_tokens", "priority"))
        else:
            prompt, output, priority = (np.fromiter((getattr(s, c) for s in specs), np.int64, n)
                                        for c in ("num_prompt_tokens", "num_output_tokens", "priority"))
        del specs
        return FastLog(
            self.request_ids, self.col_arrival, prompt, output,
            self.col_admitted, self.col_first, self.col_finish, self.col_preemptions, self.col_status,
            self.reject_reasons,
            np.frombuffer(self.rec_f, dtype=float).reshape(-1, 2),
            np.frombuffer(self.rec_i, dtype=np.int32).reshape(-1, NUM_INT_COLUMNS),
            np.frombuffer(self.itl_v, dtype=float), np.frombuffer(self.itl_c, dtype=np.int64),
            np.frombuffer(self.itl_e, dtype=float), n - self.num_logged, priority, events=self.events)

"""One engine replica as one SimPy process: schedule -> price -> advance time -> apply, once per iteration.

Requests are passive data; there is one simulation event per iteration, never one per token. The engine
owns KV allocation, freeing and preemption; the policy only decides. Tokens appear at iteration end.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

import simpy

from simcore.async_scheduling import ArrivalsInStep
from simcore.batch import Batch, split_shape
from simcore.costmodel import CostModel
from simcore.gateway import Deadlines, refusal, watch
from simcore.log import EngineLog, IterationRecord
from simcore.decisions import DecisionApplier
from simcore.errors import SimulationError, scheduled_nothing
from simcore.limits import EngineLimits, engine_settings_error
from simcore.rules import is_decode, reject_reason, samples, take_sample
from simcore import speculative
from simcore.request import Request, RequestSpec, Status
from simcore.view import EngineView, Policy


class Engine(DecisionApplier):
    def __init__(self, env: simpy.Environment, policy: Policy, cost_model: CostModel, limits: EngineLimits,
                 log: EngineLog | None = None, on_done: Callable[[Request], None] | None = None,
                 replica_id: int = 0, executor=None, on_handoff: Callable[[Request], None] | None = None,
                 on_step: Callable[["Engine", Batch], None] | None = None):
        error = engine_settings_error(policy, limits.preemption_mode, limits.enable_prefix_caching, limits.kv_groups)
        if error:
            raise ValueError(error)
        self.env, self.policy, self.cost_model, self.limits = env, policy, cost_model, limits
        self.replica_id = replica_id
        self.holds_slots = bool(getattr(policy, "holds_slots_until_drained", False))
        # Prefix caching: a pool with block identities; off, the plain counting pool (fast path).
        self._make_pools(limits)
        self.loading: list[Request] = []    # their requests: blocks held, load in flight (simcore/kvoffload.py)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.draining: list[Request] = []
        self.sending: list[Request] = []    # handed off after the first token; KV held until release()
        self.receiving: list[Request] = []  # prefilled elsewhere; KV allocated here, transfer in flight
        self.on_handoff = on_handoff        # called when a request is handed off (handoff_after_first_token)
        self.requests: dict[int, Request] = {}
        self.log = log if log is not None else EngineLog()
        self.on_done = on_done  # called when a request finishes or is rejected (closed-loop users)
        self.on_step = on_step  # called after each applied iteration (fidelity.vllm_scheduler records)
        # Real-execution seam (fidelity.torch_backend.RealBackend): when set, each batch is run on real
        # hardware by `executor.execute(engine, batch, shape, cost_args)`, which returns its measured
        # seconds; the cost model is then not consulted. Everything else (policy, KV pool) is unchanged.
        self.executor = executor
        self._wake: simpy.Event | None = None
        self.policy_state: object = None  # carried from one Batch to the next view, never read here
        self.in_step = False
        self.lockstep = None   # the DP group whose ranks step together (simcore/dp_lockstep.py), if any
        # a cost model's price of a rank's step in its DP group's round (the experts over the group's tokens)
        self._in_dp_group = getattr(cost_model, "step_time_in_dp_group_s", None)
        # async scheduling: arrivals during a step join the queue after the next decision (simcore/async_scheduling.py)
        self.late = ArrivalsInStep() if limits.async_scheduling else None
        self.deadlines = None   # admission control (simcore/gateway.py): queue and client deadlines
        self.abandoning: list[Request] = []   # abandoned while their step runs; they leave when it ends
        if limits.gateway is not None and limits.gateway.has_deadlines:
            self.deadlines, self.deadline_wake = Deadlines(limits.gateway), None
            env.process(watch(self))
        self._set_up_speculation(limits, policy)   # speculative decoding (simcore/speculative.py)
        self.process = env.process(self._loop())

    # ---- arrivals ----
    def submit(self, spec: RequestSpec) -> None:
        req = Request(spec)
        if spec.request_id in self.requests:
            raise SimulationError(f"duplicate request id {spec.request_id}")
        self.requests[spec.request_id] = req
        self.log.arrival(spec, self.replica_id, self.env.now)
        reason = self._reject_reason(spec)
        if reason is None and self.limits.gateway is not None:
            reason = refusal(self.limits.gateway, len(self.waiting), len(self.waiting) + len(self.running))
        if reason:
            req.status, req.reject_reason, req.finish_s = Status.REJECTED, reason, self.env.now
            self.log.done(req, self.replica_id)
            if self.on_done:
                self.on_done(req)
            return
        if self.late is not None and self.in_step:
            self.late.hold(req)
        else:
            self.waiting.append(req)
        if self.deadlines is not None:
            self.deadlines.add(req, self.env.now)
            if self.deadline_wake is not None and not self.deadline_wake.triggered:
                self.deadline_wake.succeed()
        self._wake_up()

    def end_at_gateway(self, req: Request, reason: str) -> None:
        """A gateway deadline passed (simcore/gateway.py): `req` leaves with `reason` now, or, running in
        the step in flight, when that step ends."""
        if req.status is Status.RUNNING and self.in_step:
            req.reject_reason = reason
            self.abandoning.append(req)
            return
        self._remove_ended(req)
        req.status, req.reject_reason, req.finish_s = Status.REJECTED, reason, self.env.now
        self.log.done(req, self.replica_id)
        if self.on_done:
            self.on_done(req)

    # ---- disaggregation: a request prefilled on another engine (simcore/disagg.py) ----
    def received(self, req: Request) -> None:
        """The KV of `req` has arrived: it runs from the next iteration on (policies see a running request
        with one token to compute, a decode)."""
        self.receiving.remove(req)
        req.status = Status.RUNNING
        self.running.append(req)
        self._wake_up()

    def release(self, req: Request) -> None:
        """The KV of a handed-off request has been copied out: free its blocks here."""
        self.sending.remove(req)
        self.pool.free(req)
        req.status = Status.FINISHED
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _reject_reason(self, spec: RequestSpec) -> str | None:
        return reject_reason(spec, self.policy, self.limits.max_model_len, self.pool.num_blocks, self.limits.block_size,
                             self.limits.kv_groups, self.speculation)

    # ---- the loop ----
    def view(self) -> EngineView:
        return EngineView(self.env.now, self.waiting, self.running, self.pool.num_free_blocks,
                          self.pool.num_blocks, self.limits.block_size, self.limits.max_model_len,
                          self.draining, self.policy_state, self.prefix_cache, hybrid_kv=self.hybrid_kv,
                          **self.spec_view_args)

    def _loop(self):
        env = self.env
        while True:
            if self.host_loads is not None:
                self.host_loads.before_decision(self, env.now)
            if not (self.waiting or self.running):
                if self.late is not None and self.late.release_into(self.waiting):
                    continue   # nothing else to run: scheduled at once
                self._wake = env.event()
                if self.loading:   # idle but for host loads: until the first ends (or an arrival)
                    yield self._wake | env.timeout(self.host_loads.next_done_s - env.now)
                else:
                    yield self._wake
                continue
            batch = self.policy.schedule(self.view())
            if self.late is not None:
                self.late.release_into(self.waiting)
            self.policy_state = batch.policy_state
            if not batch.scheduled:
                if (self.sending or self.receiving) and batch.wake_at_s is None:
                    # Blocks held by KV transfers (disaggregation): a policy may have had to preempt even
                    # the request it was placing; apply that, then wait for a transfer to end.
                    self._wake = env.event()  # before any swap-out time, so that no release is missed
                    swap_out_s = self._preempt(batch.preempt, env.now)
                    if swap_out_s:
                        yield env.timeout(swap_out_s)
                    yield self._wake
                    continue
                if batch.preempt:
                    # vLLM's empty step: with priority scheduling a request that cannot grow may preempt
                    # itself first, ending the step with nothing scheduled; no forward pass runs.
                    swap_out_s = self._preempt(batch.preempt, env.now)
                    if swap_out_s:
                        yield env.timeout(swap_out_s)
                    if self.on_step is not None:
                        self.on_step(self, batch)
                    continue
                wake_at_s = self._wake_at_s(batch.wake_at_s)
                if wake_at_s is None or wake_at_s <= env.now:
                    if self._release_loaded():
                        continue
                    raise scheduled_nothing(self.policy.name, env.now, len(self.waiting), len(self.running),
                                            self.pool.num_free_blocks, self.pool.num_blocks)
                self._wake = env.event()
                yield self._wake | env.timeout(wake_at_s - env.now)
                continue
            start_s = env.now
            transfer_s = 0.0 if batch.preempt_at else self._preempt(batch.preempt, env.now)
            transfer_s += self._admit_and_allocate(batch.scheduled, batch.preempt, batch.preempt_at, env.now)[0]
            shape = batch.padded_shape
            if shape is None:
                shape = [(s.num_new_tokens, self.requests[s.request_id].num_computed_tokens)
                         for s in batch.scheduled]
            prefill, decode = split_shape(shape)
            cost_args = dict(prefill=prefill, decode=decode, num_logits=self._num_logits(batch, shape))
            group_price = None   # this rank's step in its DP group's round, where the round prices it
            if self.speculation is not None:   # verification rows score every draft; the proposer drafts
                cost_args["num_logits"] = speculative.num_logits(
                    [(self.requests[s.request_id], s.num_new_tokens) for s in batch.scheduled])
                duration_s = speculative.step_time_s(self.cost_model, self.speculation, **cost_args) + transfer_s
            elif self.executor is not None:  # real hardware: measured wall time of this very batch (see __init__)
                duration_s = self.executor.execute(self, batch, shape, cost_args) + transfer_s
            elif self.lockstep is not None and self._in_dp_group is not None:   # the round prices it
                in_group = self._in_dp_group
                group_price = lambda group: in_group(group, **cost_args) + transfer_s
                duration_s = 0.0
            else:
                duration_s = self.cost_model.step_time_s(**cost_args) + transfer_s
            self.in_step = True
            if self.lockstep is None:
                yield env.timeout(duration_s)
            else:   # the DP ranks of an MoE model: the step ends with the group's slowest (simcore/dp_lockstep.py)
                num_tokens = sum(n for n, _ in prefill) + len(decode)
                start_s, end_s = yield from self.lockstep.step(duration_s, num_tokens, group_price)
                duration_s = end_s - start_s
            self.in_step = False
            self._complete(batch, start_s, duration_s, shape)
            if self.limits.check_invariants:
                self._check_invariants()
            if self.on_step is not None:
                self.on_step(self, batch)

    def _num_logits(self, batch: Batch, shape) -> int:
        if batch.padded_shape is not None:
            return len(shape)  # padded rows sample too (HF generate keeps finished rows in the batch)
        reqs = self.requests
        return sum(1 for s in batch.scheduled if samples(reqs[s.request_id], s.num_new_tokens))

    def _complete(self, batch: Batch, start_s: float, duration_s: float, shape) -> None:
        now = self.env.now
        log = self.log
        num_prefill = num_decode = 0
        done = []
        handed_off = []
        handoff = self.limits.handoff_after_first_token
        for s in batch.scheduled:
            req = self.requests[s.request_id]
            if is_decode(req):   # (a verification computes 1 + its drafts)
                num_decode += 1 if self.speculation is None else s.num_new_tokens
            else:
                num_prefill += s.num_new_tokens
            if self.speculation is not None:   # verify drafts: the accepted ones and the bonus, in one chunk
                emitted = speculative.verified(req, s.num_new_tokens, self.draws, self.spec_counters)
                if emitted and self._rewind_drafts:
                    speculative.rewind(self.pool, req, self.speculation)
                if emitted and req.reject_reason is None:
                    if take_sample(req, now, log, emitted):
                        done.append(req)
                        self.draws.forget(req.request_id)
                    else:
                        req.num_spec_tokens = self.speculation.num_speculative_tokens   # the drafter's next
                continue
            req.num_computed_tokens += s.num_new_tokens
            if req.num_computed_tokens == req.num_tokens and req.reject_reason is None:  # caught up: sample
                if take_sample(req, now, log):
                    done.append(req)
                elif handoff:
                    handed_off.append(req)
        for req in handed_off:
            self.running.remove(req)
            req.status = Status.SENDING
            self.sending.append(req)
        for req in done:
            self.running.remove(req)
            req.finish_s = now
            log.done(req, self.replica_id)
        self._release_finished(done)
        num_padding = sum(n for n, _ in shape) - (num_prefill + num_decode) if batch.padded_shape else 0
        for req in self.abandoning:   # their clients left during the step (simcore/gateway.py)
            reason, req.reject_reason = req.reject_reason, None
            self.end_at_gateway(req, reason)
        self.abandoning.clear()
        log.iteration(IterationRecord(
            start_s, duration_s, num_prefill, num_decode, num_padding, len(batch.scheduled), len(batch.preempt),
            len(self.waiting), len(self.running) + len(self.draining), self.pool.num_used_blocks, self.replica_id))
        for req in done:
            if self.on_done:
                self.on_done(req)
        for req in handed_off:
            self.on_handoff(req)

    def _check_invariants(self) -> None:
        pool = self.pool
        held = sum(r.num_blocks for group in (self.running, self.draining, self.sending, self.receiving,
                                              self.loading) for r in group) + self._num_waiting_blocks()
        expected = getattr(pool, "num_block_refs", pool.num_used_blocks)  # shared blocks, or SGLang's two pools
        if not 0 <= pool.num_used_blocks <= pool.num_blocks or held != expected:
            raise SimulationError(f"KV accounting broken: pool says {pool.num_used_blocks} used of "
                                  f"{pool.num_blocks}, requests hold {held}")
        for r in self.running:
            if r.status is not Status.RUNNING or pool.blocks_for(r.num_computed_tokens) > r.num_blocks:
                raise SimulationError(f"request {r.request_id} is {r.status.value} in running with "
                                      f"{r.num_computed_tokens} tokens computed in {r.num_blocks} blocks")
        if not 0 <= self.swap_space.num_used_blocks <= self.swap_space.num_blocks:
            raise SimulationError(f"host swap accounting broken: {self.swap_space.num_used_blocks} blocks used")

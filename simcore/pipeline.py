"""Pipeline parallelism as vLLM V1 runs it: the decoder layers split over `num_stages` GPUs (stages), and up
to `max_batches_in_flight` scheduled batches in the pipeline at once, so that stage i works on batch k+1
while stage i+1 works on batch k. With too few requests to fill the batches, stages sit idle: the bubble.

What vLLM does (0.32, vllm/v1/engine/core.py `step_with_batch_queue`; vllm/config/vllm.py
`max_concurrent_batches`; vllm/v1/core/sched/scheduler.py): with PP > 1 the engine core keeps a batch queue
of `pipeline_parallel_size` batches. It schedules a new batch whenever the queue has a free slot (filling
the queue comes before collecting outputs) and otherwise blocks on the oldest batch's output. The scheduler
advances `num_computed_tokens` when it schedules, so a request whose prompt has more chunks left can get its
next chunk in the very next batch, while one whose every token is in flight (a decode, a last chunk) gets
no tokens until its sampled token comes back (`num_new_tokens == 0`: "PP>1 and we have already scheduled all
prompt tokens but they are not finished yet", in `Scheduler.schedule`). Each batch passes the stages in order (point-to-point sends
of the hidden states); the last stage samples.

What is modelled here, the same way: the queue of batches in flight; the scheduler called when a slot frees
or a request arrives; requests with all their tokens in flight hidden from the policy (and counted against
its `max_num_seqs`, as vLLM's `running` list counts them); stages held in FIFO order, each batch priced per
stage by the cost model's `stage_times_s` (the stage's layers, the embedding on the first, LM head and
sampling on the last) plus one activation send per hop. KV blocks are allocated when a batch is scheduled
and freed when its output returns, by the engine as always; a request preempted while a chunk of it is in
flight has that chunk's output dropped. Since a batch's passage depends only on batches scheduled before it,
its start and end on every stage are fixed when it is scheduled: one simulation event per batch.

Ignored: vLLM 0.32's default on CUDA (the V2 model runner with async scheduling) holds one batch more
(`pipeline_parallel_size + 1`) and lets a decode be scheduled again `pipeline_parallel_size` steps later with
its token broadcast on the GPU; in steady state that is the same cadence as waiting for the output, and the
extra slot only hides the CPU's scheduling time, which `stage_times_s` already overlaps with the first stage.
The V1 model runner, which turns async scheduling off with PP, holds `pipeline_parallel_size`, as here.
The policy sees, and so can preempt, only requests not in flight; vLLM's may pick one in flight as its
victim (the tail of `running`) and drop its output. Not modelled: swap preemption, prefix caching, static
batching's drained slots, real execution, disaggregation.

Iteration table (simcore.log ITERATION_COLUMNS plus `PIPELINE_COLUMNS`, one row per batch when its output
returns): `start_s` is when the batch was scheduled and `duration_s` until its output came back (batches
overlap, so rows overlap in time); `pipeline_enter_s` is when its first stage started; `num_batches_in_flight`
counts the batches in the pipeline when it was scheduled, itself included; `bubble_s` is the stage-seconds
left idle while it was in the pipeline (from `pipeline_enter_s` to its end, over all stages; sends count as
idle): 0 when the pipeline is full, (num_stages - 1) x its own stage time for a batch alone in it.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import simpy

from simcore.batch import Batch, split_shape
from simcore.engine import Engine
from simcore.errors import SimulationError, scheduled_nothing
from simcore.limits import EngineLimits
from simcore.log import IterationRecord
from simcore.rules import take_sample
from simcore.request import Request, Status
from simcore.view import EngineView, Policy

PIPELINE_COLUMNS = ("pipeline_enter_s", "num_batches_in_flight", "bubble_s")


class StageCostModel(Protocol):
    """A cost model that prices one batch per pipeline stage: `(seconds on each stage, seconds of one
    stage-to-stage send)`, with the arguments of `CostModel.step_time_s`."""

    def stage_times_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                      num_logits: int | None = None) -> tuple[tuple[float, ...], float]: ...


class ConstantStageCost:
    """A stub for exact timeline tests: `per_stage_s` plus `per_token_s` per new token on every stage of
    every batch, `send_s` per hop; `step_time_s` is the whole batch back to back (stages plus sends)."""

    def __init__(self, num_stages: int, per_stage_s: float = 1.0, send_s: float = 0.0, per_token_s: float = 0.0):
        self.num_stages, self.per_stage_s, self.send_s, self.per_token_s = num_stages, per_stage_s, send_s, per_token_s

    def stage_times_s(self, prefill=(), decode=(), num_logits=None) -> tuple[tuple[float, ...], float]:
        tokens = sum(n for n, _ in prefill) + len(decode)
        return (self.per_stage_s + self.per_token_s * tokens,) * self.num_stages, self.send_s

    def step_time_s(self, prefill=(), decode=(), num_logits=None) -> float:
        stages, send_s = self.stage_times_s(prefill, decode, num_logits)
        return sum(stages) + (self.num_stages - 1) * send_s

    def describe(self) -> dict:
        return {"kind": "constant_stages", "num_stages": self.num_stages, "per_stage_s": self.per_stage_s,
                "per_token_s": self.per_token_s, "send_s": self.send_s}


@dataclass(eq=False)
class _InFlight:
    """One scheduled batch in the pipeline. `rows`: per scheduled request, (request, whether this batch
    samples its next token, its preemption count when scheduled: a later preemption makes the row stale)."""
    batch: Batch
    scheduled_s: float
    enter_s: float
    duration_s: float   # from scheduled to output, as an offset (one stage alone: its time, bitwise)
    num_in_flight: int
    num_prefill_tokens: int
    num_decode_tokens: int
    rows: list[tuple[Request, bool, int]] = field(default_factory=list)


def pipeline_error(num_stages: int, policy, cost_model, preemption_mode: str, enable_prefix_caching: bool,
                   disaggregated: bool) -> str | None:
    """Why the pipelined engine cannot run this layout (one line naming the key), or None. The one statement
    of these rules: `PipelinedEngine` refuses with it, and experiments.simulate before any point runs."""
    if getattr(policy, "holds_slots_until_drained", False):
        return f"pipeline_parallel_size: {num_stages} is not modelled with static batching ({policy.name})"
    if disaggregated:
        return f"pipeline_parallel_size: {num_stages} is not modelled with disaggregation"
    if preemption_mode != "recompute" or enable_prefix_caching:
        return (f"pipeline_parallel_size: {num_stages} is modelled with recompute preemption and no prefix "
                f"caching only")
    if not hasattr(cost_model, "stage_times_s"):
        return (f"pipeline_parallel_size: {num_stages} needs per-stage prices, which the "
                f"{cost_model.describe().get('kind', '?')} cost model does not give (use the roofline or aic "
                f"cost model)")
    return None


class PipelinedEngine(Engine):
    """`Engine` with `num_stages` pipeline stages and up to `max_batches_in_flight` batches in the pipeline
    (default `num_stages`, vLLM's batch queue). The cost model must have `stage_times_s`. Summary figures:
    `stage_busy_s` per stage and `active_s`, the time at least one batch was in the pipeline."""

    def __init__(self, env: simpy.Environment, policy: Policy, cost_model: StageCostModel, limits: EngineLimits,
                 log=None, on_done=None, replica_id: int = 0, *, num_stages: int,
                 max_batches_in_flight: int | None = None):
        error = pipeline_error(num_stages, policy, cost_model, limits.preemption_mode,
                               limits.enable_prefix_caching, limits.handoff_after_first_token)
        if error:
            raise SimulationError(error)
        if limits.kv_groups is not None:   # the stages' views would not see the hybrid pool's own block needs
            raise SimulationError("pipeline_parallel_size: vLLM's hybrid KV cache manager is not modelled with "
                                  "pipeline stages; set engine.disable_hybrid_kv_cache_manager: true")
        self.num_stages = num_stages
        self.max_batches_in_flight = max_batches_in_flight or num_stages
        self.in_flight: deque[_InFlight] = deque()
        self.pipeline_rows: list[tuple] = []   # PIPELINE_COLUMNS, one per iteration row this engine logs
        self.stage_busy_s = [0.0] * num_stages
        self.active_s = 0.0
        self._active_until_s = 0.0
        self._stage_free_s = [0.0] * num_stages
        self._stage_spans: list[deque[tuple[float, float]]] = [deque() for _ in range(num_stages)]
        self._policies: dict[int, Policy] = {}
        super().__init__(env, policy, cost_model, limits, log, on_done, replica_id)

    # ---- what the policy sees ----
    def view(self) -> EngineView:
        """Running requests with tokens left to schedule: those with every token in flight are hidden."""
        running = [r for r in self.running if r.num_uncomputed_tokens]
        return EngineView(self.env.now, self.waiting, running, self.pool.num_free_blocks, self.pool.num_blocks,
                          self.limits.block_size, self.limits.max_model_len, (), self.policy_state, None)

    def _schedule(self) -> Batch:
        """The policy's decision on the requests not in flight. vLLM counts every running request, in
        flight or not, against `max_num_seqs`: the policy gets that limit lowered by the hidden requests,
        and with no room left, no waiting request to admit."""
        policy, view = self.policy, self.view()
        num_hidden = len(self.running) - len(view.running)
        if num_hidden and hasattr(policy, "max_num_seqs"):
            room = policy.max_num_seqs - num_hidden
            if room < 1:
                view = dataclasses.replace(view, waiting=())
            else:
                policy = self._policies.get(room) or self._policies.setdefault(
                    room, dataclasses.replace(policy, max_num_seqs=room))
        return policy.schedule(view)

    # ---- the loop: fill the batch queue, else wait for an output or an arrival ----
    def _loop(self):
        env = self.env
        while True:
            schedulable = self.waiting or any(r.num_uncomputed_tokens for r in self.running)
            if len(self.in_flight) >= self.max_batches_in_flight or not schedulable:
                self._wake = env.event()   # woken by a returning batch (_finish) or an arrival (submit)
                yield self._wake
                continue
            batch = self._schedule()
            self.policy_state = batch.policy_state
            if batch.scheduled:
                self._launch(batch)
                continue
            if batch.preempt:   # vLLM's empty step: a request preempted itself; no forward pass
                self._preempt(batch.preempt, env.now)
                continue
            if not self.in_flight and (batch.wake_at_s is None or batch.wake_at_s <= env.now):
                raise scheduled_nothing(self.policy.name, env.now, len(self.waiting), len(self.running),
                                        self.pool.num_free_blocks, self.pool.num_blocks)
            self._wake = env.event()   # nothing fits now: wait for a batch to return its KV, or an arrival
            if batch.wake_at_s is not None and batch.wake_at_s > env.now:
                yield self._wake | env.timeout(batch.wake_at_s - env.now)
            else:
                yield self._wake

    def _launch(self, batch: Batch) -> None:
        """Apply the decision (preempt, admit, allocate), advance the scheduled tokens as computed (as vLLM's
        scheduler does) and place the batch on the stages."""
        env, reqs = self.env, self.requests
        self._preempt(batch.preempt, env.now)
        self._admit_and_allocate(batch.scheduled, batch.preempt, batch.preempt_at, env.now)   # recompute only: no transfer time
        shape = [(s.num_new_tokens, reqs[s.request_id].num_computed_tokens) for s in batch.scheduled]
        prefill, decode = split_shape(shape)
        stage_s, send_s = self.cost_model.stage_times_s(prefill=prefill, decode=decode,
                                                        num_logits=self._num_logits(batch, shape))
        if len(stage_s) != self.num_stages:
            raise SimulationError(f"cost model priced {len(stage_s)} stages, the engine has {self.num_stages}")
        enter_s, duration_s = self._place(stage_s, send_s)
        fl = _InFlight(batch, env.now, enter_s, duration_s, len(self.in_flight) + 1, 0, 0)
        for s in batch.scheduled:
            req = reqs[s.request_id]
            if req.num_uncomputed_tokens == 1 and req.num_generated_tokens > 0:
                fl.num_decode_tokens += 1
            else:
                fl.num_prefill_tokens += s.num_new_tokens
            req.num_computed_tokens += s.num_new_tokens
            fl.rows.append((req, req.num_computed_tokens == req.num_tokens, req.num_preemptions))
        self.in_flight.append(fl)
        done = env.timeout(duration_s)
        done.callbacks.append(lambda _event: self._finish(fl))

    def _place(self, stage_s: Sequence[float], send_s: float) -> tuple[float, float]:
        """Hold each stage in turn, FIFO behind the batches already placed: (first stage's start, the time
        from now to the last stage's end). Times are offsets from now, so that a batch that waits for no
        stage takes exactly the sum of its terms. Each stage's busy spans are kept for the bubbles."""
        now = self.env.now
        t = 0.0
        enter_s = None
        for i, busy_s in enumerate(stage_s):
            start = max(t, self._stage_free_s[i] - now)
            end = start + busy_s
            self._stage_free_s[i] = now + end
            self.stage_busy_s[i] += busy_s
            self._stage_spans[i].append((now + start, now + end))
            if enter_s is None:
                enter_s = now + start
            t = end + send_s if i + 1 < len(stage_s) else end
        return enter_s, t

    # ---- a batch's output comes back ----
    def _finish(self, fl: _InFlight) -> None:
        if self.in_flight[0] is not fl:
            raise SimulationError("pipeline: batches returned out of order")
        self.in_flight.popleft()
        now, log = self.env.now, self.log
        done = []
        for req, samples, num_preemptions in fl.rows:
            if not samples or req.num_preemptions != num_preemptions or req.status is not Status.RUNNING:
                continue   # a partial chunk, or preempted while in flight: vLLM drops the stale output
            if take_sample(req, now, log):
                done.append(req)
        for req in done:
            self.running.remove(req)
            req.finish_s = now
            log.done(req, self.replica_id)
        self._release_finished(done)
        log.iteration(IterationRecord(
            fl.scheduled_s, fl.duration_s, fl.num_prefill_tokens, fl.num_decode_tokens, 0, len(fl.batch.scheduled),
            len(fl.batch.preempt), len(self.waiting), len(self.running), self.pool.num_used_blocks, self.replica_id))
        self.pipeline_rows.append((fl.enter_s, fl.num_in_flight, self._bubble_s(fl)))
        self.active_s += max(0.0, now - max(fl.enter_s, self._active_until_s))
        self._active_until_s = max(self._active_until_s, now)
        for req in done:
            if self.on_done:
                self.on_done(req)
        if self.limits.check_invariants:
            self._check_invariants()
        self._wake_up()

    def _bubble_s(self, fl: _InFlight) -> float:
        """Stage-seconds idle in [fl.enter_s, now]: every batch busy on a stage in that window was placed
        before now (a batch placed later starts at now or after)."""
        lo, hi = fl.enter_s, self.env.now
        busy = 0.0
        for spans in self._stage_spans:
            while spans and spans[0][1] <= lo:   # the oldest batch in flight entered at lo: older spans are done
                spans.popleft()
            busy += sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in spans)
        return max(0.0, self.num_stages * (hi - lo) - busy)


def add_pipeline_results(engines: Sequence[PipelinedEngine], iterations, summary: dict, replicas,
                         num_usable_blocks: int) -> None:
    """The pipelined engines' results, in place: PIPELINE_COLUMNS beside their iteration rows, the pipeline
    keys in `summary` (`pipeline_summary`), and with several replicas each one's `busy_fraction`."""
    for name in PIPELINE_COLUMNS:
        iterations[name] = np.nan
    for e in engines:   # each engine's rows are in its own logging order within the shared log
        if e.pipeline_rows:
            mask = (iterations["replica_id"] == e.replica_id).to_numpy()
            iterations.loc[mask, list(PIPELINE_COLUMNS)] = np.asarray(e.pipeline_rows, dtype=float)
    iterations["num_batches_in_flight"] = iterations["num_batches_in_flight"].astype(np.int64)
    duration_s = summary["duration_s"]
    summary.update(pipeline_summary(engines, iterations, duration_s, num_usable_blocks))
    if replicas is not None:   # each replica's share of the run with a batch in flight (its rows overlap)
        replicas["busy_fraction"] = [e.active_s / duration_s for e in engines]
        summary["replica_busy_max"] = float(replicas["busy_fraction"].max())


def pipeline_summary(engines: Sequence[PipelinedEngine], iterations, duration_s: float,
                     num_usable_blocks: int) -> dict:
    """Summary keys of pipelined engines (`simcore.metrics.summarize` weights each iteration row by its
    duration, which double-counts overlapping batches; these replace its time-weighted keys):
    `pipeline_utilisation`, the stage-seconds worked over the stage-seconds available while batches were in
    the pipeline (1 when it is always full), its complement `pipeline_bubble_fraction`, `busy_fraction` as
    the share of the run with a batch in the pipeline, and `mean_running`, `mean_waiting`, `kv_usage_mean`
    with each row weighted by the time since its replica's previous output (when its state took hold)."""
    num_stages = engines[0].num_stages
    busy = sum(sum(e.stage_busy_s) for e in engines)
    active = sum(e.active_s for e in engines)
    utilisation = busy / (num_stages * active) if active > 0 else 0.0
    out = {"pipeline_parallel_size": num_stages, "pipeline_utilisation": utilisation,
           "pipeline_bubble_fraction": 1.0 - utilisation if active > 0 else 0.0,
           "busy_fraction": active / len(engines) / duration_s if duration_s > 0 else 0.0}
    if len(iterations) and duration_s > 0:
        end = iterations["start_s"] + iterations["duration_s"]
        weight = end - end.groupby(iterations["replica_id"]).shift(fill_value=0.0)
        out.update({"mean_running": float((iterations["num_running"] * weight).sum() / duration_s),
                    "mean_waiting": float((iterations["num_waiting"] * weight).sum() / duration_s),
                    "kv_usage_mean": float((iterations["kv_blocks_used"] * weight).sum() / duration_s
                                           / (num_usable_blocks * len(engines)))})
    return out

"""The fast path: `simcore.engine`'s semantics for one replica under the static, continuous and
chunked-prefill rules (recompute preemption, no prefix caching), without SimPy or `Request` objects.

Same decisions (simcore/fastrules.py), same KV accounting, same float operations for every time, same
event order (SimPy's: time, then creation order), so every table equals the SimPy engine's, bitwise
(tests/test_fastpath.py). Why it is fast: no Python work per running request per step. Decoding requests
are "lazy" (progress = base + number of decode steps); a quiet stretch of decode-only steps, up to the next
arrival or think timer, the first finish, or the first step whose KV growth would preempt, is priced with
the cost model's count-and-sum entry points (`decode_step_time_fn`, `decode_steps_time_s` for long
stretches; any cost model works through `step_time_s`, only slower) and logged as arrays; per-request work
happens at events only. Per-token gaps are logged as weighted samples (gap, count). The per-iteration
invariant checks of the SimPy engine are replaced by the same capacity checks at allocation.
"""
from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np

from simcore.engine import EngineLimits, SimulationError
from simcore.fastrules import QUIET, make_rules
from simcore.kvcache import num_usable_blocks

WAITING, RUNNING, DRAINING, FINISHED, REJECTED = range(5)
INF = float("inf")
NUM_INT_COLUMNS = 8  # prefill, decode, padding, seqs, preempted, waiting, running, kv blocks
SCALAR_STEPS = 8     # a stretch prices this many steps one by one before switching to vectorised chunks


@dataclass
class FastLog:
    """What a fast run produced, as columns (experiments/fast.py turns them into the usual tables)."""
    request_id: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    admitted_s: list
    first_token_s: list
    finish_s: list
    num_preemptions: list
    status: list
    reject_reason: list
    iteration_floats: np.ndarray   # (num_iterations, 2): start_s, duration_s
    iteration_ints: np.ndarray     # (num_iterations, 8) int32, ITERATION_COLUMNS order without replica_id
    itl_values_s: np.ndarray       # weighted ITL samples: gap, and how many sequences had it
    itl_counts: np.ndarray
    itl_end_s: np.ndarray          # when each sample's gaps ended (nondecreasing)
    num_unfinished: int
    priority: np.ndarray | None = None   # the workload's priority class per request (not read by the rules)


class FastEngine:
    """Runs a whole workload: open loop (`arrival_s` sorted) or closed loop (`closed = (concurrency,
    think_time_s)`, requests taken in order). Lengths as integer arrays; `max_new_tokens` -1 = unset.

    Running requests that decode ("lazy decoders") are not updated one by one: they all take one token in
    every decode step, so their progress is `base + D` with D the number of such steps; they are kept by
    finish step (a heap), by block phase (for KV growth), by the time of their last token (for ITL), and
    by their context sum (for pricing). A decision that needs them one by one (a preemption, a token
    budget smaller than the batch, a prompt still being chunked) first makes them explicit again.
    """

    def __init__(self, policy, cost_model, limits: EngineLimits, *, request_id, arrival_s, prompt_tokens,
                 output_tokens, max_new_tokens, closed: tuple[int, float] | None = None):
        if limits.preemption_mode != "recompute":
            raise ValueError("the fast path models recompute preemption only")
        total = num_usable_blocks(limits.num_gpu_blocks)  # as simcore.kvcache.BlockPool
        self.rules = make_rules(policy, total)
        self.grows, self.is_static = self.rules.grows, self.rules.static
        self.holds_slots = bool(getattr(policy, "holds_slots_until_drained", False))
        self.cost, self.limits = cost_model, limits
        self.vectorised = hasattr(cost_model, "decode_steps_time_s")
        self.by_sums = hasattr(cost_model, "step_time_sums_s")
        self.bs, self.total, self.max_model_len = limits.block_size, total, limits.max_model_len
        self.request_id = np.asarray(request_id)
        n = len(self.request_id)
        self.arrival = np.asarray(arrival_s, dtype=float).tolist()
        self.prompt = np.asarray(prompt_tokens, dtype=np.int64).tolist()
        self.out = np.asarray(output_tokens, dtype=np.int64).tolist()
        mml = limits.max_model_len
        # max_total_tokens(spec, max_model_len): what Orca-style and static schedulers reserve
        self.maxtot = [mml if m < 0 else min(p + max(m, o), mml)
                       for p, o, m in zip(self.prompt, self.out, np.asarray(max_new_tokens, dtype=np.int64).tolist())]
        self.comp, self.gen, self.blocks, self.npre = [0] * n, [0] * n, [0] * n, [0] * n
        self.adm, self.first, self.fin = [None] * n, [None] * n, [None] * n
        self.last = [0.0] * n
        self.status, self.reason = [WAITING] * n, [None] * n
        self.user = [0] * n
        self.order = [0] * n            # admission order: the running list's order
        self.num_admissions = 0
        self.waiting: deque[int] = deque()
        self.run: list[int] = []
        self.drain: list[int] = []
        self.pref: set[int] = set()     # running requests still prefilling (never lazy)
        self.used = 0
        self.static_prompt_len = 0
        # lazy decoders
        self.D, self.t_last_d = 0, 0.0
        self.lazy = [False] * n
        self.base_comp, self.base_gen, self.join_d = [0] * n, [0] * n, [0] * n
        self.heap: list = []            # (D at which it finishes, admission order, r)
        self.phase = [0] * self.bs      # lazy decoders by base_comp % block_size
        self.base_sum = 0
        self.num_lazy = 0
        self.groups: dict = {}          # lazy decoders by the time of their last token
        self.explicit_mode = False      # lazy decoders were made explicit for this step
        self.closed = closed
        self.seq = 0                    # creation order of events, SimPy's tie-break at equal times
        self.rec_f, self.rec_i = array("d"), array("i")   # counts fit in int32: half the memory
        self.itl_v, self.itl_c, self.itl_e = array("d"), array("q"), array("d")   # gap, count, when it ended
        self.num_logged = 0
        self.pricers: dict = {}          # decode-step pricing functions by batch size

    # ---- lazy decoders ----
    def decode_growth(self) -> int:
        """Blocks the lazy decoders need for their next token (tight paged KV: one each per block_size)."""
        return self.phase[(-self.D) % self.bs] if self.grows else 0

    def _lazify(self, r: int) -> None:
        D = self.D
        bc, bg = self.comp[r] - D, self.gen[r] - D
        self.base_comp[r], self.base_gen[r], self.join_d[r] = bc, bg, D
        self.lazy[r] = True
        self.num_lazy += 1
        self.base_sum += bc
        self.phase[bc % self.bs] += 1
        heapq.heappush(self.heap, (self.out[r] - bg, self.order[r], r))
        lt = self.last[r]
        self.groups[lt] = self.groups.get(lt, 0) + 1

    def _explicit(self, r: int) -> None:
        """Write a lazy decoder's progress back into the per-request lists."""
        D = self.D
        c = self.base_comp[r] + D
        self.comp[r], self.gen[r] = c, self.base_gen[r] + D
        b = -(-c // self.bs)
        if b > self.blocks[r]:
            self.blocks[r] = b
        if self.join_d[r] < D:
            self.last[r] = self.t_last_d
        self.lazy[r] = False

    def materialize(self) -> None:
        """Make every running request explicit (the rules' general path needs them one by one)."""
        for r in self.run:
            if self.lazy[r]:
                self._explicit(r)
        self.heap, self.phase, self.groups = [], [0] * self.bs, {}
        self.base_sum = self.num_lazy = 0
        self.explicit_mode = True

    def _lazy_step_done(self, now: float) -> list:
        """Every lazy decoder took a token at `now`: log the gaps, return those that finished."""
        self.D += 1
        D = self.D
        for lt, count in self.groups.items():
            self.itl_v.append(now - lt)
            self.itl_c.append(count)
            self.itl_e.append(now)
        self.t_last_d = now
        done, heap = [], self.heap
        while heap and heap[0][0] <= D:
            r = heapq.heappop(heap)[2]
            self._explicit(r)
            bc = self.base_comp[r]
            self.num_lazy -= 1
            self.base_sum -= bc
            self.phase[bc % self.bs] -= 1
            done.append(r)
        self.groups = {now: self.num_lazy} if self.num_lazy else {}
        return done

    # ---- requests arriving and leaving ----
    def _reject_reason(self, r: int) -> str | None:
        p, o = self.prompt[r], self.out[r]
        if p + max(1, o) > self.max_model_len:
            return "exceeds_max_model_len"
        if o < 1 or p < 1:
            return "empty_prompt_or_output"
        if -(-self.rules.kv_tokens_needed(self, r) // self.bs) > self.total:
            return "exceeds_kv_capacity"
        return None

    def _submit(self, r: int, now: float) -> None:
        reason = self._reject_reason(r)
        if reason:
            self.status[r], self.reason[r], self.fin[r] = REJECTED, reason, now
            self.num_logged += 1
            if self.closed:
                self._on_done(r, now)
            return
        self.waiting.append(r)
        if self.eng_kind is None or self.eng_kind == "timed":  # wake the idle engine
            self.eng_kind, self.eng_t, self.eng_e = "resume", now, self.seq
            self.seq += 1

    def _on_done(self, r: int, now: float) -> None:
        user = self.user[r]
        think = self.closed[1]
        if think <= 0:
            self._send(user, now)
        elif self.deferring:  # the engine acts first at this instant (see _flush_timers)
            self.deferred.append(user)
        else:
            heapq.heappush(self.timers, (now + think, self.seq, user))
            self.seq += 1

    def _send(self, user: int, now: float) -> None:
        r = self.next_spec
        if r < len(self.prompt):
            self.next_spec += 1
            self.arrival[r], self.user[r] = now, user
            self._submit(r, now)

    def _flush_timers(self, now: float) -> None:
        for user in self.deferred:
            heapq.heappush(self.timers, (now + self.closed[1], self.seq, user))
            self.seq += 1
        self.deferred.clear()

    def _next_external(self) -> tuple[float, int]:
        ext = (self.arr_t, self.arr_e)
        if self.timers and self.timers[0][:2] < ext:
            ext = self.timers[0][:2]
        return ext

    # ---- the event loop ----
    def simulate(self) -> FastLog:
        n = len(self.prompt)
        self.timers: list = []
        self.deferred: list[int] = []
        self.eng_kind, self.eng_t, self.eng_e = "resume", 0.0, -2   # the engine process starts first
        self.arr_k, self.arr_t, self.arr_e = 0, INF, 0
        self.deferring = True
        if self.closed:
            self.next_spec = 0
            for user in range(self.closed[0]):
                self._send(user, 0.0)
        else:
            self.arr_t, self.arr_e = 0.0, -1   # the arrival process starts second
        self.deferring = False
        first_arrival = True
        while True:
            t, e, kind = self.eng_t, self.eng_e, self.eng_kind
            if kind is None:
                t = INF
            if (self.arr_t, self.arr_e) < (t, e):
                t, e, kind = self.arr_t, self.arr_e, "arrival"
            if self.timers and self.timers[0][:2] < (t, e):
                t, e, kind = *self.timers[0][:2], "timer"
            if t == INF:
                break
            if kind == "arrival":
                self._arrivals(t, first_arrival)
                first_arrival = False
            elif kind == "timer":
                self._send(heapq.heappop(self.timers)[2], t)
            elif kind == "timed":   # the batching timeout fired: SimPy resumes the engine one event later
                self.eng_kind, self.eng_e = "resume", self.seq
                self.seq += 1
            else:
                self.deferring = True
                if kind == "complete":
                    self._complete(t)
                self._next(t)
                self._flush_timers(t)
                self.deferring = False
        return self._log(n)

    def _arrivals(self, now: float, first: bool) -> None:
        """simcore.arrivals.open_loop: submit the due arrival(s), then sleep until the next one."""
        k, a = self.arr_k, self.arrival
        if not first:
            self._submit(k, now)
            k += 1
        while k < len(a) and a[k] <= now:
            self._submit(k, now)
            k += 1
        self.arr_k = k
        if k < len(a):
            self.arr_t, self.arr_e = now + (a[k] - now), self.seq
            self.seq += 1
        else:
            self.arr_t = INF

    # ---- one engine decision ----
    def _next(self, now: float) -> None:
        if not (self.waiting or self.run):
            self.eng_kind = None
            return
        decision = self.rules.decide(self, now)
        if decision is QUIET:
            if not self.run:
                raise SimulationError(f"{self.rules.name}: scheduled nothing at t={now:.6f}s with "
                                      f"{len(self.waiting)} waiting, {self.total - self.used}/{self.total} blocks free")
            self._stretch(now)
            return
        if isinstance(decision, float):   # a static batch waits to fill
            if decision <= now:
                raise SimulationError(f"static scheduled nothing at t={now:.6f}s")
            self.eng_kind, self.eng_t, self.eng_e = "timed", now + (decision - now), self.seq
            self.seq += 1
            return
        explicit, preempted, padded, all_decode = decision
        num_lazy = self.num_lazy if all_decode else 0
        if not (explicit or num_lazy):
            raise SimulationError(f"{self.rules.name}: scheduled nothing at t={now:.6f}s with "
                                  f"{len(self.waiting)} waiting, {len(self.run)} running, "
                                  f"{self.total - self.used}/{self.total} blocks free")
        self._preempt(preempted)
        if num_lazy:
            growth = self.decode_growth()
            if growth > self.total - self.used:
                raise SimulationError(f"KV pool over capacity: decodes need {growth} blocks")
            self.used += growth
        self._admit_and_allocate(explicit, now)
        duration_s = self._price(explicit, num_lazy, padded)
        self.inflight = (explicit, num_lazy, len(preempted), padded, now, duration_s)
        self.eng_kind, self.eng_t, self.eng_e = "complete", now + duration_s, self.seq
        self.seq += 1

    def _preempt(self, victims: list) -> None:
        for v in victims:   # only after materialize(): victims are explicit
            self.run.remove(v)
            self.npre[v] += 1
            self.used -= self.blocks[v]
            self.blocks[v] = self.comp[v] = 0
            self.status[v] = WAITING
            self.pref.discard(v)
            self.waiting.appendleft(v)

    def _admit_and_allocate(self, scheduled: list, now: float) -> None:
        status, comp, blocks, bs = self.status, self.comp, self.blocks, self.bs
        num_admitted = 0
        for r, n, reserved in scheduled:
            if status[r] != RUNNING:
                num_admitted += 1
                status[r] = RUNNING
                if self.adm[r] is None:
                    self.adm[r] = now
                self.pref.add(r)
            extra = -(-max(comp[r] + n, reserved) // bs) - blocks[r]
            if extra > 0:
                if extra > self.total - self.used:
                    raise SimulationError(f"KV pool over capacity: request {r} needs {extra} blocks")
                self.used += extra
                blocks[r] += extra
        for _ in range(num_admitted):   # these rules admit from the front of the queue, in order
            r = self.waiting.popleft()
            if status[r] != RUNNING:
                raise SimulationError("fast path: admitted requests must be the head of the queue")
            self.order[r] = self.num_admissions
            self.num_admissions += 1
            self.run.append(r)

    def _price(self, scheduled: list, num_lazy: int, padded) -> float:
        if padded is not None:
            rows, new, cached = padded
            if new > 1 or cached == 0:
                return self.cost.step_time_s(prefill=[(new, cached)] * rows, decode=[], num_logits=rows)
            return self.cost.step_time_s(prefill=[], decode=[cached + 1] * rows, num_logits=rows)
        prefill, decode, num_logits = [], [], num_lazy
        comp, prompt, gen = self.comp, self.prompt, self.gen
        for r, n, _ in scheduled:
            c = comp[r]
            if n > 1 or c == 0:
                prefill.append((n, c))
            else:
                decode.append(c + 1)
            if c + n >= prompt[r] + gen[r]:
                num_logits += 1
        if not num_lazy:
            return self.cost.step_time_s(prefill=prefill, decode=decode, num_logits=num_logits)
        D = self.D
        if self.by_sums:   # lazy decoders come first in the batch; the roofline needs only their sum
            lazy_sum = self.base_sum + num_lazy * (D + 1)
            return self.cost.step_time_sums_s(prefill, num_lazy + len(decode), lazy_sum + sum(decode), num_logits)
        lazy_ctx = [self.base_comp[r] + D + 1 for r in self.run if self.lazy[r]]
        return self.cost.step_time_s(prefill=prefill, decode=lazy_ctx + decode, num_logits=num_logits)

    # ---- completing a step ----
    def _complete(self, now: float) -> None:
        scheduled, num_lazy, num_preempted, padded, start_s, duration_s = self.inflight
        comp, gen, prompt, out, first, last = self.comp, self.gen, self.prompt, self.out, self.first, self.last
        done = self._lazy_step_done(now) if num_lazy else []
        num_prefill, num_decode = 0, num_lazy
        gaps, new_decoders = {}, []
        for r, n, _ in scheduled:
            c, g, total = comp[r], gen[r], prompt[r] + gen[r]
            if total - c == 1 and g > 0:
                num_decode += 1
            else:
                num_prefill += n
            c += n
            comp[r] = c
            if c == total:   # caught up: sample one token
                gen[r] = g + 1
                if first[r] is None:
                    first[r] = now
                else:
                    lt = last[r]
                    gaps[lt] = gaps.get(lt, 0) + 1
                last[r] = now
                self.pref.discard(r)
                if g + 1 == out[r]:
                    done.append(r)
                else:
                    new_decoders.append(r)
        for lt, count in gaps.items():
            self.itl_v.append(now - lt)
            self.itl_c.append(count)
            self.itl_e.append(now)
        if done:
            if num_lazy and scheduled:
                done.sort(key=self.order.__getitem__)   # finish order = batch order
            self._finish(done, now)
        if self.explicit_mode:
            self.explicit_mode = False
            for r in self.run:
                if r not in self.pref:
                    self._lazify(r)
        else:
            for r in new_decoders:
                self._lazify(r)
        num_padding = padded[0] * padded[1] - (num_prefill + num_decode) if padded else 0
        self.rec_f.extend((start_s, duration_s))
        self.rec_i.extend((num_prefill, num_decode, num_padding, num_lazy + len(scheduled), num_preempted,
                           len(self.waiting), len(self.run) + len(self.drain), self.used))
        if self.closed:
            for r in done:
                self._on_done(r, now)

    def _finish(self, done: list, now: float) -> None:
        if len(done) == 1:
            self.run.remove(done[0])
        else:
            gone = set(done)
            self.run = [r for r in self.run if r not in gone]
        for r in done:
            self.fin[r] = now
            self.num_logged += 1
            if self.holds_slots:
                self.status[r] = DRAINING
                self.drain.append(r)
            else:
                self.status[r] = FINISHED
                self.used -= self.blocks[r]
                self.blocks[r] = 0
        if self.drain and not self.run:
            for r in self.drain:
                self.used -= self.blocks[r]
                self.blocks[r] = 0
                self.status[r] = FINISHED
            self.drain.clear()

    # ---- quiet stretches ----
    def _stretch(self, now: float) -> None:
        """Every running request (all lazy decoders) decodes one token per step until the first finish, the
        first step whose KV growth exceeds the free blocks (a preemption: left to the rules), or the first
        external event (arrival, think timer) before a step ends. All steps but the last are applied here
        at once; the last is left in flight and completed like any other step. The first few steps are
        priced one by one (most stretches are short); longer stretches in vectorised chunks."""
        num_dec, D, bs = self.num_lazy, self.D, self.bs
        if num_dec != len(self.run) or self.pref:
            raise SimulationError("fast path: a quiet stretch needs every running request decoding")
        if self.is_static:
            rows = num_dec + len(self.drain)
            ctx = self.static_prompt_len + self.base_gen[self.run[0]] + D   # every row's context, first step
            ctx0 = rows * ctx
        else:
            rows, ctx = num_dec, 0
            ctx0 = self.base_sum + num_dec * (D + 1)
        max_steps = self.heap[0][0] - D    # the first finish ends the stretch
        free0, used0 = self.total - self.used, self.used
        e0 = self.seq
        self.seq += 1
        self._flush_timers(now)   # think timers created at this instant come after the first step
        t_ext, e_ext = self._next_external()
        ends, durs, useds = [now], [], []
        grown, j, stop = 0, 0, False
        phase, grows = self.phase, self.grows
        price_sum, context_sum = self._decode_pricer(rows, ctx), ctx0
        t = now
        while j < SCALAR_STEPS:
            if grows:
                g = phase[(-(D + j)) % bs]
                if grown + g > free0:
                    break   # this step would preempt: the rules take it from here
                grown += g
            d = price_sum(context_sum)
            context_sum += rows
            t = t + d
            ends.append(t)
            durs.append(d)
            useds.append(used0 + grown)
            j += 1
            if t_ext < t or (t_ext == t and (j > 1 or e_ext < e0)) or j == max_steps:
                stop = True   # an external event comes before this step's end is processed, or a finish
                break
        else:
            self._vector_steps(j, D, ctx0, rows, ctx, max_steps, free0, used0 + grown, t_ext, ends, durs, useds)
        m = len(durs)
        if m > 1:   # steps 0 .. m-2 happen here
            self._log_quiet_steps(ends, durs, useds, num_dec, rows, m - 1)
            self.D += m - 1
            self.t_last_d = ends[m - 1]
            self.groups = {ends[m - 1]: num_dec}
        self.used = useds[m - 1]   # the last step's blocks are allocated at its start
        padded = (rows, 1, ctx + m - 2) if self.is_static else None
        self.inflight = ([], num_dec, 0, padded, ends[m - 1], durs[m - 1])
        self.eng_kind, self.eng_t = "complete", ends[m]
        self.eng_e = e0 if m == 1 else self.seq + m - 2
        self.seq += m - 1

    def _decode_pricer(self, rows: int, ctx: int):
        """A function from the context sum of a stretch step (`rows` decodes, all sampling) to its time."""
        cost = self.cost
        if hasattr(cost, "decode_step_time_fn"):
            fn = self.pricers.get(rows)
            if fn is None:
                fn = self.pricers[rows] = cost.decode_step_time_fn(rows, rows)
            return fn
        if self.by_sums:
            return lambda context_sum: cost.step_time_sums_s((), rows, context_sum, rows)
        # any cost model: rebuild the contexts (step j adds j to each; the sum adds rows * j)
        contexts0 = ([ctx] * rows if self.is_static else [self.base_comp[r] + self.D + 1 for r in self.run])
        sum0 = sum(contexts0)
        return lambda context_sum: cost.step_time_s(
            prefill=[], decode=[c + (context_sum - sum0) // rows for c in contexts0], num_logits=rows)

    def _vector_steps(self, j0, D, ctx0, rows, ctx, max_steps, free0, used, t_ext, ends, durs, useds) -> None:
        """Continue a long stretch from step j0 in chunks priced by one `decode_steps_time_s` call each."""
        bs, chunk = self.bs, 512   # a long stretch is usually cut by an arrival within a few hundred steps
        growth_by_phase = np.array(self.phase, dtype=np.int64) if self.grows else None
        price_sum = None if self.vectorised else self._decode_pricer(rows, ctx)
        grown0 = used - (self.total - free0)   # blocks grown by the stretch so far
        while j0 < max_steps:
            k = min(chunk, max_steps - j0)
            js = np.arange(j0, j0 + k)
            stop = j0 + k == max_steps
            used_after = np.full(k, used, dtype=np.int64)
            if growth_by_phase is not None:
                cum = grown0 + np.cumsum(growth_by_phase[(-(D + js)) % bs])
                over = np.flatnonzero(cum > free0)
                if over.size:
                    k, stop = int(over[0]), True
                    js, cum = js[:k], cum[:k]
                used_after = (self.total - free0) + cum
            if k == 0:
                return
            if self.vectorised:
                d = np.asarray(self.cost.decode_steps_time_s(rows, ctx0 + rows * js, rows), dtype=float)
            else:
                d = np.array([price_sum(ctx0 + rows * j) for j in js.tolist()], dtype=float)
            e = np.add.accumulate(np.concatenate(([ends[-1]], d)))
            cut = int(np.searchsorted(e[1:], t_ext, side="left"))   # ties: the external comes first
            if cut < k:
                k, stop = cut + 1, True
            ends.extend(e[1:k + 1].tolist())
            durs.extend(d[:k].tolist())
            useds.extend(used_after[:k].tolist())
            if stop:
                return
            j0 += k
            used = useds[-1]
            grown0 = used - (self.total - free0)
            chunk = min(4 * chunk, 4096)

    def _log_quiet_steps(self, ends: list, durs: list, useds: list, num_dec: int, rows: int, k: int) -> None:
        """Iteration rows and ITL samples of the first k steps of a stretch (no finishes among them)."""
        t1 = ends[1]
        itl_v, itl_c, itl_e = self.itl_v, self.itl_c, self.itl_e
        for lt, count in self.groups.items():   # step 0: gaps from each request's own previous token
            itl_v.append(t1 - lt)
            itl_c.append(count)
            itl_e.append(t1)
        consts = (0, num_dec, rows - num_dec, num_dec, 0, len(self.waiting), num_dec + len(self.drain))
        if k <= SCALAR_STEPS:
            rec_f, rec_i = self.rec_f, self.rec_i
            for j in range(1, k):   # every request's previous token came at the previous step's end
                itl_v.append(ends[j + 1] - ends[j])
                itl_c.append(num_dec)
                itl_e.append(ends[j + 1])
            for j in range(k):
                rec_f.extend((ends[j], durs[j]))
                rec_i.extend((*consts, useds[j]))
            return
        e = np.asarray(ends[1:k + 1])
        itl_v.frombytes((e[1:] - e[:-1]).tobytes())
        itl_c.frombytes(np.full(k - 1, num_dec, dtype=np.int64).tobytes())
        itl_e.frombytes(e[1:].tobytes())
        floats = np.empty((k, 2))
        floats[:, 0] = ends[:k]
        floats[:, 1] = durs[:k]
        self.rec_f.frombytes(floats.tobytes())
        ints = np.empty((k, NUM_INT_COLUMNS), dtype=np.int32)
        ints[:, :NUM_INT_COLUMNS - 1] = consts
        ints[:, 7] = useds[:k]
        self.rec_i.frombytes(ints.tobytes())

    # ---- results ----
    def _log(self, n: int) -> FastLog:
        return FastLog(
            self.request_id, np.asarray(self.arrival, dtype=float), np.asarray(self.prompt, dtype=np.int64),
            np.asarray(self.out, dtype=np.int64), self.adm, self.first, self.fin, self.npre,
            ["finished" if s in (FINISHED, DRAINING) else ("rejected" if s == REJECTED else "unfinished")
             for s in self.status], self.reason,
            np.frombuffer(self.rec_f, dtype=float).reshape(-1, 2),
            np.frombuffer(self.rec_i, dtype=np.int32).reshape(-1, NUM_INT_COLUMNS),
            np.frombuffer(self.itl_v, dtype=float), np.frombuffer(self.itl_c, dtype=np.int64),
            np.frombuffer(self.itl_e, dtype=float), n - self.num_logged)

"""Quiet stretches of the fast engine (simcore/fastpath.py): runs of decode-only steps, priced in bulk.

When a policy's `schedule_decodes` answers a quiet step (simcore.batch.DecodeShortcut), every running request
decodes one token per step, and nothing else changes until the next arrival or think timer, the first
finish, or the first step whose KV growth would not fit. Those steps are priced with the cost model's
count-and-sum entry points (`decode_step_time_fn`, `decode_steps_time_s` for long stretches; any cost model
works through `step_time_s`, only slower) and logged as arrays, in the same float operations as one by one.
"""
from __future__ import annotations

import numpy as np

from simcore.engine import SimulationError

NUM_INT_COLUMNS = 8  # prefill, decode, padding, seqs, preempted, waiting, running, kv blocks
# A stretch prices this many steps one by one before switching to vectorised chunks. Most stretches are
# cut by an arrival or a finish within a few steps (benchmarks.speed traffic: median 3, p99 18), and a
# numpy chunk costs tens of microseconds however few steps it prices (1M requests end to end, timed in
# one process: 79 s with 8 here, 60 s with 64).
SCALAR_STEPS = 64


class QuietStretches:
    """Mixed into FastEngine: the stretch, its pricing and its log rows (reads the engine's lazy state)."""

    def _stretch(self, now: float, padded) -> None:
        """Every running request (all lazy decoders) decodes one token per step until the first finish, the
        first step whose KV growth exceeds the free blocks (a preemption: left to the policy), or the first
        external event (arrival, think timer) before a step ends. All steps but the last are applied here
        at once; the last is left in flight and completed like any other step. The first few steps are
        priced one by one (most stretches are short); longer stretches in vectorised chunks."""
        num_dec, D, bs = self.num_lazy, self.D, self.bs
        if num_dec != len(self.running) or self.pref:
            raise SimulationError("fast path: a quiet stretch needs every running request decoding")
        if padded is not None:   # padded lock-step rows (static batching): one context, one token further a step
            rows, ctx = len(padded), padded[0][1] + 1   # every row's decode context, first step
            if padded[0] != (1, ctx - 1) or padded.count(padded[0]) != rows:   # (C-speed check: 256 rows)
                raise SimulationError("fast path: a quiet padded step needs identical one-token rows")
            ctx0 = rows * ctx
        else:
            rows, ctx = num_dec, 0
            ctx0 = self.base_sum + num_dec * (D + 1)
        if self.one_step:
            # In a cluster every step ends as an event of its own: another replica's event may route a
            # request here or start a think timer between any two steps, and SimPy numbers each step's event
            # when the one before it ends. The stretch goes on step by step (`quiet_step`, simcore/fastpath.py).
            if not self._one_quiet_step(now, padded, rows, ctx, ctx0):
                raise SimulationError(f"{self.policy.name}: schedule_decodes answered a quiet step at t={now:.6f}s, "
                                      f"but the decodes need {self.decode_growth()} blocks and "
                                      f"{self.total - self.pool.num_used_blocks} are free")
            return
        max_steps = self.heap[0][0] - D    # the first finish ends the stretch
        used0 = self.pool.num_used_blocks
        free0 = self.total - used0
        e0 = self.seq
        self.seq += 1
        traffic = self.traffic
        if traffic.deferred:
            traffic._flush_timers(now)   # think timers created at this instant come after the first step
        t_ext, e_ext = traffic._next_external()
        ends, durs, useds = [now], [], []
        grown, j, stop = 0, 0, False
        phase = self.phase
        grows = any(phase)
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
        if m == 0:   # a quiet answer promises the decodes fit (simcore.batch.DecodeShortcut)
            raise SimulationError(f"{self.policy.name}: schedule_decodes answered a quiet step at t={now:.6f}s, "
                                  f"but the decodes need {phase[(-D) % bs]} blocks and {free0} are free")
        if self.members is not None:   # prefix caching: the pool allocates all m steps' blocks at their starts
            self.cache_steps(m)
        else:   # every step's blocks, the last one's included, are allocated by its start
            self.pool.num_used_blocks = useds[m - 1]
        if m > 1:   # steps 0 .. m-2 happen here
            self._log_quiet_steps(ends, durs, useds, num_dec, rows, m - 1)
            self.D += m - 1
            self.t_last_d = ends[m - 1]
            self.groups = {ends[m - 1]: num_dec}
        last = ((1, ctx + m - 2),) * rows if padded is not None else None
        self.inflight = ([], num_dec, 0, last, ends[m - 1], durs[m - 1])
        self.eng_kind, self.eng_t = "complete", ends[m]
        self.eng_e = e0 if m == 1 else self.seq + m - 2
        self.seq += m - 1

    def _one_quiet_step(self, now: float, padded, rows: int, ctx: int, context_sum: int) -> bool:
        """One quiet step put in flight alone (a cluster's replica): `rows` decodes (padded rows of context
        `ctx`, or the lazy decoders: ctx 0), `context_sum` their contexts' sum. False, with nothing changed,
        when its KV growth does not fit (the policy then decides: a preemption)."""
        growth = self.phase[(-self.D) % self.bs]
        used = self.pool.num_used_blocks
        if growth > self.total - used:
            return False
        d = self._decode_pricer(rows, ctx)(context_sum)
        if self.members is not None:   # prefix caching: the pool allocates (and counts) the blocks itself
            self.cache_steps(1)
        else:
            self.pool.num_used_blocks = used + growth   # allocated at the step's start
        self.inflight = ([], self.num_lazy, 0, padded, now, d)
        self.eng_kind, self.eng_t, self.eng_e = "complete", now + d, self.seq
        self.seq += 1
        traffic = self.traffic
        if traffic.deferred:
            traffic._flush_timers(now)   # think timers created at this instant come after the step
        self.quiet_step = True
        return True

    def _continue_quiet(self, now: float) -> bool:
        """After a quiet step in which nothing finished and nothing reached this replica (`quiet_step`), the
        policy's quiet answer still holds (simcore.batch.DecodeShortcut's promise): the next step goes in
        flight without asking it, unless its KV growth does not fit (False: the policy decides)."""
        padded = self.inflight[3]
        if padded is not None:   # lock-step rows one token further
            rows, ctx = len(padded), padded[0][1] + 2
            return self._one_quiet_step(now, ((1, ctx - 1),) * rows, rows, ctx, rows * ctx)
        n = self.num_lazy
        return self._one_quiet_step(now, None, n, 0, self.base_sum + n * (self.D + 1))

    def _decode_pricer(self, rows: int, ctx: int):
        """A function from the context sum of a stretch step (`rows` decodes, all sampling) to its time."""
        fn = self.pricers.get(rows)   # the cost model's decode-step function by batch size, when it has one
        if fn is not None:
            return fn
        cost = self.cost
        if hasattr(cost, "decode_step_time_fn"):
            fn = self.pricers[rows] = cost.decode_step_time_fn(rows, rows)
            return fn
        if self.by_sums:
            return lambda context_sum: cost.step_time_sums_s((), rows, context_sum, rows)
        # any cost model: rebuild the contexts (step j adds j to each; the sum adds rows * j)
        contexts0 = [ctx] * rows if ctx else [r.base_comp + self.D + 1 for r in self.running]
        sum0 = sum(contexts0)
        return lambda context_sum: cost.step_time_s(
            prefill=[], decode=[c + (context_sum - sum0) // rows for c in contexts0], num_logits=rows)

    def _vector_steps(self, j0, D, ctx0, rows, ctx, max_steps, free0, used, t_ext, ends, durs, useds) -> None:
        """Continue a long stretch from step j0 in chunks priced by one `decode_steps_time_s` call each."""
        bs, chunk = self.bs, 512   # a long stretch is usually cut by an arrival within a few hundred steps
        growth_by_phase = np.array(self.phase, dtype=np.int64) if any(self.phase) else None
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
        consts = (0, num_dec, rows - num_dec, num_dec, 0, len(self.waiting), num_dec + len(self.draining))
        if k <= SCALAR_STEPS:
            rec_f, rec_i = self.rec_f, self.rec_i
            for j in range(1, k):   # every request's previous token came at the previous step's end
                itl_v.append(ends[j + 1] - ends[j])
                itl_c.append(num_dec)
                itl_e.append(ends[j + 1])
            for j in range(k):   # (array.fromlist: twice as fast as extend with a tuple)
                rec_f.fromlist([ends[j], durs[j]])
                rec_i.fromlist([*consts, useds[j]])
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

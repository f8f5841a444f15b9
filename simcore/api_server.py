"""The API server as a queue: what a client's TTFT and E2E wait in the serving front end's one process.

vLLM's OpenAI-compatible server is one Python process per engine replica (`--api-server-count`, one by
default) that both admits every request and streams every token back, on one core under the GIL
(costmodels/frontend.py: 1.20 ms of its CPU a request admitted, 60 us a streamed chunk, measured by
benchmarks.frontend_load on vLLM 0.32's CPU build). Its work arrives from two sides: a request's admission
when the request arrives, and one chunk per request that got tokens each time a step ends (the engine core
sends a step's outputs together; AsyncLLM's `output_handler` processes them in the order the scheduler
lists them and each stream's coroutine then writes its chunk). It serves them first come, first served, so
a request waits for what is ahead of it:

  - at admission, for the server's backlog when it arrives, less what the engine would have kept it
    waiting anyway: the server hands requests over in arrival order, so one that then sits in the engine's
    queue longer than the server delayed it is scheduled when it would have been (a burst of arrivals at
    a busy engine loses nothing to the server's admissions), and the rest of the delay adds to TTFT;
  - at its first token, for the backlog when its step's outputs arrive, and then for the chunks listed
    before its own. vLLM lists a step's running requests first, in the order they were admitted, and the
    newly scheduled after them (`Scheduler.schedule`, `update_from_output`, vLLM 0.32), so a request's first
    chunk comes after every request still decoding in that step, and after the others that got their
    first token in the same step and arrived before it;
  - at its last token the same, behind the chunks of the requests in that step admitted before it and
    still running: the running list keeps the order of admission (counted after the run, `_admitted_before`,
    from each request's admission and finish; a preempted request's move to the back is not followed).

Waits only: the fixed front-end time (`FrontendLatency.latency_s`) was measured one request at a time, so it
already holds one admission and one chunk's own CPU time. The queue is computed after the run from each
replica's arrivals and steps, by Lindley's recursion in closed form (numpy, no event loop). The engine is
not held back by it: vLLM's engine core is another process and streams its outputs whatever the server's
backlog, but a request the server admits late still reaches the simulated engine at its arrival. That is
right while the server keeps up and wrong once it cannot (`api_server_busy` flags a run at 0.8 or more).
`api_server_count` processes share the work evenly: one queue that serves that many times as fast.

Steps come as frames of `start_s`, `duration_s`, `decode_tokens` and `replica_id` (the iterations table, whole
or in chunks as experiments/binding_streamed.py reads it back), each replica's rows in time order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# A first token or a finish belongs to the step that ended at that time (the engines stamp both with the
# step's end); the tolerance absorbs float rounding between the log's start + duration and the stamp.
MATCH_TOL_S = 1e-9


@dataclass
class _Replica:
    """One replica's queue as its steps stream in: its requests' rows sorted by arrival, by first token and
    by finish, how far each has been consumed, and the time the server's last job so far completes."""
    arrival: np.ndarray      # sorted arrival times, and their rows in the request table
    arrival_rows: np.ndarray
    first: np.ndarray        # sorted first-token times (ties by arrival), and their rows
    first_rows: np.ndarray
    finish: np.ndarray
    finish_rows: np.ndarray
    done: int = np.iinfo(np.int64).min // 2   # ns; "free since ever"
    work: int = 0            # ns of service so far
    last_s: float = -np.inf  # the last arrival or step end so far
    next_arrival: int = 0
    next_first: int = 0
    next_finish: int = 0
    pending: tuple = (np.empty(0), np.empty(0), np.empty(0))   # steps held for the next frame: start, end, chunks


# The queue runs in whole nanoseconds (int64: 292 years), so its sums are exact and the same however the
# steps are cut into frames: a streamed run's waits equal an in-memory run's bit for bit.
NS = 1e9


def _ns(seconds) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=float) * NS).astype(np.int64)


def _lindley_starts(times: np.ndarray, service: np.ndarray, done: int) -> np.ndarray:
    """Start times (ns) of jobs (times and service in ns, times sorted) served first come first served by
    one server free from `done`: C_i = max(C_(i-1), t_i) + s_i in closed form, C_i = S_i + max(done,
    max_(j<=i) (t_j - S_(j-1))) with S the running sum of service."""
    s_cum = np.cumsum(service)
    return s_cum - service + np.maximum(done, np.maximum.accumulate(times - (s_cum - service)))


def _prior_greater(keys: np.ndarray) -> np.ndarray:
    """For each position i, how many earlier positions j < i hold a larger key (keys: a permutation of
    0..n-1), by a bottom-up merge sort whose levels are vectorised: at each level the right half of every
    block looks its values up in the block's sorted left half (one searchsorted over all blocks, each
    value offset by its block times n)."""
    n = len(keys)
    out = np.zeros(n, dtype=np.int64)
    vals, pos = keys.astype(np.int64), np.arange(n)
    idx = np.arange(n)
    width = 1
    while width < n:
        block = idx // (2 * width)
        right = (idx % (2 * width)) >= width
        left_keys = block[~right] * n + vals[~right]          # sorted: blocks in order, each left half sorted
        query = block[right] * n + vals[right]
        block_end = np.searchsorted(left_keys, (block[right] + 1) * n)
        out[pos[right]] += block_end - np.searchsorted(left_keys, query, side="right")
        order = np.argsort(block * n + vals, kind="stable")  # merge each block's two sorted halves
        vals, pos = vals[order], pos[order]
        width *= 2
    return out


def _admitted_before(admitted: np.ndarray, arrival: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """For each request (one replica's), the requests admitted before it that had not finished before it:
    those listed before it in vLLM's running list at its last step. NaN where it never finished."""
    out = np.full(len(admitted), np.nan)
    done = np.flatnonzero(np.isfinite(admitted) & np.isfinite(finish))
    if not len(done):
        return out
    by_admission = done[np.lexsort((arrival[done], admitted[done]))]
    # rank by finish, a tie ranked higher for the earlier admitted (it is listed first, so it counts)
    place = np.arange(len(by_admission))
    rank = np.empty(len(by_admission), dtype=np.int64)
    rank[np.lexsort((-place, finish[by_admission]))] = place
    out[by_admission] = _prior_greater(rank)
    return out


def _match(step_end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the step (sorted ends) that ended at each time of `t`, -1 where none did."""
    j = np.clip(np.searchsorted(step_end, t - MATCH_TOL_S), 0, max(len(step_end) - 1, 0))
    ok = np.abs(step_end[j] - t) <= MATCH_TOL_S if len(step_end) else np.zeros(len(t), dtype=bool)
    return np.where(ok, j, -1)


class APIServerQueue:
    """The waits of one run's requests in its replicas' API servers. Feed it the steps (`add_steps`, each
    replica's rows in time order, in as many frames as convenient), then read `waits()`. `async_lag`: the
    steps an arrival during a step waits before its first (1 synchronous, 2 under async scheduling)."""

    def __init__(self, requests: pd.DataFrame, cpu_per_request_s: float, cpu_per_chunk_s: float,
                 api_servers: int = 1, drafts_per_step: int = 0, async_lag: int = 2):
        self.admit_ns = int(_ns(cpu_per_request_s / api_servers))
        self.chunk_s = cpu_per_chunk_s / api_servers
        # a speculative step's decode_tokens count each verification's drafts too: one chunk per request
        self.tokens_per_chunk = 1 + drafts_per_step
        self.async_lag = async_lag
        n = len(requests)
        self.admission_wait = np.zeros(n)
        self.hidden = np.zeros(n)   # the part of it the engine's own queue would have held the request anyway
        self.first_wait = np.full(n, np.nan)
        self.last_wait = np.full(n, np.nan)
        replica = requests["replica_id"].to_numpy()
        arrival = requests["arrival_s"].to_numpy(dtype=float)
        admitted = requests["admitted_s"].to_numpy(dtype=float)
        self.queued = admitted - arrival   # NaN: never scheduled
        self.listed_before = np.full(n, np.nan)   # at its last step (_admitted_before)
        first = requests["first_token_s"].to_numpy(dtype=float)
        finish = requests["finish_s"].to_numpy(dtype=float)
        self.replicas: dict[int, _Replica] = {}
        for r in np.unique(replica[replica >= 0]).tolist():
            rows = np.flatnonzero(replica == r)
            by_arrival = rows[np.argsort(arrival[rows], kind="stable")]
            got = rows[np.isfinite(first[rows])]
            by_first = got[np.lexsort((arrival[got], first[got]))]
            ended = rows[np.isfinite(finish[rows])]
            by_finish = ended[np.argsort(finish[ended], kind="stable")]
            self.listed_before[rows] = _admitted_before(admitted[rows], arrival[rows], finish[rows])
            self.replicas[r] = _Replica(arrival[by_arrival], by_arrival, first[by_first], by_first,
                                        finish[by_finish], by_finish)

    def add_steps(self, steps: pd.DataFrame) -> None:
        """A frame of iteration rows (start_s, duration_s, decode_tokens, replica_id)."""
        if not len(steps):
            return
        start = steps["start_s"].to_numpy(dtype=float)
        end = (steps["start_s"] + steps["duration_s"]).to_numpy(dtype=float)
        decoding = steps["decode_tokens"].to_numpy(dtype=float) / self.tokens_per_chunk
        replica = steps["replica_id"].to_numpy() if "replica_id" in steps else np.zeros(len(steps), dtype=np.int64)
        for r in np.unique(replica).tolist():
            q = self.replicas.get(r)
            if q is None:   # steps of a replica without requests (none is possible; nothing waits)
                continue
            idx = np.flatnonzero(replica == r)
            idx = idx[np.argsort(end[idx], kind="stable")]
            # the last `async_lag` steps wait for the next frame: an arrival's first chance to be scheduled
            # can be that many steps on
            s, e, d = (np.concatenate([q.pending[i], x[idx]]) for i, x in enumerate((start, end, decoding)))
            keep = min(self.async_lag, len(e))
            if len(e) > keep:
                self._replica_steps(q, s, e, d, len(e) - keep)
            q.pending = (s[len(e) - keep:], e[len(e) - keep:], d[len(e) - keep:])

    def _replica_steps(self, q: _Replica, start: np.ndarray, end: np.ndarray, decoding: np.ndarray,
                       n: int) -> None:
        """Serve the first `n` of these steps (the rest only say when the next steps began) and the
        arrivals up to the last of them."""
        last = float(end[n - 1])
        # the first tokens these steps gave: each step's count, and each request's place among them
        hi = int(np.searchsorted(q.first, last + MATCH_TOL_S, side="right"))
        first_rows, first_t = q.first_rows[q.next_first:hi], q.first[q.next_first:hi]
        q.next_first = hi
        f_step = _match(end[:n], first_t)
        got = f_step >= 0
        new = np.bincount(f_step[got], minlength=n).astype(float)
        place = np.zeros(len(first_rows))
        if got.any():   # 1-based rank within its step: first tokens are sorted by time, then by arrival
            fs = f_step[got]
            starts = np.r_[True, fs[1:] != fs[:-1]]
            run_start = np.maximum.accumulate(np.where(starts, np.arange(len(fs)), 0))
            place[got] = np.arange(len(fs)) - run_start + 1
        chunks = decoding[:n] + new
        # this stretch's jobs in time order (an admission before a step's chunks at the same instant)
        hi_a = int(np.searchsorted(q.arrival, last, side="right"))
        a_rows, a_t = q.arrival_rows[q.next_arrival:hi_a], q.arrival[q.next_arrival:hi_a]
        q.next_arrival = hi_a
        times = _ns(np.concatenate([a_t, end[:n]]))
        service = np.concatenate([np.full(len(a_t), self.admit_ns), _ns(chunks * self.chunk_s)])
        order = np.lexsort((np.r_[np.zeros(len(a_t)), np.ones(n)], times))
        begun = np.empty(len(times), dtype=np.int64)
        begun[order] = _lindley_starts(times[order], service[order], q.done)
        q.done = int(np.max(begun + service))
        q.work += int(service.sum())
        q.last_s = max(q.last_s, last, float(a_t[-1]) if len(a_t) else -np.inf)
        wait = (begun - times) / NS
        self.admission_wait[a_rows] = wait[:len(a_t)]
        self.hidden[a_rows] = np.minimum(wait[:len(a_t)], self._held_anyway(a_rows, a_t, start, end))
        step_wait = wait[len(a_t):]
        rows, fs = first_rows[got], f_step[got]
        self.first_wait[rows] = step_wait[fs] + (decoding[fs] + place[got] - 1) * self.chunk_s
        hi_f = int(np.searchsorted(q.finish, last + MATCH_TOL_S, side="right"))
        fin_rows, fin_t = q.finish_rows[q.next_finish:hi_f], q.finish[q.next_finish:hi_f]
        q.next_finish = hi_f
        e_step = _match(end[:n], fin_t)
        ok = e_step >= 0
        es = e_step[ok]
        ahead = np.minimum(np.nan_to_num(self.listed_before[fin_rows[ok]]), np.maximum(chunks[es] - 1, 0))
        self.last_wait[fin_rows[ok]] = step_wait[es] + ahead * self.chunk_s

    def _held_anyway(self, rows: np.ndarray, arrival: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """How long past its first chance to be scheduled the engine kept each arriving request waiting: its
        first chance is the next step's start if the engine was idle, else `async_lag` steps on; 0 where it
        was never scheduled or that step is not known."""
        j = np.searchsorted(start, arrival, side="right") - 1   # the last step begun at its arrival
        busy = (j >= 0) & (arrival < end[np.maximum(j, 0)])
        k = j + np.where(busy, self.async_lag, 1)
        known = k < len(start)
        chance = np.where(known, start[np.minimum(k, len(start) - 1)], np.inf)
        held = self.queued[rows] - (chance - arrival)
        return np.where(known & np.isfinite(held), np.maximum(held, 0.0), 0.0)

    def waits(self) -> tuple[np.ndarray, np.ndarray]:
        """(first token, finish) seconds each request waited in the queue: its admission, less what the
        engine's own queue would have held it anyway, and its chunks'; 0 where it has no such token or its
        step was not fed (a rejected request waits only to be admitted)."""
        for q in self.replicas.values():
            if len(q.pending[1]):   # the last steps, with nothing after them
                s, e, d = q.pending
                q.pending = (s[:0], e[:0], d[:0])
                self._replica_steps(q, s, e, d, len(e))
            rows, t = q.arrival_rows[q.next_arrival:], q.arrival[q.next_arrival:]
            if len(t):   # arrivals after a replica's last step: admitted, never stepped
                t_ns = _ns(t)
                self.admission_wait[rows] = (_lindley_starts(t_ns, np.full(len(t), self.admit_ns), q.done) - t_ns) / NS
                q.next_arrival = len(q.arrival)
                q.work += self.admit_ns * len(t)
                q.last_s = max(q.last_s, float(t[-1]))
        admission = self.admission_wait - self.hidden
        return admission + np.nan_to_num(self.first_wait), admission + np.nan_to_num(self.last_wait)

    def busy(self) -> float:
        """The busiest replica's API server: the share of its time, from the replica's first arrival to its
        last step (engine time), that its admissions and chunks take; NaN where no replica spans any time.
        Read after `waits()`."""
        shares = [q.work / NS / (q.last_s - q.arrival[0]) for q in self.replicas.values()
                  if len(q.arrival) and q.last_s > q.arrival[0]]
        return max(shares) if shares else float("nan")

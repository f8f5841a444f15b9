"""What the fast engines record, and the `FastLog` it becomes: per-request columns (a request's row is
written when it leaves; its record is then released), iteration rows and weighted ITL samples as compact
arrays, and, only when asked, the request events. A cluster's replicas share one of each."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from simcore.errors import SimulationError
from simcore.fast.stretch import SCALAR_STEPS
from simcore.log import RequestEvent
from simcore.request import RequestSpecs

# Per-request status codes in FastLog.status (one byte a request instead of a string reference).
STATUS_NAMES = ("unfinished", "finished", "rejected")
UNFINISHED, FINISHED, REJECTED = range(3)
NUM_INT_COLUMNS = 8  # prefill, decode, padding, seqs, preempted, waiting, running, kv blocks
ITERATION_CHUNK_ROWS = 262_144   # rows handed to `iteration_sink` at a time (12 MiB; Parquet row groups this size)


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
    replica_id: np.ndarray | None = None              # a cluster's (simcore/fast/cluster.py): where each ran
    iteration_replica_id: np.ndarray | None = None
    events: list | None = None     # RequestEvent list, with `record_events` only


class RequestColumns:
    """One row per spec (indexed by its place in the workload), written when the request leaves."""

    def __init__(self, specs):
        n = len(specs)
        if isinstance(specs, RequestSpecs):   # ids 0..n-1: unique by construction
            self.request_ids = specs.column("request_id")
            self.arrival_s = specs.column("arrival_s").copy()   # closed loop: send time
        else:
            self.request_ids = np.fromiter((s.request_id for s in specs), np.int64, n)
            if len(np.unique(self.request_ids)) < n:   # checked up front: finished requests are not kept
                ids, counts = np.unique(self.request_ids, return_counts=True)
                raise SimulationError(f"duplicate request id {int(ids[counts > 1][0])}")
            self.arrival_s = np.fromiter((s.arrival_s for s in specs), float, n)   # closed loop: send time
        self.admitted_s, self.first_token_s, self.finish_s = (np.full(n, np.nan) for _ in range(3))
        self.num_preemptions = np.zeros(n, dtype=np.int32)
        self.status = np.zeros(n, dtype=np.int8)   # UNFINISHED until it leaves
        self.reject_reasons: dict[int, str] = {}
        self.num_left = 0   # rows written as finished or rejected

    def record(self, req, status: int) -> None:
        k = req.index
        if req.admitted_s is not None:
            self.admitted_s[k] = req.admitted_s
        if req.first_token_s is not None:
            self.first_token_s[k] = req.first_token_s
        if req.finish_s is not None:
            self.finish_s[k] = req.finish_s
        self.num_preemptions[k] = req.num_preemptions
        self.status[k] = status


class StepLog:
    """Iteration rows (floats: start, duration; ints: NUM_INT_COLUMNS) and weighted ITL samples (gap, how
    many sequences had it, when it ended). With an `iteration_sink`, every ITERATION_CHUNK_ROWS rows go to
    it as (floats, ints) (experiments/fast.py streams them to a file), and with an `itl_sink` the ITL
    samples to it as (gaps, counts) at the same times (their end times are then dropped), so that a long
    run holds neither. A cluster's log (`with_replicas`) also holds the replica of each row, which then
    goes to the sink as a third argument."""

    def __init__(self, iteration_sink=None, itl_sink=None, with_replicas: bool = False):
        self.iteration_floats, self.iteration_ints = array("d"), array("i")   # counts fit in int32
        self.iteration_replicas = array("i") if with_replicas else None   # the cluster appends to it
        self.itl_gaps, self.itl_counts, self.itl_ends = array("d"), array("q"), array("d")
        self.iteration_sink = iteration_sink
        self.itl_sink = itl_sink if iteration_sink is not None else None

    def flush_if_due(self) -> None:
        if self.iteration_sink is not None and len(self.iteration_floats) >= 2 * ITERATION_CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        """Hand the iteration rows (and, with an ITL sink, the ITL samples) logged so far over; start afresh."""
        floats = np.frombuffer(self.iteration_floats, dtype=float).reshape(-1, 2).copy()
        ints = np.frombuffer(self.iteration_ints, dtype=np.int32).reshape(-1, NUM_INT_COLUMNS).copy()
        self.iteration_floats, self.iteration_ints = array("d"), array("i")
        if self.iteration_replicas is None:
            self.iteration_sink(floats, ints)
        else:
            replicas = np.frombuffer(self.iteration_replicas, dtype=np.int32).copy()
            self.iteration_replicas = array("i")
            self.iteration_sink(floats, ints, replicas)
        if self.itl_sink is not None:
            gaps, counts = np.frombuffer(self.itl_gaps, dtype=float), np.frombuffer(self.itl_counts, dtype=np.int64)
            self.itl_gaps, self.itl_counts, self.itl_ends = array("d"), array("q"), array("d")
            self.itl_sink(gaps, counts)

    def log_quiet_steps(self, by_last_token: dict, ends: list, durs: list, useds: list, num_dec: int, k: int,
                        consts: tuple) -> None:
        """Iteration rows and ITL samples of the first k steps of a quiet stretch (no finishes among them):
        `ends` from the stretch's start, `num_dec` lazy decoders whose previous tokens came at the times of
        `by_last_token`, the rows' columns `consts` but the last (the KV blocks in use, `useds`)."""
        t1 = ends[1]
        itl_gaps, itl_counts, itl_ends = self.itl_gaps, self.itl_counts, self.itl_ends
        for lt, count in by_last_token.items():   # step 0: gaps from each request's own previous token
            itl_gaps.append(t1 - lt)
            itl_counts.append(count)
            itl_ends.append(t1)
        if k <= SCALAR_STEPS:   # a short stretch: per-row appends cost less than numpy's fixed cost
            floats, ints = self.iteration_floats, self.iteration_ints
            for j in range(1, k):   # every request's previous token came at the previous step's end
                itl_gaps.append(ends[j + 1] - ends[j])
                itl_counts.append(num_dec)
                itl_ends.append(ends[j + 1])
            for j in range(k):   # (array.fromlist: its own path for a list; extend takes the generic one)
                floats.fromlist([ends[j], durs[j]])
                ints.fromlist([*consts, useds[j]])
            return
        e = np.asarray(ends[1:k + 1])
        itl_gaps.frombytes((e[1:] - e[:-1]).tobytes())
        itl_counts.frombytes(np.full(k - 1, num_dec, dtype=np.int64).tobytes())
        itl_ends.frombytes(e[1:].tobytes())
        floats = np.empty((k, 2))
        floats[:, 0] = ends[:k]
        floats[:, 1] = durs[:k]
        self.iteration_floats.frombytes(floats.tobytes())
        ints = np.empty((k, NUM_INT_COLUMNS), dtype=np.int32)
        ints[:, :NUM_INT_COLUMNS - 1] = consts
        ints[:, NUM_INT_COLUMNS - 1] = useds[:k]
        self.iteration_ints.frombytes(ints.tobytes())


class NoEvents:
    """By default the fast engine keeps no per-request event list (a million requests would not fit): its
    tables are built from the request columns at the end."""
    events = None

    def event(self, now_s, req, kind) -> None:
        pass

    def preemption(self, req, now_s) -> None:
        pass


class Events(NoEvents):
    """With `record_events`: the SimPy log's request events (simcore/log.py `RequestEvent`: arrived, rejected,
    admitted, preempted, first_token, finished), in the same order, for timeline tests."""

    def __init__(self):
        self.events: list[RequestEvent] = []

    def event(self, now_s, req, kind) -> None:
        self.events.append(RequestEvent(now_s, req.request_id, kind))

    def preemption(self, req, now_s) -> None:
        self.events.append(RequestEvent(now_s, req.request_id, "preempted"))


def fast_log(columns: RequestColumns, steps: StepLog, specs, events: list | None) -> FastLog:
    """The run's FastLog, taking over the columns and arrays (unfinished requests' rows written already)."""
    if steps.iteration_sink is not None and (len(steps.iteration_floats) or len(steps.itl_gaps)):
        steps.flush()
    n = len(specs)
    if isinstance(specs, RequestSpecs):
        prompt, output, priority = (specs.column(c).astype(np.int64)
                                    for c in ("num_prompt_tokens", "num_output_tokens", "priority"))
    else:
        prompt, output, priority = (np.fromiter((getattr(s, c) for s in specs), np.int64, n)
                                    for c in ("num_prompt_tokens", "num_output_tokens", "priority"))
    return FastLog(
        columns.request_ids, columns.arrival_s, prompt, output,
        columns.admitted_s, columns.first_token_s, columns.finish_s, columns.num_preemptions, columns.status,
        columns.reject_reasons,
        np.frombuffer(steps.iteration_floats, dtype=float).reshape(-1, 2),
        np.frombuffer(steps.iteration_ints, dtype=np.int32).reshape(-1, NUM_INT_COLUMNS),
        np.frombuffer(steps.itl_gaps, dtype=float), np.frombuffer(steps.itl_counts, dtype=np.int64),
        np.frombuffer(steps.itl_ends, dtype=float), n - columns.num_left, priority, events=events)

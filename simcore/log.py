"""Append-only log an engine writes as it runs; `simcore.metrics` turns it into tables once, at the end.

Rows are named tuples (field names = the table's columns), so tests can assert exact timelines
(`log.events == [RequestEvent(0.0, 1, "arrived"), ...]`) and readers say `row.kv_blocks_used`, not `row[9]`.
"""
from __future__ import annotations

from typing import NamedTuple

from simcore.request import Request, RequestSpec


class RequestRecord(NamedTuple):
    """One request, written when it finishes or is rejected."""
    request_id: int
    replica_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admitted_s: float | None
    first_token_s: float | None
    finish_s: float | None
    num_preemptions: int
    status: str
    reject_reason: str | None
    priority: int


class IterationRecord(NamedTuple):
    """One engine iteration (forward pass); counts after the step, except `num_preempted`."""
    start_s: float
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    padding_tokens: int
    num_seqs: int
    num_preempted: int
    num_waiting: int
    num_running: int
    kv_blocks_used: int
    replica_id: int


class RequestEvent(NamedTuple):
    """A change in one request's life: arrived, rejected, admitted (each time it leaves the queue),
    preempted, first_token, finished. Per-token events are not logged (see `itl_gaps_s`)."""
    time_s: float
    request_id: int
    kind: str


REQUEST_COLUMNS = RequestRecord._fields
ITERATION_COLUMNS = IterationRecord._fields


class EngineLog:
    """Named tuples, appended in event order. One log can be shared by several replicas."""

    def __init__(self):
        self.num_arrivals = 0
        self.requests: list[RequestRecord] = []      # one row per request when it finishes or is rejected
        self.iterations: list[IterationRecord] = []  # one row per iteration
        self.events: list[RequestEvent] = []
        self.itl_gaps_s: list[float] = []    # every gap between consecutive tokens of a request, pooled

    @property
    def preemptions(self) -> list[RequestEvent]:
        return [e for e in self.events if e.kind == "preempted"]

    def arrival(self, spec: RequestSpec, replica_id: int, now_s: float) -> None:
        self.num_arrivals += 1
        self.events.append(RequestEvent(now_s, spec.request_id, "arrived"))

    def event(self, now_s: float, req: Request, kind: str) -> None:
        self.events.append(RequestEvent(now_s, req.request_id, kind))

    def done(self, req: Request, replica_id: int = 0) -> None:
        s = req.spec
        status = "rejected" if req.reject_reason else "finished"
        self.events.append(RequestEvent(req.finish_s, s.request_id, status))
        self.requests.append(RequestRecord(
            s.request_id, replica_id, s.arrival_s, s.num_prompt_tokens, s.num_output_tokens, req.admitted_s,
            req.first_token_s, req.finish_s, req.num_preemptions, status, req.reject_reason, s.priority))

    def preemption(self, req: Request, now_s: float) -> None:
        self.event(now_s, req, "preempted")

    def iteration(self, record: IterationRecord) -> None:
        self.iterations.append(record)

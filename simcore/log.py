"""Append-only log an engine writes as it runs; `simcore.metrics` turns it into tables once, at the end."""
from __future__ import annotations

from simcore.request import Request, RequestSpec

REQUEST_COLUMNS = ("request_id", "replica_id", "arrival_s", "prompt_tokens", "output_tokens", "admitted_s",
                   "first_token_s", "finish_s", "num_preemptions", "status", "reject_reason", "priority")
ITERATION_COLUMNS = ("start_s", "duration_s", "prefill_tokens", "decode_tokens", "padding_tokens",
                     "num_seqs", "num_preempted", "num_waiting", "num_running", "kv_blocks_used", "replica_id")


class EngineLog:
    """Plain tuples, appended in event order. One log can be shared by several replicas."""

    def __init__(self):
        self.num_arrivals = 0
        self.requests: list[tuple] = []      # one row per request when it finishes or is rejected
        self.iterations: list[tuple] = []    # one row per iteration, ITERATION_COLUMNS
        self.preemptions: list[tuple[float, int]] = []
        self.itl_gaps_s: list[float] = []    # every gap between consecutive tokens of a request, pooled

    def arrival(self, spec: RequestSpec, replica_id: int) -> None:
        self.num_arrivals += 1

    def done(self, req: Request, replica_id: int = 0) -> None:
        s = req.spec
        self.requests.append((s.request_id, replica_id, s.arrival_s, s.num_prompt_tokens, s.num_output_tokens,
                              req.admitted_s, req.first_token_s, req.finish_s, req.num_preemptions,
                              "rejected" if req.reject_reason else "finished", req.reject_reason, s.priority))

    def preemption(self, req: Request, now_s: float) -> None:
        self.preemptions.append((now_s, req.request_id))

    def iteration(self, *row) -> None:
        self.iterations.append(row)

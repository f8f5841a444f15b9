"""A recording subclass of vLLM V1's scheduler, loaded inside vLLM's engine-core process.

`fidelity.vllm_run` passes `scheduler_cls="fidelity.vllm_hooks.RecordingScheduler"`; vLLM builds it in
place of its own `Scheduler` (or `AsyncScheduler` when async scheduling is on: `__new__` picks the matching
base), so every decision is vLLM's own and only observed. Each step appends one JSON line to the file named by
the environment variable BATCHSIM_VLLM_TRACE (inherited by the spawned engine core):

    {"kind": "step", "t_sched": ..., "t_sched_end": ..., "t_update": ..., "t_update_end": ...,
     "reqs": [[request_id, new_tokens, computed_before, samples], ...], "preempted": [...],
     "finished": [...], "num_waiting": ..., "num_running": ..., "kv_blocks_used": ..., "busy_after": bool}
    {"kind": "arrival", "t": ..., "request_id": ...}

Times are `time.monotonic()`, the same clock the client reads, so client and engine times line up. The
step's forward pass is t_sched_end -> t_update; `busy_after` says whether requests remained, i.e. whether the
next step followed at once.
"""
from __future__ import annotations

import json
import os
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

TRACE_ENV = "BATCHSIM_VLLM_TRACE"


class RecordingScheduler(Scheduler):
    def __new__(cls, vllm_config, *args, **kwargs):
        if cls is RecordingScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = RecordingAsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(TRACE_ENV)
        self._trace = open(path, "a", buffering=1) if path else None  # line-buffered: nothing lost on exit
        self._pending: dict = {}

    def _write(self, record: dict) -> None:
        if self._trace is not None:
            self._trace.write(json.dumps(record, separators=(",", ":")) + "\n")

    def add_request(self, request) -> None:
        self._write({"kind": "arrival", "t": time.monotonic(), "request_id": request.request_id})
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        t0 = time.monotonic()
        out = super().schedule(*args, **kwargs)
        t1 = time.monotonic()
        reqs = []
        for rid, n in out.num_scheduled_tokens.items():
            r = self.requests[rid]
            before = r.num_computed_tokens - n   # schedule() has already advanced it
            reqs.append([rid, n, before, int(before + n >= r.num_tokens)])
        self._pending[id(out)] = {"kind": "step", "t_sched": t0, "t_sched_end": t1, "reqs": reqs,
                                  "preempted": sorted(out.preempted_req_ids or ())}
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        t2 = time.monotonic()
        result = super().update_from_output(scheduler_output, model_runner_output)
        t3 = time.monotonic()
        rec = self._pending.pop(id(scheduler_output), None)
        if rec is not None and rec["reqs"]:
            finished = [rid for rid, *_ in rec["reqs"]
                        if rid not in self.requests or self.requests[rid].is_finished()]
            pool = self.kv_cache_manager.block_pool
            rec.update(t_update=t2, t_update_end=t3, finished=finished, num_waiting=len(self.waiting),
                       num_running=len(self.running),
                       kv_blocks_used=pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),  # less the null block
                       busy_after=bool(self.has_requests()))
            self._write(rec)
        return result


class RecordingAsyncScheduler(RecordingScheduler, AsyncScheduler):
    """The same recording over vLLM's AsyncScheduler (async scheduling on: CUDA)."""

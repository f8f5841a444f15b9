"""Prefill/decode disaggregation (DistServe OSDI'24, Splitwise ISCA'24, Mooncake FAST'25): a prefill pool
and a decode pool of engine replicas in one simulation, with each finished prefill's KV cache copied from
its prefill replica to a decode replica over a link of given bandwidth and latency.

Modelled: routing in each pool; prefill-only iterations on the prefill pool (its engines hand a request off
after its first token); decode-side KV allocated before the copy (queued FIFO per decode replica while it
does not fit, as a decode instance pulls KV only into blocks it has allocated, e.g. vLLM's NixlConnector);
one transfer at a time per prefill replica's link (FIFO); prefill-side blocks freed when the copy ends.
Ignored: layer-wise overlap of the copy with the prefill (Splitwise, Mooncake), contention on the decode
side's link, the router's own latency, and moving a request back to the prefill pool after a preemption
(a decode replica recomputes a preempted request itself, as vLLM does).

Where the first token comes from (`first_token_from`):
  "prefill": the prefill instance samples and streams it (DistServe, Splitwise); the transfer then delays
    the second token, so it counts in the first inter-token gap (and TPOT), not in TTFT.
  "decode": the prefill instance's token is dropped and the decode instance recomputes the last prompt
    token to sample the first one (vLLM's disaggregated-prefill proxy sends the prefill request with
    max_tokens=1 and the KV of all but the last prompt token is loaded); TTFT includes the transfer and
    that decode-side step.
A request with a one-token output finishes on its prefill replica (nothing is handed off), in both modes.

The rules are `HandoffRules`, run here by SimPy processes (`DisaggregatedCluster`) and on the fast path by
simcore/fast/disagg.py (the same results, bitwise).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import simpy

from simcore.cluster import Cluster, ReplicaLoad, Router
from simcore.engine import Engine, SimulationError
from simcore.request import Request, RequestSpec

FIRST_TOKEN_SOURCES = ("prefill", "decode")
HANDOFF_COLUMNS = ("request_id", "prefill_replica_id", "decode_replica_id", "prefill_done_s", "kv_alloc_s",
                   "kv_transfer_start_s", "kv_transfer_end_s", "kv_transfer_bytes")


@dataclass(frozen=True)
class KVLink:
    """A prefill replica's link to the decode pool. With tensor parallelism every GPU sends its own KV
    shard over its own link in parallel, so `bandwidth_bytes_per_s` is per GPU and the bytes are per GPU."""
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self):
        if not self.bandwidth_bytes_per_s > 0 or self.latency_s < 0:
            raise ValueError("a KV link needs a positive bandwidth and a non-negative latency")

    def transfer_s(self, num_bytes: int) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


class HandoffRules:
    """The hand-off rules, one implementation for both engines: the prefill pool's router, the decode
    router's view, the decode-side record, the FIFO of transfers waiting for decode-side KV, and what happens
    when a copy ends. Subclasses run the clock: DisaggregatedCluster here (SimPy processes), FastDisagg in
    simcore/fast/disagg.py (the fast path); they provide `_new_record(src_req)` (a fresh progress record for
    `src_req.spec`), `_launch(src, src_req, dst, dst_req, done_s, now)` (the copy's process) and
    `_hand_over(src, src_req, dst, dst_req, now)` (release the source's KV, run the request at `dst`).

    `kv_bytes_per_token`: KV bytes per token per GPU (what each of a replica's GPUs sends).
    `max_num_seqs`: the decode policy's sequence cap, also applied to requests received (None: no cap).
    `handoffs`: one row per handed-off request, HANDOFF_COLUMNS (times in seconds), appended at the end of
    its transfer.
    """

    def _init_rules(self, prefill: Sequence, decode: Sequence, prefill_router: Router, decode_router: Router,
                    link: KVLink, kv_bytes_per_token: int, first_token_from: str, max_num_seqs: int | None) -> None:
        if not prefill or not decode:
            raise SimulationError("disaggregation needs at least one prefill and one decode replica")
        if first_token_from not in FIRST_TOKEN_SOURCES:
            raise SimulationError(f"first_token_from must be one of {FIRST_TOKEN_SOURCES}, not {first_token_from!r}")
        for e in prefill:
            if not e.limits.handoff_after_first_token:
                raise SimulationError(f"prefill replica {e.replica_id} does not hand requests off")
        self.link, self.kv_bytes_per_token = link, kv_bytes_per_token
        self.prefill, self.decode = list(prefill), list(decode)
        self.prefill_cluster = Cluster(self.prefill, prefill_router)
        self.decode_router = decode_router
        self.first_token_from, self.max_num_seqs = first_token_from, max_num_seqs
        self._index = {id(e): i for i, e in enumerate(self.prefill)}
        self.pending: list[deque] = [deque() for _ in self.decode]  # waiting for decode-side KV blocks
        self.num_handed_off = 0
        self.handoffs: list[tuple] = []
        self._sources: dict[int, tuple] = {}   # request id -> (prefill engine, its record, prefill done time)

    def decode_loads(self) -> list[ReplicaLoad]:
        """Decode replicas as the decode router sees them: queued transfers count as waiting, requests
        whose KV is in flight as running."""
        return [ReplicaLoad(i, len(e.waiting) + len(self.pending[i]), len(e.running) + len(e.receiving),
                            e.pool.num_used_blocks, e.pool.num_blocks) for i, e in enumerate(self.decode)]

    def handoff(self, req: Request, now_s: float) -> None:
        """A prefill replica handed `req` off after its first token: pick its decode replica, queue its copy."""
        spec = req.spec
        d = self.decode_router.route(spec, self.decode_loads(), self.num_handed_off) if len(self.decode) > 1 else 0
        if not 0 <= d < len(self.decode):
            raise SimulationError(f"decode router {self.decode_router.name} picked replica {d} of {len(self.decode)}")
        self.num_handed_off += 1
        src = next(e for e in self.prefill if e.requests.get(spec.request_id) is req)
        self._sources[spec.request_id] = (src, req, now_s)
        self.pending[d].append(spec.request_id)
        self._start_transfers(d, now_s)

    def _decode_copy(self, src_req: Request) -> Request:
        """The decode replica's progress record for a request prefilled elsewhere."""
        copy = self._new_record(src_req)
        copy.num_preemptions, copy.admitted_s = src_req.num_preemptions, src_req.admitted_s
        if self.first_token_from == "prefill":
            copy.num_computed_tokens = src_req.num_computed_tokens
            copy.num_generated_tokens = src_req.num_generated_tokens
            copy.first_token_s, copy.last_token_s = src_req.first_token_s, src_req.last_token_s
        else:  # the decode side recomputes the last prompt token and samples the first token itself
            copy.num_computed_tokens = src_req.spec.num_prompt_tokens - 1
        return copy

    def _fits(self, engine, req: Request) -> bool:
        if self.max_num_seqs is not None and len(engine.running) + len(engine.receiving) >= self.max_num_seqs:
            return False
        return engine.can_receive(req.num_computed_tokens + 1)  # its KV and the next token's slot

    def _start_transfers(self, d: int, now_s: float) -> None:
        """Start the copies queued for decode replica `d` whose KV now fits there, in order."""
        queue, engine = self.pending[d], self.decode[d]
        while queue:  # FIFO: the head blocks the others (no overtaking, like admission in the engines)
            rid = queue[0]
            src, src_req, done_s = self._sources[rid]
            copy = self._decode_copy(src_req)
            if not self._fits(engine, copy):
                if not (engine.running or engine.receiving):  # KV that does not fit even an idle replica
                    raise SimulationError(f"request {rid} cannot be received by decode replica {engine.replica_id}")
                return
            queue.popleft()
            engine.receive(copy)
            self._launch(src, src_req, engine, copy, done_s, now_s)

    def _transfer_bytes(self, src_req: Request) -> int:
        return src_req.num_computed_tokens * self.kv_bytes_per_token

    def _transfer_done(self, src, src_req: Request, dst, dst_req: Request, done_s: float, alloc_s: float,
                       start_s: float, now_s: float) -> None:
        """The copy of `src_req`'s KV ended: free it at the source, run the request at the destination."""
        del self._sources[src_req.request_id]
        self._hand_over(src, src_req, dst, dst_req, now_s)
        self.handoffs.append((src_req.request_id, src.replica_id, dst.replica_id, done_s, alloc_s, start_s,
                              now_s, self._transfer_bytes(src_req)))


class DisaggregatedCluster(HandoffRules):
    """Routes arrivals to the prefill pool, hands prefilled requests to the decode pool (SimPy engines;
    see HandoffRules for the arguments)."""

    def __init__(self, env: simpy.Environment, prefill: Sequence[Engine], decode: Sequence[Engine],
                 prefill_router: Router, decode_router: Router, link: KVLink, kv_bytes_per_token: int,
                 first_token_from: str = "prefill", max_num_seqs: int | None = None):
        self._init_rules(prefill, decode, prefill_router, decode_router, link, kv_bytes_per_token,
                         first_token_from, max_num_seqs)
        self.env = env
        for e in self.prefill:
            e.on_handoff = self._on_handoff
        self.links = [simpy.Resource(env, capacity=1) for _ in self.prefill]  # FIFO, one copy at a time

    def submit(self, spec: RequestSpec) -> None:
        self.prefill_cluster.submit(spec)

    def chain_on_done(self, on_done: Callable[[Request], None] | None) -> None:
        """Install the decode engines' completion hook (retry queued transfers), then `on_done` (closed-loop
        users) on every engine, since a request finishes on either pool."""
        for d, e in enumerate(self.decode):
            e.on_done = self._decode_done_hook(d, on_done)
        for e in self.prefill:
            e.on_done = on_done

    def _decode_done_hook(self, d: int, on_done):
        def hook(req: Request) -> None:
            self._start_transfers(d, self.env.now)
            if on_done is not None:
                on_done(req)
        return hook

    def _on_handoff(self, req: Request) -> None:
        self.handoff(req, self.env.now)

    def _new_record(self, src_req: Request) -> Request:
        return Request(src_req.spec)

    def _launch(self, src: Engine, src_req: Request, dst: Engine, dst_req: Request, done_s: float, now_s: float):
        self.env.process(self._transfer(src, src_req, dst, dst_req, done_s))

    def _hand_over(self, src: Engine, src_req: Request, dst: Engine, dst_req: Request, now_s: float) -> None:
        src.release(src_req)
        dst.received(dst_req)

    def _transfer(self, src: Engine, src_req: Request, dst: Engine, dst_req: Request, done_s: float):
        alloc_s = self.env.now
        with self.links[self._index[id(src)]].request() as slot:
            yield slot
            start_s = self.env.now
            yield self.env.timeout(self.link.transfer_s(self._transfer_bytes(src_req)))
        self._transfer_done(src, src_req, dst, dst_req, done_s, alloc_s, start_s, self.env.now)

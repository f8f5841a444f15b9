"""Prefill/decode disaggregation on the fast path: simcore/disagg.py's deployment without SimPy.

The hand-off rules are simcore/disagg.py's (`HandoffRules`: the prefill router, the decode router's view,
the decode-side record, the FIFO of copies waiting for decode-side KV, the end of a copy); the replicas are
fast engines and the clock is FastCluster's event loop (simcore/fast/cluster.py), so every table equals the
SimPy deployment's bitwise (tests/test_fastdisagg.py). What SimPy does with processes is replayed event
for event: a copy's process starts with an urgent event after the engine step that launched it; it asks
its prefill replica's link (a `simpy.Resource` of capacity 1: FIFO, granted by an event of its own), holds
it for the transfer time, gives it back (a release event, whose processing grants the next queued copy),
then frees the prefill-side KV and runs the request on its decode replica.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections import deque

from simcore.disagg import HandoffRules, KVLink
from simcore.fast.cluster import FastCluster
from simcore.fast.request import FastRequest
from simcore.limits import EngineLimits


class _Link:
    """A prefill replica's link: whether a copy holds it, and the copies queued for it (FIFO)."""
    __slots__ = ("busy", "queue")

    def __init__(self):
        self.busy, self.queue = False, deque()


class FastDisagg(HandoffRules, FastCluster):
    """`num_prefill` prefill replicas (they hand every request off after its first token) and `num_decode`
    decode replicas, as experiments/disaggregation.py wires the SimPy deployment; open or closed loop."""

    def __init__(self, policy, cost_model, limits: EngineLimits, specs, num_prefill: int, num_decode: int,
                 prefill_router, decode_router, link: KVLink, kv_bytes_per_token: int,
                 first_token_from: str = "prefill", max_num_seqs: int | None = None,
                 closed: tuple[int, float] | None = None, record_events: bool = False):
        prefill_limits = dataclasses.replace(limits, handoff_after_first_token=True)
        self._build_replicas(policy, cost_model, [prefill_limits] * num_prefill + [limits] * num_decode, specs,
                             closed, record_events)
        self._init_rules(self.replicas[:num_prefill], self.replicas[num_prefill:], prefill_router, decode_router,
                         link, kv_bytes_per_token, first_token_from, max_num_seqs)
        for e in self.prefill:
            e.on_handoff = self.handoff
        for d, e in enumerate(self.decode):
            e.on_done = self._decode_done_hook(d)
        self.links = [_Link() for _ in self.prefill]
        self.traffic.start_urgent = self._copy_asks_link

    def _submit(self, k: int, spec, now: float) -> None:
        i = self.prefill_cluster.route(spec)
        self.replica_of_request[k] = i
        self._submit_to(self.replicas[i], k, spec, now)

    def _decode_done_hook(self, d: int):
        """simcore.disagg.DisaggregatedCluster.chain_on_done's hook: retry queued copies, then the users."""
        traffic = self.traffic
        closed = traffic.closed

        def hook(req, now: float) -> None:
            self._start_transfers(d, now)
            if closed:
                traffic.on_done(req, now)
        return hook

    # ---- HandoffRules' hooks ----
    def _new_record(self, src_req):
        return FastRequest(src_req.spec, src_req.index)

    def _launch(self, src, src_req, dst, dst_req, done_s: float, now_s: float) -> None:
        """The copy's process starts with an urgent event, after the engine event that launched it."""
        self.replica_of_request[dst_req.index] = dst.replica_id   # it finishes there: its row is that replica's
        self.traffic.deferred.append([src, src_req, dst, dst_req, done_s, None, None])

    def _hand_over(self, src, src_req, dst, dst_req, now_s: float) -> None:
        self._lend(src, src.release, src_req, now_s)   # each wakes its engine if it waits
        self._lend(dst, dst.received, dst_req, now_s)

    # ---- the copy's events ----
    def _copy_asks_link(self, copy: list, now: float) -> None:
        """A copy's process starts (an urgent event after the engine event that launched it, in creation
        order among the think timers started then): it asks its link (its allocation time is now)."""
        copy[5] = now
        link = self.links[self._index[id(copy[0])]]
        link.queue.append(copy)
        self._grant(link, now)

    def _grant(self, link: _Link, now: float) -> None:
        """simpy.Resource._trigger_put: the head of the queue gets a free link, by an event now."""
        if link.queue and not link.busy:
            link.busy = True
            self._schedule(now, "granted", link.queue.popleft())

    def _schedule(self, t: float, kind: str, payload) -> None:
        holder = self.traffic.holder
        heapq.heappush(self.own_events, (t, holder.seq, kind, payload))
        holder.seq += 1

    def _driver_event(self, kind: str, payload, now: float) -> None:
        if kind == "granted":   # the copy starts
            payload[6] = now
            self._schedule(now + self.link.transfer_s(self._transfer_bytes(payload[1])), "copied", payload)
        elif kind == "copied":   # the link is given back (its release event), then the request moves
            link = self.links[self._index[id(payload[0])]]
            link.busy = False
            self._schedule(now, "released", link)
            src, src_req, dst, dst_req, done_s, alloc_s, start_s = payload
            self._transfer_done(src, src_req, dst, dst_req, done_s, alloc_s, start_s, now)
        else:   # "released": the link's release event was processed: the next queued copy may go
            self._grant(payload, now)

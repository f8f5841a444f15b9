"""N identical engine replicas behind a router, in one simulation (one SimPy process per replica).

The router sees a small load snapshot of every replica when a request arrives and picks one; the request
then lives on that replica only. Modelled: routing on queue length, KV usage and cached prefixes.
Ignored: network and router latency, retries, replicas of different sizes. Disaggregated prefill/decode pools:
simcore/disagg.py. The same cluster without SimPy, event for event: simcore/fast/cluster.py.
"""
from __future__ import annotations

import copy
from array import array
from dataclasses import dataclass
from typing import ClassVar, Protocol, Sequence

from simcore.engine import Engine, SimulationError
from simcore.kvcache import chain_hashes
from simcore.request import RequestSpec


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as a router sees it at an arrival. `num_cached_prefix_tokens`: the longest cached
    prefix of the arriving request there (0 without prefix caching, or when the router does not ask)."""
    replica_id: int
    num_waiting: int
    num_running: int
    num_used_blocks: int
    num_total_blocks: int
    num_cached_prefix_tokens: int = 0
    # requests that reached the replica while its step ran, not yet in its queue (async scheduling's
    # admission lag, simcore/async_scheduling.py): vLLM's engine core has them in its input queue
    num_held: int = 0

    @property
    def num_outstanding(self) -> int:
        """Requests sent here and not finished (queued or holding KV)."""
        return self.num_waiting + self.num_running

    @property
    def num_in_flight(self) -> int:
        """Every request sent here and not finished, those not yet in its queue included: what a front end
        that counts its own sends and finishes knows exactly (vLLM's DP client, `engine_inflight`)."""
        return self.num_waiting + self.num_running + self.num_held

    @property
    def kv_usage(self) -> float:
        return self.num_used_blocks / self.num_total_blocks


def _num_held(engine) -> int:
    """Arrivals an engine holds until its step in flight ends (none without async scheduling)."""
    late = getattr(engine, "late", None)
    return len(late.held) if late is not None else 0


class Router(Protocol):
    """A routing policy: a frozen dataclass of its knobs (policies/routers.py). It only decides; one that
    remembers what it saw (vLLM's DP balancer) keeps it in a field the Cluster's own copy starts empty."""
    name: ClassVar[str]
    needs_prefix_info: ClassVar[bool]  # the cluster looks up cached prefixes only for routers that use them

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        """Index of the replica for `spec`; `num_routed` requests were routed before it."""
        ...


class Cluster:
    """Replicas sharing one SimPy environment (and usually one EngineLog, whose rows carry replica_id)."""

    def __init__(self, engines: Sequence[Engine], router: Router):
        if not engines:
            raise SimulationError("a cluster needs at least one replica")
        # its own copy: a router that remembers (vLLM's DP balancer's published counts) starts each run fresh
        self.engines, self.router = list(engines), copy.deepcopy(router)
        self.num_routed = 0
        self.routed_to = array("i")  # replica of each request, in arrival order (4 bytes a request)

    def loads(self, spec: RequestSpec, indices: Sequence[int] | None = None) -> list[ReplicaLoad]:
        """The router's view of the replicas at `indices` (default: all), in that order."""
        hashes = None
        out = []
        engines = self.engines
        for i in range(len(engines)) if indices is None else indices:
            e = engines[i]
            cached = 0
            if self.router.needs_prefix_info and e.prefix_cache is not None:
                if hashes is None:
                    hashes = chain_hashes(spec, e.limits.block_size)
                cached = e.prefix_cache.num_cached_tokens_for(hashes, spec.num_prompt_tokens)
            out.append(ReplicaLoad(i, len(e.waiting), len(e.running) + len(e.draining), e.pool.num_used_blocks,
                                   e.pool.num_blocks, cached, _num_held(e)))
        return out

    def route(self, spec: RequestSpec) -> int:
        """The replica for `spec`, picked from the replicas' state now (the SimPy engines', or the fast
        cluster's replicas: simcore/fast/cluster.py)."""
        i = self.router.route(spec, self.loads(spec), self.num_routed) if len(self.engines) > 1 else 0
        if not 0 <= i < len(self.engines):
            raise SimulationError(f"router {self.router.name} picked replica {i} of {len(self.engines)}")
        self.num_routed += 1
        self.routed_to.append(i)
        return i

    def submit(self, spec: RequestSpec) -> None:
        self.engines[self.route(spec)].submit(spec)

    @property
    def num_waiting(self) -> int:
        return sum(len(e.waiting) for e in self.engines)

    @property
    def num_running(self) -> int:
        return sum(len(e.running) for e in self.engines)

"""Request routers for a cluster of replicas (simcore/cluster.py): each a frozen dataclass of its knobs,
registered by the name a sweep's `cluster.router` uses. Ties always go to the lowest replica index."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from simcore.cluster import ReplicaLoad
from simcore.request import RequestSpec


def _least_outstanding(replicas: Sequence[ReplicaLoad]) -> int:
    return min(replicas, key=lambda r: (r.num_outstanding, r.replica_id)).replica_id


@dataclass(frozen=True)
class RoundRobin:
    """Replica k, k+1, ... in turn, blind to load (Kubernetes Service / vLLM production-stack default)."""
    name: ClassVar[str] = "round_robin"
    needs_prefix_info: ClassVar[bool] = False

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        return replicas[num_routed % len(replicas)].replica_id


@dataclass(frozen=True)
class LeastOutstanding:
    """Fewest requests queued or running (Envoy / NGINX least_request, SGLang router's load balance)."""
    name: ClassVar[str] = "least_outstanding"
    needs_prefix_info: ClassVar[bool] = False

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        return _least_outstanding(replicas)


@dataclass(frozen=True)
class LeastKVUsage:
    """Lowest fraction of KV blocks held by requests (ties: fewest outstanding), as KV-aware routers such
    as llm-d's scorer or NVIDIA Dynamo's KV router weigh memory pressure."""
    name: ClassVar[str] = "least_kv_usage"
    needs_prefix_info: ClassVar[bool] = False

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        return min(replicas, key=lambda r: (r.kv_usage, r.num_outstanding, r.replica_id)).replica_id


@dataclass(frozen=True)
class PrefixAffinity:
    """The replica holding the longest cached prefix of the prompt (SGLang's cache-aware router, vLLM
    production-stack's prefix-aware routing); ties and cache misses go to the fewest outstanding. When the
    load gap (most minus fewest outstanding) exceeds `balance_abs_threshold`, it balances load instead
    (SGLang router's `balance_abs_threshold`, default 32). Needs engine.enable_prefix_caching to see hits.
    Simplification: it reads the replicas' real caches, where SGLang's router keeps an approximate tree."""
    name: ClassVar[str] = "prefix_affinity"
    needs_prefix_info: ClassVar[bool] = True
    balance_abs_threshold: int = 32

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        loads = [r.num_outstanding for r in replicas]
        if max(loads) - min(loads) > self.balance_abs_threshold:
            return _least_outstanding(replicas)
        return min(replicas, key=lambda r: (-r.num_cached_prefix_tokens, r.num_outstanding, r.replica_id)).replica_id


LENGTH_KEYS = ("max_new_tokens", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class LengthSplit:
    """Two pools: requests whose length key is >= `threshold_tokens` go to the first `num_long_replicas`
    replicas, the rest to the others; fewest outstanding within a pool. Keeps long generations from
    sharing batches (and KV) with short chat, which protects chat's tail latency.

    `by`: `max_new_tokens` (the client's max_tokens, known at arrival; unset counts as long),
    `prompt_tokens`, or `output_tokens` (the true output length: an oracle, i.e. a perfect length
    predictor, the upper bound on what learned predictors achieve)."""
    name: ClassVar[str] = "length_split"
    needs_prefix_info: ClassVar[bool] = False
    threshold_tokens: int = 1024
    num_long_replicas: int = 1
    by: str = "max_new_tokens"

    def __post_init__(self):
        if self.by not in LENGTH_KEYS:
            raise ValueError(f"cluster.by: expected one of {', '.join(LENGTH_KEYS)}, got {self.by!r}")
        if self.num_long_replicas < 1 or self.threshold_tokens < 1:
            raise ValueError("cluster.num_long_replicas and cluster.threshold_tokens: must be at least 1")

    def is_long(self, spec: RequestSpec) -> bool:
        if self.by == "max_new_tokens":
            return spec.max_new_tokens is None or spec.max_new_tokens >= self.threshold_tokens
        n = spec.num_prompt_tokens if self.by == "prompt_tokens" else spec.num_output_tokens
        return n >= self.threshold_tokens

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        k = min(self.num_long_replicas, len(replicas) - 1)
        pool = replicas[:k] if self.is_long(spec) else replicas[k:]
        return _least_outstanding(pool)


@dataclass(frozen=True)
class VllmDP:
    """vLLM's own front end choosing a data-parallel rank (`DPLBAsyncMPClient.get_core_engine_for_request`,
    vllm/v1/engine/core_client.py, before 0.32): the engine with the lowest `waiting_weight` x waiting +
    running, in the counts the DP coordinator last published (it republishes every `stats_interval_s`,
    `stats_update_interval_ms` = 100, while they change), each raised by one waiting request for every
    request this front end has sent there since; ties to the lowest rank. Between snapshots each send thus
    weighs as four running requests, and a burst spreads across ranks whose counts are close. Kept here: the snapshot is the
    replicas' counts at the first arrival after each interval's start (the coordinator's are its ranks'
    counts at their last step boundary before it). vLLM 0.32 scores max(in-flight, waiting + running) plus
    a KV-pressure term on waiting instead: not modelled. Routes at arrival, as a front end does: not a
    decode pool's router (a disaggregated deployment routes its decodes at the hand-off)."""
    name: ClassVar[str] = "vllm_dp"
    needs_prefix_info: ClassVar[bool] = False
    at_arrival_only: ClassVar[bool] = True
    waiting_weight: float = 4.0
    stats_interval_s: float = 0.1
    # the front end's copy of the counts: (interval index, {replica: [waiting, running]}); each Cluster routes
    # with its own copy of the router (simcore/cluster.py), so a run starts with none
    _published: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.waiting_weight >= 0:
            raise ValueError(f"cluster.waiting_weight: expected a number >= 0, got {self.waiting_weight!r}")
        if not self.stats_interval_s > 0:
            raise ValueError(f"cluster.stats_interval_s: expected a number > 0, got {self.stats_interval_s!r}")

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        interval = int(spec.arrival_s // self.stats_interval_s)
        seen = self._published
        if seen.get("interval") != interval:
            seen["interval"] = interval
            seen["counts"] = {r.replica_id: [r.num_waiting, r.num_running] for r in replicas}
        counts = seen["counts"]
        for r in replicas:   # a replica it has not seen (an autoscaler's new one): its counts now
            counts.setdefault(r.replica_id, [r.num_waiting, r.num_running])
        w = self.waiting_weight
        best = min(replicas, key=lambda r: (w * counts[r.replica_id][0] + counts[r.replica_id][1],
                                            r.replica_id)).replica_id
        counts[best][0] += 1
        return best


ROUTERS = {r.name: r for r in (RoundRobin, LeastOutstanding, LeastKVUsage, PrefixAffinity, LengthSplit, VllmDP)}

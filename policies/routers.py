"""Request routers for a cluster of replicas (simcore/cluster.py): each a frozen dataclass of its knobs,
registered by the name a sweep's `cluster.router` uses. Ties go to the lowest replica index (`vllm_dp`'s as its
vLLM release breaks them)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from policies.vllm_versions import MODELLED, vllm_rules
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
    vllm/v1/engine/core_client.py), as the release `vllm_version` does it (None: the engine's
    `engine.vllm_version`, else the newest modelled; policies/vllm_versions.py). Every release scores each
    rank from the counts the DP coordinator last published (it republishes every `stats_interval_s`,
    `stats_update_interval_ms` = 100, while they change), raises the chosen rank's waiting count by one
    for every request it sends there until the next snapshot, and takes the lowest score, scanning the ranks
    from a start index:
    - before 0.27: `waiting_weight` (4) x waiting + running; between snapshots each send thus weighs as four
      running requests;
    - from 0.27 (PR #49204): max(in-flight, waiting + running), plus waiting x 6 x max(0, KV usage - 0.5)
      where any wait; in-flight is this front end's own count of the requests it sent there and has not
      seen finish, exact at every send, so a burst spreads round robin whatever the snapshot says, and a
      queue on a rank whose KV is more than half full steers new requests away;
    - the scan starts at the lowest rank before 0.25, and one rank later for every request routed from 0.25
      (PR #47420), so ties rotate.
    A dense model's ranks publish no counts from 0.14 to 0.26 (`counts_published` False, which
    experiments.config sets from the release and the model: policies/vllm_versions.py): the coordinator
    then republishes zeros every `UNPUBLISHED_REPUBLISH_S`, and the front end routes on its own sends since,
    round robin blind to load.
    Kept here: the snapshot is the replicas' counts at the first arrival after each interval's start (the
    coordinator's are its ranks' counts at their last step boundary before it). Routes at arrival, as a
    front end does: not a decode pool's router (a disaggregated deployment routes its decodes at the
    hand-off)."""
    name: ClassVar[str] = "vllm_dp"
    needs_prefix_info: ClassVar[bool] = False
    at_arrival_only: ClassVar[bool] = True
    vllm_version: str | None = None       # experiments.config sets the engine's where the file does not
    waiting_weight: float | None = None   # None: vLLM's 4 before 0.27; none from 0.27
    stats_interval_s: float = 0.1
    counts_published: bool | None = None  # None: True (experiments.config sets the release's for the model)
    # the front end's copy of the counts: interval index, {replica: [waiting, running, KV usage]} and the
    # scan's start; each Cluster routes with its own copy of the router (simcore/cluster.py), so a run
    # starts with none
    _published: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        rules = vllm_rules(MODELLED if self.vllm_version is None else self.vllm_version, "cluster.vllm_version")
        object.__setattr__(self, "vllm_rules", rules)   # not a field: derived (policies.vllm_versions.rules_of)
        if self.waiting_weight is not None:
            if rules.dp_inflight_score:
                raise ValueError(f"cluster.waiting_weight: vLLM {rules.version}'s front end has no waiting weight "
                                 "(it scores max(in-flight, waiting + running) since 0.27); set cluster.vllm_version "
                                 "to an older release, or leave the weight out")
            if isinstance(self.waiting_weight, bool) or not isinstance(self.waiting_weight, (int, float)) \
                    or not self.waiting_weight >= 0:
                raise ValueError(f"cluster.waiting_weight: expected a number >= 0, got {self.waiting_weight!r}")
        elif not rules.dp_inflight_score:
            object.__setattr__(self, "waiting_weight", VLLM_WAITING_WEIGHT)
        if not self.stats_interval_s > 0:
            raise ValueError(f"cluster.stats_interval_s: expected a number > 0, got {self.stats_interval_s!r}")
        if self.counts_published is not None and not isinstance(self.counts_published, bool):
            raise ValueError(f"cluster.counts_published: expected true or false, got {self.counts_published!r}")

    def describe(self) -> str:
        """What the routing of an answer rests on (experiments/answer_basis.py), in words."""
        rules = self.vllm_rules
        if self.counts_published is False:
            how = "its ranks publish no counts, so requests go round robin, blind to load"
        elif rules.dp_inflight_score:
            how = (f"max(in-flight, waiting + running) plus KV pressure on waiting, from {self.stats_interval_s:g} s "
                   "snapshots")
        else:
            how = f"waiting x {self.waiting_weight:g} + running, from {self.stats_interval_s:g} s snapshots"
        return f"vLLM {rules.version}'s DP front end ({how})"

    def route(self, spec: RequestSpec, replicas: Sequence[ReplicaLoad], num_routed: int) -> int:
        rules, seen = self.vllm_rules, self._published
        published = self.counts_published is not False
        interval = int(spec.arrival_s // (self.stats_interval_s if published else UNPUBLISHED_REPUBLISH_S))
        if seen.get("interval") != interval:
            seen["interval"] = interval
            seen["counts"] = {}
        counts = seen["counts"]
        for r in replicas:   # at a snapshot, and a replica it has not seen (an autoscaler's new one): its counts now
            if r.replica_id not in counts:
                counts[r.replica_id] = [r.num_waiting, r.num_running, r.kv_usage] if published else [0, 0, 0.0]
        n = len(replicas)
        start = seen.get("start", 0) % n if rules.dp_rotating_start else 0
        w = self.waiting_weight
        best, best_score = None, math.inf
        for i in range(n):
            r = replicas[(start + i) % n]
            waiting, running, kv_usage = counts[r.replica_id]
            if rules.dp_inflight_score:
                score = max(r.num_in_flight, waiting + running)
                if waiting:
                    score += waiting * VLLM_KV_WAITING_PENALTY * max(0.0, kv_usage - VLLM_KV_PENALTY_FROM)
            else:
                score = w * waiting + running
            if score < best_score:
                best, best_score = r.replica_id, score
        counts[best][0] += 1
        if rules.dp_rotating_start:
            seen["start"] = (start + 1) % n
        return best


# vLLM's DP front end (vllm/v1/engine/core_client.py): waiting x 4 + running before 0.27; from 0.27 a rank's
# waiting requests add 6 x (KV usage - 0.5) each once its KV is more than half full ("ramps from 0 at <=50%
# usage to 3x waiting at 100%", PR #49204)
VLLM_WAITING_WEIGHT = 4.0
VLLM_KV_WAITING_PENALTY = 6.0
VLLM_KV_PENALTY_FROM = 0.5
# vLLM's DP coordinator republishes its counts every 5 s while none changes (vllm/v1/engine/coordinator.py,
# its poll's timeout), which for ranks that publish none are zeros
UNPUBLISHED_REPUBLISH_S = 5.0


ROUTERS = {r.name: r for r in (RoundRobin, LeastOutstanding, LeastKVUsage, PrefixAffinity, LengthSplit, VllmDP)}

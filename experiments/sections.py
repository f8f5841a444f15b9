"""The sweep file's deployment sections around one engine: `cluster:` (replicas behind a router,
simcore/cluster.py), `disaggregation:` (prefill and decode pools, simcore/disagg.py) and `slo:` (per-request
limits for goodput). Each parser returns a frozen value or None when the section is absent."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from experiments.configcheck import ConfigError, check_keys, check_type, number
from policies.routers import ROUTERS
from policies.vllm_versions import MODELLED, dp_counts_published


@dataclass(frozen=True)
class ClusterSettings:
    """`cluster: {num_replicas: 4, router: round_robin, ...router knobs}` (policies/routers.py)."""
    num_replicas: int
    router: object


def _router(name: str, knobs: dict, engine_version: str, moe: bool):
    """Router `name` with `knobs`; one that imitates a vLLM release's front end (`vllm_dp`) runs the engine's
    release unless the file names one, and its ranks publish their counts as that release's do for the
    model (an MoE one: `moe`) unless the file says. ValueError names the key."""
    if name != "vllm_dp":
        return ROUTERS[name](**knobs)
    router = ROUTERS[name](**{"vllm_version": engine_version, **{k: v for k, v in knobs.items() if v is not None}})
    if router.counts_published is None:
        router = dataclasses.replace(router, counts_published=dp_counts_published(router.vllm_rules, moe))
    return router


def parse_cluster(spec, engine_version: str = MODELLED, moe: bool = False) -> ClusterSettings | None:
    """`engine_version`: the vLLM release the engine runs (policies.vllm_versions.rules_of); `moe`: whether
    the model is a mixture of experts."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError("cluster: expected a mapping with num_replicas and router")
    n = number("cluster.num_replicas", spec.get("num_replicas", 1), minimum=1, integer=True)
    name = spec.get("router", "round_robin")
    if name not in ROUTERS:
        raise ConfigError(f"cluster.router: unknown router {name!r}; known: {', '.join(ROUTERS)}")
    cls = ROUTERS[name]
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}   # knobs, not a router's memory
    knobs = {}
    for k, v in spec.items():
        if k in ("num_replicas", "router"):
            continue
        if k not in fields:
            raise ConfigError(f"cluster.{k}: not a knob of router {name}; "
                              f"expected {', '.join(sorted(fields)) or 'none'}")
        knobs[k] = check_type(f"cluster.{k}", v, fields[k].default)
    try:
        router = _router(name, knobs, engine_version, moe)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if name == "length_split" and router.num_long_replicas >= n:
        raise ConfigError(f"cluster.num_long_replicas: {router.num_long_replicas} leaves no replica for short "
                          f"requests among {n}")
    return ClusterSettings(n, router)


DISAGG_POLICIES = ("continuous", "chunked_prefill")  # policies whose decisions stay valid for handed-off requests


@dataclass(frozen=True)
class DisaggSettings:
    """`disaggregation: {num_prefill_replicas: 2, num_decode_replicas: 6, ...}` (simcore/disagg.py). Both
    pools run `engine.policy`; the prefill pool's engines hand every request off after its first token.
    `link_bandwidth_gb_per_s`: per GPU, GB = 1e9 bytes (50: one InfiniBand NDR 400 Gb/s NIC per GPU)."""
    num_prefill_replicas: int
    num_decode_replicas: int
    router: object                     # prefill pool, at arrival
    decode_router: object              # decode pool, at the hand-off
    link_bandwidth_gb_per_s: float = 50.0
    link_latency_s: float = 0.0005
    first_token_from: str = "prefill"  # or "decode" (simcore/disagg.py)


DISAGG_KEYS = {"num_prefill_replicas", "num_decode_replicas", "router", "decode_router",
               "link_bandwidth_gb_per_s", "link_latency_s", "first_token_from"}


def _pool_router(key: str, name, pool_size: int, engine_version: str, moe: bool):
    if name not in ROUTERS:
        raise ConfigError(f"{key}: unknown router {name!r}; known: {', '.join(ROUTERS)}")
    if name == "prefix_affinity":
        raise ConfigError(f"{key}: prefix_affinity needs prefix caching, which disaggregation does not model")
    if key.endswith("decode_router") and getattr(ROUTERS[name], "at_arrival_only", False):
        raise ConfigError(f"{key}: {name} routes at a request's arrival; the decode pool routes at the hand-off")
    router = _router(name, {}, engine_version, moe)
    if name == "length_split" and router.num_long_replicas >= pool_size:
        raise ConfigError(f"{key}: length_split needs more than {router.num_long_replicas} replicas in its pool")
    return router


def parse_disaggregation(spec, engine_version: str = MODELLED, moe: bool = False) -> DisaggSettings | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError("disaggregation: expected a mapping with num_prefill_replicas and num_decode_replicas")
    check_keys("disaggregation", spec, DISAGG_KEYS)
    sizes = [number(f"disaggregation.{k}", spec.get(k), minimum=1, integer=True)
             for k in ("num_prefill_replicas", "num_decode_replicas")]
    knobs = {k: number(f"disaggregation.{k}", spec[k], strict=k == "link_bandwidth_gb_per_s")
             for k in ("link_bandwidth_gb_per_s", "link_latency_s") if k in spec}
    first = spec.get("first_token_from", "prefill")
    if first not in ("prefill", "decode"):
        raise ConfigError(f"disaggregation.first_token_from: expected prefill or decode, got {first!r}")
    return DisaggSettings(
        sizes[0], sizes[1],
        router=_pool_router("disaggregation.router", spec.get("router", "least_outstanding"), sizes[0],
                            engine_version, moe),
        decode_router=_pool_router("disaggregation.decode_router", spec.get("decode_router", "least_outstanding"),
                                   sizes[1], engine_version, moe),
        first_token_from=first, **knobs)


@dataclass(frozen=True)
class SloSettings:
    """`slo: {ttft_ms: 400, tpot_ms: 40}`: per-request limits; a request is good when it finished and meets
    every one given (vllm bench serve `--goodput`; TPOT counts as 0 for one-token outputs)."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


def parse_slo(spec) -> SloSettings | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or not spec:
        raise ConfigError("slo: expected a mapping like {ttft_ms: 400, tpot_ms: 40}")
    check_keys("slo", spec, {f.name for f in dataclasses.fields(SloSettings)})
    return SloSettings(**{k: number(f"slo.{k}", v, strict=True) for k, v in spec.items()})

"""The sweep file: a strict loader from YAML mappings to resolved, typed point configurations.

Every unknown key or bad value raises `ConfigError` with a one-line message naming the dotted key.
Knob names and defaults follow vLLM where one exists (../shared/docs/engines.md section 1.3).
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from costmodels.catalog import (DTYPE_BYTES, GPU, MODELS, CatalogError, ModelShape, get_gpu, get_model,
                                with_max_model_len)
from costmodels.deployment import DEPLOYMENT_KEYS, Deployment, parse_deployment
from policies import POLICIES
from policies.routers import ROUTERS
from workloads.errors import WorkloadError, finite_number
from workloads.errors import check_keys as shared_check_keys
from workloads.synthetic import Workload, parse_workload


class ConfigError(ValueError):
    """A bad sweep file; the message names the offending key and fits on one line."""


TOP_KEYS = {"name", "description", "seeds", "model", "hardware", "tensor_parallel_size", "dtype", "profile",
            "engine", "workload", "grid", "cluster", "disaggregation", "slo",
            "search", "capacity"}  # validated by experiments.search / experiments.capacity; not part of a point
TOP_KEYS |= set(DEPLOYMENT_KEYS)  # precision and parallelism (issue 14): parsed by costmodels.deployment


@dataclass(frozen=True)
class EngineSettings:
    """Engine-level settings (not a policy's knobs)."""
    block_size: int = 16                  # vLLM CacheConfig.DEFAULT_BLOCK_SIZE
    gpu_memory_utilization: float = 0.9   # vLLM default
    num_gpu_blocks: int | None = None     # overrides the derived block count
    max_model_len: int | None = None      # overrides the model's limit
    preemption_mode: str = "recompute"    # vLLM V1 only recomputes; "swap" is vLLM V0's option
    swap_space_gb: float = 4.0            # vLLM V0 swap_space per GPU (GiB)
    check_invariants: bool = True
    enable_prefix_caching: bool = False   # vLLM's automatic prefix caching (on by default in V1; off here)
    fast_path: str = "auto"               # auto | on | off: the exact fast engine (experiments/fast.py)


ENGINE_KEYS = {f.name for f in dataclasses.fields(EngineSettings)}
POLICY_KEYS = {f.name for p in POLICIES.values() for f in dataclasses.fields(p)}


@dataclass(frozen=True)
class PointConfig:
    """One fully resolved simulation: everything `experiments.simulate` needs, no I/O left."""
    model: ModelShape
    gpu: GPU
    tensor_parallel_size: int
    dtype: str
    profile: str | None
    policy: object
    engine: EngineSettings
    workload: Workload
    unused_engine_keys: tuple[str, ...] = ()
    cluster: ClusterSettings | None = None  # None: one replica
    disaggregation: DisaggSettings | None = None  # None: co-located prefill and decode
    slo: SloSettings | None = None  # per-request SLOs for goodput (None: no goodput columns)
    deployment: Deployment | None = None  # precision and parallelism (None: bf16 at tensor_parallel_size)

    @property
    def num_gpus(self) -> int:
        per_replica = self.deployment.gpus_per_replica if self.deployment else self.tensor_parallel_size
        if self.disaggregation is not None:
            d = self.disaggregation
            return (d.num_prefill_replicas + d.num_decode_replicas) * per_replica
        return (self.cluster.num_replicas if self.cluster is not None else 1) * per_replica


@dataclass(frozen=True)
class ClusterSettings:
    """`cluster: {num_replicas: 4, router: round_robin, ...router knobs}` (policies/routers.py)."""
    num_replicas: int
    router: object


def parse_cluster(spec) -> ClusterSettings | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError("cluster: expected a mapping with num_replicas and router")
    n = number("cluster.num_replicas", spec.get("num_replicas", 1), minimum=1, integer=True)
    name = spec.get("router", "round_robin")
    if name not in ROUTERS:
        raise ConfigError(f"cluster.router: unknown router {name!r}; known: {', '.join(ROUTERS)}")
    cls = ROUTERS[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    knobs = {}
    for k, v in spec.items():
        if k in ("num_replicas", "router"):
            continue
        if k not in fields:
            raise ConfigError(f"cluster.{k}: not a knob of router {name}; "
                              f"expected {', '.join(sorted(fields)) or 'none'}")
        knobs[k] = _check_type(f"cluster.{k}", v, fields[k].default)
    try:
        router = cls(**knobs)
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


def _pool_router(key: str, name, pool_size: int):
    if name not in ROUTERS:
        raise ConfigError(f"{key}: unknown router {name!r}; known: {', '.join(ROUTERS)}")
    if name == "prefix_affinity":
        raise ConfigError(f"{key}: prefix_affinity needs prefix caching, which disaggregation does not model")
    router = ROUTERS[name]()
    if name == "length_split" and router.num_long_replicas >= pool_size:
        raise ConfigError(f"{key}: length_split needs more than {router.num_long_replicas} replicas in its pool")
    return router


def check_keys(section: str, spec, known) -> None:
    """Refuse any key of the `section:` mapping that is not in `known`, naming it and the known ones."""
    shared_check_keys(section, spec, known, ConfigError)


def number(key: str, v, **kw):
    """`workloads.errors.finite_number` raising ConfigError: the one number check of the sweep file."""
    return finite_number(key, v, error=ConfigError, **kw)


def check_tree(value, key: str = "", inf_ok: bool = False) -> None:
    """Refuse what no key of a sweep may hold, wherever it is: a mapping key that is not a string (YAML reads
    `on:`, `1:` or `true:` as a boolean or a number), NaN, and infinity except in an arrival rate
    (`rate_per_s: .inf` sends everything at t = 0). Each error names the dotted key."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                where = f"{key}." if key else ""
                raise ConfigError(f"{where}{k!r}: a key must be a string, got {type(k).__name__} {k!r} "
                                  "(YAML reads on/off/yes/no/true/false and numbers as such; quote it)")
            check_tree(v, f"{key}.{k}" if key else k, k.endswith("rate_per_s"))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_tree(v, f"{key}[{i}]", inf_ok)
    elif isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not inf_ok)):
        raise ConfigError(f"{key}: {value!r} is not allowed here (expected a finite number)")


_HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
             "num_kv_heads": "num_key_value_heads", "max_model_len": "max_position_embeddings"}


def check_model(model: ModelShape, source: str) -> None:
    """A model shape from a config.json must have positive integer sizes that divide as attention needs."""
    for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
              "max_model_len"):
        v = getattr(model, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"model: {source}: {_HF_NAMES.get(k, k)}: expected a positive integer, got {v!r}")
    for k in ("gated_mlp", "tie_embeddings"):
        if not isinstance(getattr(model, k), bool):
            raise ConfigError(f"model: {source}: {'tie_word_embeddings' if k == 'tie_embeddings' else k}: "
                              f"expected true or false, got {getattr(model, k)!r}")
    if model.num_heads % model.num_kv_heads:
        raise ConfigError(f"model: {source}: num_key_value_heads ({model.num_kv_heads}) must divide "
                          f"num_attention_heads ({model.num_heads})")
    if model.hidden_size < model.num_heads:
        raise ConfigError(f"model: {source}: hidden_size ({model.hidden_size}) is smaller than "
                          f"num_attention_heads ({model.num_heads})")


def parse_disaggregation(spec) -> DisaggSettings | None:
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
        router=_pool_router("disaggregation.router", spec.get("router", "least_outstanding"), sizes[0]),
        decode_router=_pool_router("disaggregation.decode_router", spec.get("decode_router", "least_outstanding"),
                                   sizes[1]),
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


def _check_type(key: str, value, default, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int) or (default is None and key.endswith(("num_gpu_blocks", "max_model_len"))):
        return number(key, value, integer=True)
    if isinstance(default, float):
        return number(key, value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def vllm_defaults(policy: str, gpu: GPU, max_model_len: int) -> dict:
    """vLLM 0.19 server defaults (`get_batch_defaults`): 1024 seqs / 8192 tokens on >= 70 GiB GPUs other
    than A100, else 256 / 2048. Without chunked prefill (V0 default) the budget is max(max_model_len, 2048)."""
    big = gpu.memory_bytes >= 70 * 1024**3 * 0.999 and not gpu.name.startswith("a100")
    if policy == "chunked_prefill":
        return {"max_num_seqs": 1024 if big else 256, "max_num_batched_tokens": 8192 if big else 2048}
    return {"max_num_seqs": 256, "max_num_batched_tokens": max(max_model_len, 2048)}


def _resolve_policy(engine: dict, gpu: GPU, max_model_len: int):
    name = engine.get("policy", "chunked_prefill")
    if name not in POLICIES:
        raise ConfigError(f"engine.policy: unknown policy {name!r}; known: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = {k: v for k, v in vllm_defaults(name, gpu, max_model_len).items() if k in fields}
    knobs = {}
    for k, f in fields.items():
        if k in engine:
            knobs[k] = _check_type(f"engine.{k}", engine[k], f.default)
        elif k in defaults:
            knobs[k] = defaults[k]
    if "max_num_batched_tokens" in fields and "max_num_seqs" not in engine:
        knobs["max_num_seqs"] = min(knobs["max_num_seqs"], knobs["max_num_batched_tokens"])  # as vLLM
    for k in ("max_num_seqs", "max_num_batched_tokens"):
        if k in knobs and knobs[k] < 1:
            raise ConfigError(f"engine.{k}: must be at least 1")
    if knobs.get("max_num_batched_tokens", math.inf) < knobs.get("max_num_seqs", 0):
        raise ConfigError(f"engine.max_num_batched_tokens ({knobs['max_num_batched_tokens']}) must be >= "
                          f"engine.max_num_seqs ({knobs['max_num_seqs']}), as vLLM requires")
    if name == "continuous" and knobs["max_num_batched_tokens"] < max_model_len:
        raise ConfigError(f"engine.max_num_batched_tokens ({knobs['max_num_batched_tokens']}) < max_model_len "
                          f"({max_model_len}): without chunked prefill a long prompt could never be scheduled "
                          "(vLLM refuses this too); raise it or lower engine.max_model_len")
    try:
        policy = cls(**knobs)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    unused = tuple(sorted(k for k in engine if k in POLICY_KEYS and k not in fields))
    return policy, unused


def resolve_point(raw: dict) -> PointConfig:
    """Turn one point's mapping (a base config with grid values applied) into a PointConfig."""
    if not isinstance(raw, dict):
        raise ConfigError("the sweep file must be a YAML mapping")
    check_tree(raw)
    for k in raw:
        if k not in TOP_KEYS:
            raise ConfigError(f"{k}: unknown top-level key; expected one of {', '.join(sorted(TOP_KEYS))}")
    for k in ("model", "hardware"):
        if not isinstance(raw.get(k, ""), str):
            raise ConfigError(f"{k}: expected a name{' or a config.json path' if k == 'model' else ''}, "
                              f"got {raw[k]!r}")
    try:
        model = get_model(raw.get("model", "llama-3-8b"))
    except CatalogError as e:
        raise ConfigError(f"model: {e}") from None
    if model.name not in MODELS or MODELS[model.name] is not model:
        check_model(model, raw["model"])
    try:
        gpu = get_gpu(raw.get("hardware", "h100-sxm"))
    except CatalogError as e:
        raise ConfigError(f"hardware: {e}") from None
    try:
        deployment = parse_deployment(raw, model, DTYPE_BYTES)
    except CatalogError as e:
        raise ConfigError(str(e)) from None
    tp, dtype = deployment.tensor_parallel_size, deployment.dtype
    profile = raw.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"profile: expected a profile name or path, got {profile!r}")
    engine = raw.get("engine", {}) or {}
    if not isinstance(engine, dict):
        raise ConfigError("engine: expected a mapping")
    if isinstance(engine.get("fast_path"), bool):  # YAML reads `fast_path: on` as true: a switch, so accept it
        engine = {**engine, "fast_path": "on" if engine["fast_path"] else "off"}
    for k in engine:
        if k != "policy" and k not in ENGINE_KEYS and k not in POLICY_KEYS:
            raise ConfigError(f"engine.{k}: unknown key; engine keys are policy, "
                              f"{', '.join(sorted(ENGINE_KEYS | POLICY_KEYS))}")
    settings = EngineSettings(**{k: _check_type(f"engine.{k}", engine[k], f.default,
                                                allow_none=f.default is None)
                                 for k, f in ((f.name, f) for f in dataclasses.fields(EngineSettings))
                                 if k in engine})
    if settings.block_size < 1:
        raise ConfigError("engine.block_size: must be at least 1")
    if not 0 < settings.gpu_memory_utilization <= 1:
        raise ConfigError(f"engine.gpu_memory_utilization: must be in (0, 1], got {settings.gpu_memory_utilization}")
    if settings.preemption_mode not in ("recompute", "swap"):
        raise ConfigError(f"engine.preemption_mode: expected recompute or swap, got {settings.preemption_mode!r}")
    if settings.fast_path not in ("auto", "on", "off"):
        raise ConfigError(f"engine.fast_path: expected auto, on or off, got {settings.fast_path!r}")
    if settings.max_model_len is not None:
        if settings.max_model_len < 2:
            raise ConfigError("engine.max_model_len: must be at least 2")
        model = with_max_model_len(model, settings.max_model_len)
    if settings.num_gpu_blocks is not None and settings.num_gpu_blocks < 1:
        raise ConfigError("engine.num_gpu_blocks: must be at least 1")
    policy, unused = _resolve_policy(engine, gpu, model.max_model_len)
    if settings.enable_prefix_caching:
        if not getattr(policy, "supports_prefix_caching", False):
            raise ConfigError(f"engine.enable_prefix_caching: policy {policy.name} has no prefix caching")
        if settings.preemption_mode != "recompute":
            raise ConfigError("engine.enable_prefix_caching: needs engine.preemption_mode recompute (as vLLM V1)")
    try:
        workload = parse_workload(raw.get("workload"))
    except WorkloadError as e:
        raise ConfigError(str(e)) from None
    disagg = parse_disaggregation(raw.get("disaggregation"))
    if disagg is not None:
        if raw.get("cluster") is not None:
            raise ConfigError("disaggregation: set either cluster (co-located replicas) or disaggregation, not both")
        if policy.name not in DISAGG_POLICIES:
            raise ConfigError(f"disaggregation: engine.policy {policy.name} is not supported; "
                              f"use one of {', '.join(DISAGG_POLICIES)}")
        if settings.enable_prefix_caching:
            raise ConfigError("disaggregation: engine.enable_prefix_caching is not modelled with disaggregation")
    return PointConfig(model, gpu, tp, dtype, profile, policy, settings, workload, unused,
                       parse_cluster(raw.get("cluster")), disagg, parse_slo(raw.get("slo")), deployment)


# ---- sweeps ----

MAX_POINTS = 100_000  # every point is resolved and kept up front; beyond this a sweep file is a mistake


@dataclass(frozen=True)
class Point:
    index: int
    grid_values: dict
    seed: int
    raw: dict          # the base mapping with this point's grid values applied
    config: PointConfig

    @property
    def point_id(self) -> str:
        return f"p{self.index:03d}-seed{self.seed}"


def set_dotted(d: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        if not isinstance(d.get(p, {}), dict):
            raise ConfigError(f"grid.{dotted}: {p} is not a mapping")
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def expand(sweep: dict) -> list[Point]:
    """Cartesian product of `grid` over `seeds`; every point resolved (so any error shows up front)."""
    if not isinstance(sweep, dict):
        raise ConfigError("the sweep file must be a YAML mapping")
    check_tree(sweep)
    grid = sweep.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError("grid: expected a mapping of dotted keys to lists of values")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"grid.{k}: expected a non-empty list of values")
        if not all(k.split(".")):
            raise ConfigError(f"grid.{k}: expected a dotted key like workload.arrival.rate_per_s")
        if k.split(".")[0] in ("grid", "seeds", "name", "description", "search", "capacity"):
            raise ConfigError(f"grid.{k}: cannot be swept")
        if k.split(".")[0] not in TOP_KEYS:
            raise ConfigError(f"grid.{k}: {k.split('.')[0]} is not a top-level key; expected one of "
                              f"{', '.join(sorted(TOP_KEYS - {'grid', 'seeds', 'name', 'description'}))}")
    seeds = sweep.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"seeds: expected a list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: a seed is repeated in {seeds} (its points would overwrite each other)")
    num_points = math.prod(len(v) for v in grid.values()) * len(seeds)
    if num_points > MAX_POINTS:
        raise ConfigError(f"grid: {num_points:,} points (grid combinations x seeds); a sweep runs at most "
                          f"{MAX_POINTS:,}: split it or sweep fewer values")
    base = {k: v for k, v in sweep.items() if k not in ("grid", "seeds", "search", "capacity")}
    points = []
    keys = list(grid)
    for i, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
        raw = copy.deepcopy(base)
        values = dict(zip(keys, combo))
        for k, v in values.items():
            set_dotted(raw, k, copy.deepcopy(v))  # a mapping swept whole must not be shared between points
        try:
            cfg = resolve_point(raw)
        except ConfigError as e:
            where = ", ".join(f"{k}={v}" for k, v in values.items())
            raise ConfigError(f"{e} (grid point {where})" if where else str(e)) from None
        for seed in seeds:
            points.append(Point(i, values, seed, raw, cfg))
    return points


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base loader says so
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_sweep_file(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such sweep file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the sweep file ({getattr(e, 'strerror', None) or e.__class__.__name__})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    resolve_relative_paths(data, path.parent)
    return data


def resolve_relative_paths(sweep: dict, base_dir: Path) -> None:
    """Make a relative `workload.trace.path` (also in `grid`) relative to the sweep file's folder, so a
    sweep runs the same from any working directory. Mutates `sweep`."""
    def fix(trace) -> None:
        if isinstance(trace, dict) and isinstance(trace.get("path"), str) and not Path(trace["path"]).is_absolute():
            trace["path"] = str((base_dir / trace["path"]).resolve())

    workload = sweep.get("workload")
    if isinstance(workload, dict):
        fix(workload.get("trace"))
    grid = sweep.get("grid")
    if isinstance(grid, dict):
        for k, values in grid.items():
            if isinstance(values, list) and k in ("workload.trace.path", "workload.trace", "workload"):
                for i, v in enumerate(values):
                    if k == "workload.trace.path" and isinstance(v, str) and not Path(v).is_absolute():
                        values[i] = str((base_dir / v).resolve())
                    elif k == "workload.trace":
                        fix(v)
                    elif isinstance(v, dict):
                        fix(v.get("trace"))

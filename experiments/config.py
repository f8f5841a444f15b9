"""The sweep file: a strict loader from YAML mappings to resolved, typed point configurations.

Every unknown key or bad value raises `ConfigError` with a one-line message naming the dotted key. This module
resolves one point (`resolve_point`) and expands a grid (`expand`); the sections live beside it:
`engine:` in experiments/engine_config.py (knob names and defaults follow vLLM where one exists,
docs/engines.md section 1.3), `cluster:`, `disaggregation:` and `slo:` in experiments/sections.py, reading the
file in experiments/sweepfile.py, the shared checks in experiments/configcheck.py.
"""
from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass

from costmodels.catalog import (DTYPE_BYTES, GPU, MODELS, CatalogError, ModelShape, get_gpu, get_model,  # noqa: F401
                                with_max_model_len)
from costmodels.deployment import DEPLOYMENT_KEYS, Deployment, parse_deployment
from costmodels.gpuspec import parse_gpu
from experiments.configcheck import ConfigError, check_keys, check_tree, number  # noqa: F401 (re-exported)
from experiments.engine_config import (EngineSettings, check_engine_rules, parse_engine_settings,
                                       resolve_policy)
from experiments.autoscaling_config import parse_autoscaling
from experiments.gateway_config import parse_gateway
from experiments.speculative_config import check_speculative
from experiments.offload_config import check_offload
from policies.vllm_versions import rules_of
from simcore.dp_lockstep import dp_group_size
from simcore.gateway import GatewayLimits
from experiments.sections import (DISAGG_POLICIES, ClusterSettings, DisaggSettings, SloSettings, parse_cluster,
                                  parse_disaggregation, parse_slo)
from experiments.sweepfile import load_sweep_file, resolve_relative_paths  # noqa: F401 (re-exported)
from workloads.errors import WorkloadError
from workloads.synthetic import Workload, parse_workload

TOP_KEYS = {"name", "description", "seeds", "model", "hardware", "tensor_parallel_size", "dtype", "profile",
            "engine", "workload", "grid", "cluster", "disaggregation", "slo", "gateway", "autoscaling",
            "search", "capacity"}  # validated by experiments.search / experiments.capacity_plan; not part of a point
TOP_KEYS |= set(DEPLOYMENT_KEYS)  # precision and parallelism: parsed by costmodels.deployment


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
    cluster: ClusterSettings | None = None  # None: one replica
    disaggregation: DisaggSettings | None = None  # None: co-located prefill and decode
    slo: SloSettings | None = None  # per-request SLOs for goodput (None: no goodput columns)
    deployment: Deployment | None = None  # precision and parallelism (None: bf16 at tensor_parallel_size)
    gateway: GatewayLimits | None = None  # admission control ahead of each replica (None: none)
    autoscaling: dict | None = None  # experiments/autoscaling_config.py's checked values (None: fixed replicas)

    @property
    def num_gpus(self) -> int:
        per_replica = self.deployment.gpus_per_replica if self.deployment else self.tensor_parallel_size
        if self.disaggregation is not None:
            d = self.disaggregation
            return (d.num_prefill_replicas + d.num_decode_replicas) * per_replica
        return (self.cluster.num_replicas if self.cluster is not None else 1) * per_replica


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


def _model_and_gpu(raw: dict) -> tuple[ModelShape, GPU]:
    if not isinstance(raw.get("model", ""), str):
        raise ConfigError(f"model: expected a name or a config.json path, got {raw['model']!r}")
    try:
        model = get_model(raw.get("model", "llama-3-8b"))
    except CatalogError as e:
        raise ConfigError(f"model: {e}") from None
    if model.name not in MODELS or MODELS[model.name] is not model:
        check_model(model, raw["model"])
    try:   # a catalog name, a mapping of datasheet figures, or a YAML/JSON file of them
        return model, parse_gpu(raw.get("hardware", "h100-sxm"))
    except CatalogError as e:
        raise ConfigError(str(e)) from None


def _engine(raw: dict, model: ModelShape, gpu: GPU):
    """(model with engine.max_model_len applied, policy, engine settings) from the `engine:` section."""
    engine = raw.get("engine", {}) or {}
    if not isinstance(engine, dict):
        raise ConfigError("engine: expected a mapping")
    if isinstance(engine.get("fast_path"), bool):  # YAML reads `fast_path: on` as true: a switch, so accept it
        engine = {**engine, "fast_path": "on" if engine["fast_path"] else "off"}
    settings = parse_engine_settings(engine)
    if settings.max_model_len is not None:
        model = with_max_model_len(model, settings.max_model_len)
    policy = resolve_policy(engine, gpu, model.max_model_len)
    check_engine_rules(settings, policy)
    return model, policy, settings


def resolve_point(raw: dict) -> PointConfig:
    """Turn one point's mapping (a base config with grid values applied) into a PointConfig."""
    if not isinstance(raw, dict):
        raise ConfigError("the sweep file must be a YAML mapping")
    check_tree(raw)
    for k in raw:
        if k not in TOP_KEYS:
            raise ConfigError(f"{k}: unknown top-level key; expected one of {', '.join(sorted(TOP_KEYS))}")
    model, gpu = _model_and_gpu(raw)
    try:
        deployment = parse_deployment(raw, model, DTYPE_BYTES)
    except CatalogError as e:
        raise ConfigError(str(e)) from None
    profile = raw.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"profile: expected a profile name or path, got {profile!r}")
    model, policy, settings = _engine(raw, model, gpu)
    try:
        workload = parse_workload(raw.get("workload"))
    except WorkloadError as e:
        raise ConfigError(str(e)) from None
    engine_release = rules_of(policy).version   # what a vLLM front end's router imitates (vllm_dp)
    disagg = parse_disaggregation(raw.get("disaggregation"), engine_release, model.is_moe)
    if disagg is not None:
        if raw.get("cluster") is not None:
            raise ConfigError("disaggregation: set either cluster (co-located replicas) or disaggregation, not both")
        if policy.name not in DISAGG_POLICIES:
            raise ConfigError(f"disaggregation: engine.policy {policy.name} is not supported; "
                              f"use one of {', '.join(DISAGG_POLICIES)}")
        if settings.enable_prefix_caching:
            raise ConfigError("disaggregation: engine.enable_prefix_caching is not modelled with disaggregation")
    gateway = parse_gateway(raw.get("gateway"))
    if gateway is not None and disagg is not None:
        raise ConfigError("gateway: not modelled with disaggregation (put it in front of a co-located deployment)")
    if gateway is not None and deployment.pipeline_parallel_size > 1:
        raise ConfigError("gateway: not modelled with pipeline parallelism (pipeline_parallel_size > 1)")
    if settings.kv_offload is not None:
        check_offload(settings.kv_offload, settings.block_size, settings.enable_prefix_caching,
                      gpu.host_memory_bytes, deployment.gpus_per_replica, gpu.name,
                      gateway is not None and gateway.has_deadlines)
    autoscaling = parse_autoscaling(raw.get("autoscaling"), raw.get("cluster"))
    if autoscaling is not None and (disagg is not None or deployment.pipeline_parallel_size > 1):
        raise ConfigError("autoscaling: not modelled with disaggregation or pipeline parallelism")
    check_speculative(settings.speculative, policy, settings, disagg is not None, deployment.pipeline_parallel_size)
    cluster = parse_cluster(raw.get("cluster"), engine_release, model.is_moe)
    group = dp_group_size(model.is_moe, deployment.data_parallel_size)
    if cluster is not None and autoscaling is None and group > 1 and cluster.num_replicas % group:
        raise ConfigError(f"cluster.num_replicas: {cluster.num_replicas} is not a whole number of DP groups of "
                          f"data_parallel_size {group}: the DP ranks of an MoE model step together "
                          "(simcore/dp_lockstep.py)")
    return PointConfig(model, gpu, deployment.tensor_parallel_size, deployment.dtype, profile, policy, settings,
                       workload, cluster, disagg, parse_slo(raw.get("slo")), deployment,
                       gateway, autoscaling)


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

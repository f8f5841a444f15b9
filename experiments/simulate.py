"""Wire one resolved point together (workload -> engine with policy and cost model) and run it."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

from costmodels import load_cost_model
from costmodels.basis import cost_model_basis
from costmodels import deployment
from costmodels.deployment import Deployment
from costmodels.frontend import NONE as NO_FRONTEND, FrontendLatency, frontend_of
from costmodels.roofline import RooflineCostModel
from experiments import disaggregation
from experiments.answer_basis import router_basis_column
from experiments.config import PointConfig, resolve_point
from experiments.fast import empty_iterations, lockstep_group_size, run_fast, use_fast_path
from experiments.speculative_config import speculation_for
from simcore.speculative import summary_keys as speculative_keys
from experiments.kv_groups import bytes_per_block, point_kv_groups
from experiments.fast import num_replicas as fast_replicas
from experiments.binding_streamed import iteration_chunks
from experiments.tables import TableWriter, write_run_tables
from policies.vllm_versions import rules_of
from simcore.api_server import APIServerQueue
from simcore.async_scheduling import async_scheduling_of
from simcore.dp_lockstep import lockstep_groups
from simcore.cluster import Cluster
from simcore.costmodel import ConstantCost
from simcore.engine import Engine, EngineLimits, SimulationError
from simcore.gateway import gateway_counts
from experiments.autoscaling_run import autoscaled_cluster, autoscaling_keys
from simcore.kvcache import MemoryPlan, num_usable_blocks, plan_memory, prefix_cache_stats
from simcore.log import EngineLog
from simcore.metrics import (client_view, cluster_summary, flag_words, goodput_stats,
                             iterations_frame, load_stats, meets_slo, rejected_reasons, replicas_frame,
                             requests_frame, summarize)
from simcore.pipeline import PipelinedEngine, add_pipeline_results, pipeline_error
from simcore.wiring import on_done_of, start_arrivals
from workloads.synthetic import GeneratedRequests, describe_workload, generate


@dataclass
class SimResult:
    """Everything one simulation produced, as pandas tables (for notebooks) and a flat summary."""
    requests: pd.DataFrame     # one row per request
    iterations: pd.DataFrame   # one row per engine iteration
    summary: dict              # the results.csv row (metrics)
    resolved: dict             # the configuration actually simulated, defaults filled in
    replicas: pd.DataFrame | None = None  # one row per replica, for a cluster (cluster.num_replicas > 1)
                                          # or a disaggregated deployment (with a `role` column)
    itl_gaps_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # every token gap, pooled, in order
    itl_end_s: np.ndarray = field(default_factory=lambda: np.zeros(0))   # when each of those gaps ended
    tables_saved: bool = False  # the big tables went straight to `simulate(tables_dir=...)`; the frames
                                # and ITL here are then empty (a point of a sweep saved to disk)


class _TimedGaps(list):
    """Stands in for `EngineLog.itl_gaps_s` and also notes when each gap ended, so that a steady-state
    window can be cut out of the pooled ITL (experiments.search) without touching the engine."""

    def __init__(self, env: simpy.Environment):
        super().__init__()
        self.env, self.end_s = env, []

    def append(self, gap_s: float) -> None:
        super().append(gap_s)
        self.end_s.append(self.env.now)


def point_cost_model(cfg: PointConfig):
    """`profile: "constant:per_step_s=0.01,per_token_s=1e-5"` injects the constant-cost stub (answers known
    by hand, used by the search tests); anything else to costmodels.selection."""
    if cfg.profile is not None and cfg.profile.split(":")[0] == "constant":
        params = {}
        for item in filter(None, cfg.profile.partition(":")[2].split(",")):
            k, _, v = item.partition("=")
            try:
                params[k.strip()] = float(v)
            except ValueError:
                raise SimulationError(f"profile: bad constant-cost parameter {item!r}") from None
        if not set(params) <= {"per_step_s", "per_token_s"}:
            raise SimulationError(f"profile: constant cost takes per_step_s and per_token_s, got {cfg.profile!r}")
        return ConstantCost(**params)
    return load_cost_model(cfg.profile, cfg.model, cfg.gpu, cfg.tensor_parallel_size, cfg.dtype,
                           deployment=cfg.deployment)


def memory_plan(cfg: PointConfig) -> MemoryPlan:
    d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
    p = cfg.policy
    budget = getattr(p, "max_num_batched_tokens", cfg.model.max_model_len)
    seqs = getattr(p, "max_num_seqs", 256)
    groups = point_kv_groups(cfg)   # vLLM's hybrid KV cache manager, where it runs
    try:
        return plan_memory(
            gpu_memory_bytes=cfg.gpu.memory_bytes, gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
            weight_bytes=deployment.weight_bytes_per_gpu(cfg.model, d, cfg.gpu),
            kv_bytes_per_token=deployment.kv_bytes_per_token(cfg.model, d),
            block_size=cfg.engine.block_size,
            activation_reserve_bytes=deployment.activation_reserve_bytes(cfg.model, d, budget, seqs),
            num_gpu_blocks=cfg.engine.num_gpu_blocks, kv_groups=groups,
            bytes_per_block=bytes_per_block(cfg, groups) if groups is not None else None)
    except ValueError as e:
        raise SimulationError(f"engine: {e}") from None


def check_runnable(cfg: PointConfig) -> None:
    """Raise now what `simulate` would refuse before its first step: no room for the KV cache, a profile
    that cannot be loaded, a pipeline-parallel layout that is not modelled, `fast_path: on` where the fast
    path cannot run (experiments/fast.py says why)."""
    memory_plan(cfg)
    pipeline_stages(cfg, point_cost_model(cfg))
    use_fast_path(cfg, ())


# vLLM's schedulers; the others' engines pipeline differently (TRT-LLM, SGLang) or not at all (TGI).
PIPELINE_POLICIES = ("chunked_prefill", "continuous")


def pipeline_stages(cfg: PointConfig, cost_model) -> int:
    """`pipeline_parallel_size` of the point (1 without a deployment); a layout the pipelined engine
    (simcore/pipeline.py) does not model, or a cost model that cannot price its stages, is one line."""
    pp = cfg.deployment.pipeline_parallel_size if cfg.deployment is not None else 1
    if pp > 1:
        if cfg.policy.name not in PIPELINE_POLICIES:
            raise SimulationError(f"pipeline_parallel_size: {pp} is modelled for the vLLM policies "
                                  f"({', '.join(PIPELINE_POLICIES)}), not {cfg.policy.name}")
        error = pipeline_error(pp, cfg.policy, cost_model, cfg.engine.preemption_mode,
                               cfg.engine.enable_prefix_caching, cfg.disaggregation is not None)
        if error:   # the pipelined engine's own rule, checked before anything runs
            raise SimulationError(error)
    return pp


def resolved_dict(cfg: PointConfig, plan: MemoryPlan, cost: dict, seed: int) -> dict:
    w = cfg.workload
    return {
        "seed": seed, "model": dataclasses.asdict(cfg.model), "hardware": dataclasses.asdict(cfg.gpu),
        "tensor_parallel_size": cfg.tensor_parallel_size, "dtype": cfg.dtype,
        **({"deployment": dataclasses.asdict(cfg.deployment)} if cfg.deployment else {}),
        "engine": {"policy": cfg.policy.name, **dataclasses.asdict(cfg.policy), **dataclasses.asdict(cfg.engine)},
        "memory": {**dataclasses.asdict(plan), "kv_capacity_tokens": plan.kv_capacity_tokens},
        "cost_model": cost,
        "workload": describe_workload(w),
        **({"cluster": {"num_replicas": cfg.cluster.num_replicas, "router": cfg.cluster.router.name,
                        **dataclasses.asdict(cfg.cluster.router)}} if cfg.cluster is not None else {}),
        **(disaggregation.resolved_keys(cfg) if cfg.disaggregation is not None else {}),
        **({"slo": dataclasses.asdict(cfg.slo)} if cfg.slo is not None else {}),
        **({"gateway": dataclasses.asdict(cfg.gateway)} if cfg.gateway is not None else {}),
        **({"autoscaling": cfg.autoscaling} if cfg.autoscaling is not None else {}),
    }


def simulate(config: PointConfig | dict, seed: int = 0, specs=None, cost_model=None, tables_dir=None,
             table_format: str = "parquet") -> SimResult:
    """Run one simulation. `config` is a resolved PointConfig or a sweep-style mapping without `grid`.
    `specs` (RequestSpecs sorted by arrival) replays exactly those requests instead of drawing the
    workload's, and `cost_model` (a cost-model value) replaces the configured one: calibration.compare and
    fidelity.fit_engine replay a real run's requests this way. `tables_dir`: a fast-path run writes its
    tables there (iteration rows streamed as the run goes, experiments/tables.py) and returns a SimResult
    without them (`tables_saved`); the SimPy engine ignores it (the caller saves its tables)."""
    cfg = config if isinstance(config, PointConfig) else resolve_point(config)
    plan = memory_plan(cfg)
    cost_model = as_scheduled(cfg, point_cost_model(cfg) if cost_model is None else cost_model)
    frontend = cfg.engine.frontend or frontend_of(cost_model)
    gen = (generate(cfg.workload, seed, cfg.model.max_model_len, plan.block_size) if specs is None
           else GeneratedRequests(tuple(specs), 0, 0))
    cfg = with_request_latency(cfg, frontend, gen.specs)
    limits = engine_limits(cfg, plan, cost_model)
    if cfg.engine.speculative is not None:   # simcore/speculative.py: the draws, the drafter, the counters
        limits = dataclasses.replace(limits, speculative=speculation_for(cfg, cost_model, seed))
    num_stages = pipeline_stages(cfg, cost_model)
    if use_fast_path(cfg, gen.specs):   # same results, without SimPy (experiments/fast.py; never with stages)
        handed = [gen.specs]   # handed over: freed when the engine is done (specs=None: nobody else holds them)
        gen = dataclasses.replace(gen, specs=())
        return _fast_result(cfg, plan, cost_model, gen, limits, seed, frontend, tables_dir, table_format, handed)
    env = simpy.Environment()
    log = EngineLog()
    log.itl_gaps_s = _TimedGaps(env)
    # A cluster (simcore/cluster.py): N identical replicas sharing the log, behind the router.
    num_replicas = cfg.cluster.num_replicas if cfg.cluster is not None else 1
    disagg = None
    if cfg.disaggregation is not None:  # prefill and decode pools (simcore/disagg.py)
        disagg = disaggregation.build(env, cfg, cost_model, limits, log, plan.kv_bytes_per_token)
        engines = disagg.prefill + disagg.decode
        num_replicas = len(engines)
        submit = disagg.submit
    else:
        if num_stages > 1:   # microbatches in flight through the stages (simcore/pipeline.py)
            engines = [PipelinedEngine(env, cfg.policy, cost_model, limits, log, replica_id=i, num_stages=num_stages)
                       for i in range(num_replicas)]
        else:
            if cfg.autoscaling is not None:   # every replica it may start, idle until it does
                num_replicas = cfg.autoscaling["max_replicas"]
            engines = [Engine(env, cfg.policy, cost_model, limits, log, replica_id=i) for i in range(num_replicas)]
            lockstep_groups(env, engines, lockstep_group_size(cfg))   # an MoE model's DP ranks step together
        if cfg.autoscaling is not None:   # simcore/autoscaler.py
            scaler = autoscaled_cluster(cfg, engines, len(gen.specs))
            submit = scaler.submit
        else:
            submit = engines[0].submit if num_replicas == 1 else Cluster(engines, cfg.cluster.router).submit
    engine = engines[0]
    arrival = cfg.workload.arrival
    closed = (arrival.concurrency, arrival.think_time_s) if arrival.is_closed else None
    connect = disagg.chain_on_done if disagg is not None else on_done_of(engines)
    start_arrivals(env, gen.specs, submit, connect, closed)
    env.run()
    if len(log.requests) != len(gen.specs):
        stuck = len(gen.specs) - len(log.requests)
        raise SimulationError(f"{cfg.policy.name}: {stuck} requests never finished (engine stalled at "
                              f"t={env.now:.3f}s with {sum(len(e.waiting) for e in engines)} waiting, "
                              f"{sum(len(e.running) for e in engines)} running)")
    iterations = iterations_frame(log)
    requests, queue_keys = with_frontend(requests_frame(log), frontend, None if disagg is not None else iterations,
                                         limits)
    usable = num_usable_blocks(plan.num_gpu_blocks)  # KV usage over what requests can hold, as vLLM reports it
    requests, summary, replicas = pooled_results(cfg, requests, iterations, log.itl_gaps_s, usable, num_replicas,
                                                 disagg)
    summary.update(queue_keys)
    if num_stages > 1:   # bubble columns and pipeline keys; time-weighted keys without double counting
        add_pipeline_results(engines, iterations, summary, replicas, usable)
    if limits.speculative is not None:   # the replicas' shared counters (simcore/speculative.py)
        summary.update(speculative_keys(limits.speculative.counters))
    run_keys(cfg, plan, cost_model, gen, requests, summary)
    if engine.prefix_cache is not None:
        add_prefix_cache_stats(summary, requests, [e.prefix_cache for e in engines])
    add_binding(cfg, plan, requests, iterations, summary)
    if cfg.autoscaling is not None:
        add_autoscaling_keys(cfg, scaler, requests, summary)
    return SimResult(requests, iterations, summary,
                     resolved_dict(cfg, plan, described(cost_model, frontend), seed), replicas,
                     np.asarray(log.itl_gaps_s, dtype=float), np.asarray(log.itl_gaps_s.end_s, dtype=float))


def add_autoscaling_keys(cfg: PointConfig, scaler, requests: pd.DataFrame, summary: dict) -> None:
    """The autoscaler's results-row keys (experiments/autoscaling_run.py), in place."""
    per_replica = cfg.deployment.gpus_per_replica if cfg.deployment else cfg.tensor_parallel_size
    summary.update(autoscaling_keys(scaler, requests, cfg.autoscaling.get("gpu_price_per_hour"), per_replica))


def pooled_results(cfg: PointConfig, requests: pd.DataFrame, iterations: pd.DataFrame, itl, usable: int,
                   num_replicas: int, disagg) -> tuple[pd.DataFrame, dict, pd.DataFrame | None]:
    """Both engines' summary over all replicas' pooled tables, and a cluster's or a disaggregated deployment's
    (`disagg`: its hand-offs) per-replica table and keys: (requests, summary, replicas). A disaggregated
    deployment's requests gain their hand-off columns and its iterations (in place) a `role`."""
    summary = summarize(requests, iterations, itl, usable * num_replicas)
    replicas = None
    if disagg is not None:
        requests = disaggregation.add_handoff_columns(requests, disagg)
        iterations["role"] = [disaggregation.role_of(r, len(disagg.prefill)) for r in iterations["replica_id"]]
        replicas = disaggregation.replicas_by_role(requests, iterations, usable,
                                                   len(disagg.prefill), len(disagg.decode))
        summary.update(disaggregation.summary_keys(requests, replicas, disagg, cfg))
    elif num_replicas > 1:
        replicas = replicas_frame(requests, iterations, usable, num_replicas)
        router = cfg.cluster.router if cfg.cluster is not None else None
        summary.update(cluster_summary(summary, replicas), router=router.name if router is not None else "round_robin",
                       **router_basis_column(router))
    return requests, summary, replicas


# The iteration columns the API server's queue reads (simcore/api_server.py)
STEP_FRAMES = ["start_s", "duration_s", "decode_tokens", "replica_id"]


def with_frontend(requests: pd.DataFrame, frontend: FrontendLatency, steps=None,
                  limits: EngineLimits | None = None) -> tuple[pd.DataFrame, dict]:
    """(the request table as the client sees it, the API server's summary keys). Each request's front-end
    time (its prompt's) is added to its first token and its finish, so TTFT and E2E grow by it and TPOT and
    ITL do not. With `steps` (the iterations, a frame or frames in order) and a front end whose API-server CPU
    is known, each request also waits in its replica's API server (simcore/api_server.py): at admission,
    behind its step's other chunks for its first token and at its last (the two differ, so a client's TPOT
    moves a little with them); the keys are then `api_server_wait_mean_ms`, the finished requests' mean wait
    to their first token, and `api_server_busy`, the busiest replica's server's share of time spent
    (APIServerQueue.busy). `limits`: the run's engine limits (its speculation's drafts per verification, and
    async scheduling's lag before an arrival's first step)."""
    if frontend.is_zero:
        return requests, {}
    latency = (frontend.fixed_s if frontend.per_prompt_token_s == 0
               else frontend.latency_s(requests["prompt_tokens"].to_numpy(dtype=float)))
    if steps is None or not frontend.has_server_cpu or not len(requests):
        return client_view(requests, latency), {}
    spec = limits.speculative if limits is not None else None
    queue = APIServerQueue(requests, frontend.cpu_per_request_s, frontend.cpu_per_chunk_s, frontend.api_servers,
                           drafts_per_step=spec.num_speculative_tokens if spec is not None else 0,
                           async_lag=2 if limits is None or limits.async_scheduling else 1)
    for frame in ([steps] if isinstance(steps, pd.DataFrame) else steps):
        queue.add_steps(frame)
    first, last = queue.waits()
    fin = (requests["status"] == "finished").to_numpy()
    keys = {"api_server_busy": queue.busy(),
            "api_server_wait_mean_ms": float(first[fin].mean() * 1e3) if fin.any() else math.nan}
    return client_view(requests, latency + first, latency + last), keys


def described(cost_model, frontend: FrontendLatency) -> dict:
    """The cost model's description with the front end the run applied (its own or the sweep file's)."""
    return {**cost_model.describe(), "frontend": frontend.describe()}


def as_scheduled(cfg: PointConfig, cost_model):
    """`cost_model` as the point's engine schedules: where async scheduling is off (`engine.async_scheduling:
    false`, or an engine.vllm_version before 0.14 that left it off), a model that hides the CPU's time per
    step behind the GPU's (the prior, [aic]: `Efficiencies.async_scheduling`) adds it instead. Pipeline
    parallelism, which turns async scheduling off in vLLM but overlaps a batch's CPU work with the other
    stages' GPU work, keeps the model as it is."""
    setting = async_scheduling_setting(cfg)
    return cost_model if setting or not hasattr(cost_model, "synchronous") else cost_model.synchronous()


def async_scheduling_setting(cfg: PointConfig) -> bool:
    """`engine.async_scheduling` as written, else the default of the release engine.vllm_version names
    (policies/vllm_versions.py: on since 0.14)."""
    setting = cfg.engine.async_scheduling
    return rules_of(cfg.policy).async_scheduling_default if setting is None else setting


def engine_limits(cfg: PointConfig, plan, cost_model=None) -> EngineLimits:
    """The engine's limits for a resolved point and its memory plan: the one place a sweep file's `engine:`
    settings become what both engines read. Async scheduling: the sweep file's `engine.async_scheduling`,
    else the cost model's own (simcore/async_scheduling.py) where engine.vllm_version has it on by default
    (0.14 and later); never with pipeline parallelism (vLLM's V1
    model runner turns it off there)."""
    block_bytes = plan.block_size * plan.kv_bytes_per_token
    async_scheduling = async_scheduling_setting(cfg)
    if cfg.engine.async_scheduling is None:   # unset: the cost model's own too (a fitted step model: off)
        async_scheduling = async_scheduling and async_scheduling_of(cost_model)
    if cfg.deployment is not None and cfg.deployment.pipeline_parallel_size > 1:
        async_scheduling = False
    return EngineLimits(
        num_gpu_blocks=plan.num_gpu_blocks, block_size=plan.block_size, max_model_len=cfg.model.max_model_len,
        preemption_mode=cfg.engine.preemption_mode, kv_bytes_per_token=plan.kv_bytes_per_token,
        host_link_bytes_per_s=cfg.gpu.host_link_bytes_per_s,
        num_swap_blocks=int(cfg.engine.swap_space_gb * 1024**3 // block_bytes),
        check_invariants=cfg.engine.check_invariants, enable_prefix_caching=cfg.engine.enable_prefix_caching,
        gateway=cfg.gateway, kv_groups=plan.kv_groups, kv_offload=offload_limits(cfg, plan),
        async_scheduling=async_scheduling, hashless_blocks_first=rules_of(cfg.policy).hashless_blocks_first)


def offload_limits(cfg: PointConfig, plan):
    """The host tier of one replica (simcore/kvoffload.py), or None without engine.kv_offload."""
    if cfg.engine.kv_offload is None:
        return None
    gpus = cfg.deployment.gpus_per_replica if cfg.deployment is not None else cfg.tensor_parallel_size
    return cfg.engine.kv_offload.limits(plan.block_size, plan.block_size * plan.kv_bytes_per_token, gpus)


def with_request_latency(cfg: PointConfig, frontend: FrontendLatency, specs=()) -> PointConfig:
    """The front end's time per request (API server and input processing before the scheduler, output
    processing and streaming after it) sits in a closed loop's cycle: a user's next request reaches the
    engine that much later (the front end's time at the workload's mean prompt length: a closed loop's
    users share one think time). Open-loop arrivals are unchanged (every request is shifted alike)."""
    w = cfg.workload
    if frontend.is_zero or not w.arrival.is_closed:
        return cfg
    mean_prompt = float(np.mean([s.num_prompt_tokens for s in specs])) if len(specs) else 0.0
    latency_s = float(frontend.latency_s(mean_prompt))
    if hasattr(w, "think_time_s"):  # a trace replayed by closed-loop users
        return dataclasses.replace(cfg, workload=dataclasses.replace(w, think_time_s=w.think_time_s + latency_s))
    arrival = dataclasses.replace(w.arrival, think_time_s=w.arrival.think_time_s + latency_s)
    return dataclasses.replace(cfg, workload=dataclasses.replace(w, arrival=arrival))


def run_keys(cfg: PointConfig, plan: MemoryPlan, cost_model, gen, requests: pd.DataFrame, summary: dict) -> None:
    """The summary keys both engines share beyond the metrics (in place): memory, clipping, offered vs
    achieved load and stability, reject reasons, goodput and the `flags` words (simcore/metrics.py). The
    API server's load comes with its queue (`with_frontend`; NaN without one, as for a disaggregated
    deployment, whose requests cross two replicas)."""
    summary.update({"num_gpu_blocks": plan.num_gpu_blocks, "kv_capacity_tokens": plan.kv_capacity_tokens,
                    "num_clipped_prompts": gen.num_clipped_prompts, "num_clipped_outputs": gen.num_clipped_outputs,
                    "cost_model": cost_model.describe().get("kind", "?"),
                    "cost_model_basis": cost_model_basis(cost_model)})
    summary["input_tok_per_s"] = summary["total_tok_per_s"] - summary["output_tok_per_s"]   # the prompts' side
    summary.update(load_stats(requests, summary["duration_s"], cfg.workload.arrival.is_closed))
    summary["rejected_reasons"] = rejected_reasons(requests)
    if cfg.gateway is not None:   # what admission control ended (simcore/gateway.py)
        summary.update(gateway_counts(requests.loc[requests["status"] == "rejected", "reject_reason"]))
    add_goodput(cfg, requests, summary)
    summary.setdefault("api_server_busy", math.nan)   # set with the API server's queue (with_frontend), if any
    summary["flags"] = flag_words(summary)


def add_goodput(cfg: PointConfig, requests: pd.DataFrame, summary: dict) -> None:
    """`num_gpus`, and with `slo:` a per-request `meets_slo` column and the goodput keys (in place)."""
    summary["num_gpus"] = cfg.num_gpus
    if cfg.slo is not None:
        requests["meets_slo"] = meets_slo(requests, cfg.slo.ttft_ms, cfg.slo.tpot_ms, cfg.slo.e2e_ms)
        summary.update(goodput_stats(requests["meets_slo"], summary["duration_s"], cfg.num_gpus))


def add_binding(cfg: PointConfig, plan: MemoryPlan, requests: pd.DataFrame, iterations: pd.DataFrame | None,
                summary: dict, tables_dir=None) -> None:
    """What bound the run (experiments/binding.py), in place; the iterations are read back from
    `tables_dir` in chunks when they were streamed there (experiments/binding_streamed.py). Not for a disaggregated deployment (two kinds of replica)."""
    if cfg.disaggregation is not None:
        return
    from experiments.binding import binding_keys
    roofline = None
    if not (cfg.profile or "").startswith("constant"):   # the stub prices no GPU: no resources to name
        d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
        roofline = RooflineCostModel(cfg.model, cfg.gpu, deployment=d)
    fell_behind = bool(summary.get("unstable")) or math.isinf(summary.get("offered_rate_per_s") or 0.0)
    if iterations is None:   # read back chunk by chunk (a day's steps would not fit as a frame)
        from experiments.binding_streamed import streamed_binding_keys
        summary.update(streamed_binding_keys(cfg.policy, requests, tables_dir, num_usable_blocks(plan.num_gpu_blocks),
                                             plan.block_size, roofline, fell_behind))
        return
    summary.update(binding_keys(cfg.policy, requests, iterations, num_usable_blocks(plan.num_gpu_blocks),
                                plan.block_size, roofline, fell_behind))
    summary["prefill_time_share"] = prefill_time_share(iterations)


def prefill_time_share(iterations: pd.DataFrame) -> float:
    """The share of GPU time in steps that carry prefill tokens (a mixed chunked-prefill step counts as
    prefill: it is priced as one pass); the rest is decode-only steps. The same rule as the search's
    steady-state window (experiments/search.py), over the whole run."""
    busy = float(iterations["duration_s"].sum())
    prefill = float(iterations.loc[iterations["prefill_tokens"] > 0, "duration_s"].sum())
    return prefill / busy if busy > 0 else math.nan


def add_prefix_cache_stats(summary: dict, requests: pd.DataFrame, pools) -> None:
    """Prefix-cache hit counters (summary) and each request's cached prompt tokens (a column), in place."""
    summary.update(prefix_cache_stats(pools))
    cached = {rid: n for pool in pools for rid, n in pool.cached_tokens_by_request.items()}
    requests["cached_prompt_tokens"] = requests["request_id"].map(cached).fillna(0).astype(int)


def _fast_result(cfg: PointConfig, plan: MemoryPlan, cost_model, gen, limits: EngineLimits, seed: int,
                 frontend: FrontendLatency = NO_FRONTEND, tables_dir=None, table_format: str = "parquet",
                 handed: list | None = None) -> SimResult:
    """The fast path's run, as the same SimResult (one engine, a cluster, a disaggregated deployment: see
    experiments/fast.py); with `tables_dir`, its tables are written there instead, the iteration rows as the
    run goes (the same tables, bitwise: tests/test_stream_tables.py); a disaggregated deployment's are
    returned, as the SimPy engine's."""
    n = fast_replicas(cfg)
    writer = None
    if tables_dir is not None and cfg.disaggregation is None:
        Path(tables_dir).mkdir(parents=True, exist_ok=True)
        writer = TableWriter(Path(tables_dir) / "iterations", table_format, empty=empty_iterations())
    keep = {}   # the autoscaler, if any
    try:
        requests, iterations, itl, prefix_caches, disagg = run_fast(cfg, limits, cost_model, handed or [gen.specs],
                                                                    writer, handed_over=True, keep=keep)
    finally:
        if writer is not None:
            writer.close()
    steps = None if disagg is not None else iterations if writer is None else iteration_chunks(tables_dir, STEP_FRAMES)
    requests, queue_keys = with_frontend(requests, frontend, steps, limits)
    requests, summary, replicas = pooled_results(cfg, requests, iterations, itl[:2],
                                                 num_usable_blocks(plan.num_gpu_blocks), n, disagg)
    summary.update(queue_keys)
    if limits.speculative is not None:
        summary.update(speculative_keys(limits.speculative.counters))
    run_keys(cfg, plan, cost_model, gen, requests, summary)
    if prefix_caches:
        add_prefix_cache_stats(summary, requests, prefix_caches)
    resolved = resolved_dict(cfg, plan, described(cost_model, frontend), seed)
    add_binding(cfg, plan, requests, iterations if writer is None else None, summary, tables_dir)
    if "autoscaling" in keep:
        add_autoscaling_keys(cfg, keep["autoscaling"], requests, summary)
    if writer is None:
        return SimResult(requests, iterations, summary, resolved, replicas, *itl[2:])
    write_run_tables(Path(tables_dir), requests, None, itl[:2], table_format, replicas)
    return SimResult(requests.iloc[:0], empty_iterations(), summary, resolved, replicas, tables_saved=True)

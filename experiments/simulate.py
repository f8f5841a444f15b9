"""Wire one resolved point together (workload -> engine with policy and cost model) and run it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd
import simpy

from costmodels import load_cost_model
from costmodels.roofline import activation_reserve_bytes, weight_bytes
from experiments.config import PointConfig, resolve_point
from experiments.fast import run_fast, use_fast_path
from simcore.arrivals import ClosedLoopUsers, open_loop
from simcore.engine import Engine, EngineLimits, SimulationError
from simcore.kvcache import MemoryPlan, plan_memory
from simcore.log import EngineLog
from simcore.metrics import iterations_frame, requests_frame, summarize
from workloads.synthetic import generate


@dataclass
class SimResult:
    """Everything one simulation produced, as pandas tables (for notebooks) and a flat summary."""
    requests: pd.DataFrame     # one row per request
    iterations: pd.DataFrame   # one row per engine iteration
    summary: dict              # the results.csv row (metrics)
    resolved: dict             # the configuration actually simulated, defaults filled in


def memory_plan(cfg: PointConfig) -> MemoryPlan:
    tp, dtype = cfg.tensor_parallel_size, cfg.dtype
    p = cfg.policy
    budget = getattr(p, "max_num_batched_tokens", cfg.model.max_model_len)
    seqs = getattr(p, "max_num_seqs", 256)
    try:
        return plan_memory(
            gpu_memory_bytes=cfg.gpu.memory_bytes, gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
            weight_bytes=weight_bytes(cfg.model, tp, dtype),
            kv_bytes_per_token=cfg.model.kv_bytes_per_token(2 if dtype != "fp8" else 1, tp),
            block_size=cfg.engine.block_size,
            activation_reserve_bytes=activation_reserve_bytes(cfg.model, budget, seqs, tp, dtype),
            num_gpu_blocks=cfg.engine.num_gpu_blocks)
    except ValueError as e:
        raise SimulationError(f"engine: {e}") from None


def resolved_dict(cfg: PointConfig, plan: MemoryPlan, cost: dict, seed: int) -> dict:
    w = cfg.workload
    return {
        "seed": seed, "model": dataclasses.asdict(cfg.model), "hardware": dataclasses.asdict(cfg.gpu),
        "tensor_parallel_size": cfg.tensor_parallel_size, "dtype": cfg.dtype,
        "engine": {"policy": cfg.policy.name, **dataclasses.asdict(cfg.policy), **dataclasses.asdict(cfg.engine),
                   "unused_keys": list(cfg.unused_engine_keys)},
        "memory": {**dataclasses.asdict(plan), "kv_capacity_tokens": plan.kv_capacity_tokens},
        "cost_model": cost,
        "workload": {"num_requests": w.num_requests, "arrival": dataclasses.asdict(w.arrival),
                     "prompt_tokens": {"dist": w.prompt_tokens.dist, **dict(w.prompt_tokens.params)},
                     "output_tokens": {"dist": w.output_tokens.dist, **dict(w.output_tokens.params)},
                     "priority": dataclasses.asdict(w.priority) if w.priority else None},
    }


def simulate(config: PointConfig | dict, seed: int = 0) -> SimResult:
    """Run one simulation. `config` is a resolved PointConfig or a sweep-style mapping without `grid`."""
    cfg = config if isinstance(config, PointConfig) else resolve_point(config)
    plan = memory_plan(cfg)
    cost_model = load_cost_model(cfg.profile, cfg.model, cfg.gpu, cfg.tensor_parallel_size, cfg.dtype)
    gen = generate(cfg.workload, seed, cfg.model.max_model_len)
    block_bytes = plan.block_size * plan.kv_bytes_per_token
    limits = EngineLimits(
        num_gpu_blocks=plan.num_gpu_blocks, block_size=plan.block_size, max_model_len=cfg.model.max_model_len,
        preemption_mode=cfg.engine.preemption_mode, kv_bytes_per_token=plan.kv_bytes_per_token,
        host_link_bytes_per_s=cfg.gpu.host_link_bytes_per_s,
        num_swap_blocks=int(cfg.engine.swap_space_gb * 1024**3 // block_bytes),
        check_invariants=cfg.engine.check_invariants)
    if use_fast_path(cfg, gen.specs):   # same results, without SimPy (experiments/fast.py)
        requests, iterations, itl = run_fast(cfg, limits, cost_model, gen.specs)
        return _result(cfg, plan, cost_model, gen, seed, requests, iterations, itl)
    env = simpy.Environment()
    log = EngineLog()
    engine = Engine(env, cfg.policy, cost_model, limits, log)
    arrival = cfg.workload.arrival
    if arrival.is_closed:
        users = ClosedLoopUsers(env, gen.specs, arrival.concurrency, engine.submit, arrival.think_time_s)
        engine.on_done = users.on_done
        users.start()
    else:
        env.process(open_loop(env, gen.specs, engine.submit))
    env.run()
    if len(log.requests) != len(gen.specs):
        stuck = len(gen.specs) - len(log.requests)
        raise SimulationError(f"{cfg.policy.name}: {stuck} requests never finished (engine stalled at "
                              f"t={env.now:.3f}s with {len(engine.waiting)} waiting, {len(engine.running)} running)")
    return _result(cfg, plan, cost_model, gen, seed, requests_frame(log), iterations_frame(log), log.itl_gaps_s)


def _result(cfg, plan, cost_model, gen, seed, requests, iterations, itl_gaps_s) -> SimResult:
    summary = summarize(requests, iterations, itl_gaps_s, plan.num_gpu_blocks)
    summary.update({"num_gpu_blocks": plan.num_gpu_blocks, "kv_capacity_tokens": plan.kv_capacity_tokens,
                    "num_clipped_prompts": gen.num_clipped_prompts, "num_clipped_outputs": gen.num_clipped_outputs,
                    "cost_model": cost_model.describe().get("kind", "?")})
    return SimResult(requests, iterations, summary,
                     resolved_dict(cfg, plan, cost_model.describe(), seed))

"""Fidelity check: run a short workload on real hardware through the simulator's own engine, simulate the
identical workload with a cost profile, and report how far apart they are.

    python -m fidelity.validate --model tiny --device cpu --profile P --out results/fidelity

P: a profile from `calibration.capture` (path or shipped name), "roofline", a saved step model (stepfit.json
of `calibration.capture --steps` or of an earlier validate), or "stepfit" (default): first fit a whole-step
model on separate real calibration runs (other seeds and arrivals), in this process, and save it as
stepfit.json with its steps in stepfit_steps.csv. For each policy: a saturated run (everything queued at
t = 0) gives the real capacity, then runs at `--loads` x capacity; every point is repeated `--repeats`
times, round robin, so a point's repeats are minutes apart. Writes report.md, iterations.csv,
metrics.csv, step_errors.csv, step_time.png (and profile_corrected.json with --fit-overhead) under --out.
On CPU the process re-executes itself once with GLIBC_TUNABLES that stop glibc from returning freed memory
to the kernel (thousands of page faults per torch step otherwise); --no-reexec skips that.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import simpy
import simpy.rt

from fidelity.stepfit import (TERMS, StepFitCostModel, fit_overheads, fit_step_model, holdout_mask,
                                 kernel_only_s, read_stepfit, step_features)
from fidelity.validate_report import write_report
from calibration.cpu_process import reexec_with_tunables
from costmodels import load_cost_model
from commandline.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from commandline.exits import refuse, run_main
from costmodels.modelargs import model_arg
from commandline.outputs import OutputError, out_dir
from commandline.parser import Parser
from costmodels.catalog import CatalogError, get_gpu
from experiments.config import ConfigError, PointConfig, load_sweep_file, resolve_point
from experiments.simulate import engine_limits, memory_plan
from policies import POLICIES
from simcore.engine import SimulationError
from simcore.kvcache import DEFAULT_BLOCK_SIZE
from simcore.metrics import iterations_frame, requests_frame, summarize
from simcore.wiring import run_replica
from workloads.synthetic import generate

DEFAULT_POLICIES = ("static", "continuous", "chunked_prefill")  # any registered policy may be named
# the stepfit calibration runs per policy: (seed offset, arrival), None = all queued at t = 0. Closed loops
# of 1, 2 and 4 users cover the small batches that dominate below saturation, so that the fit sees them
# instead of interpolating between a single sequence and the saturated run (docs/fidelity/README.md).
CALIBRATION_RUNS = ((1000, None), (2000, {"process": "closed", "concurrency": 1}),
                    (4000, {"process": "closed", "concurrency": 2}),
                    (3000, {"process": "closed", "concurrency": 4}))
STEPFIT_HOLDOUT = 0.2  # the fraction of calibration steps left out of the fit to measure its error


@dataclass
class RunResult:
    """One engine run (real or simulated) of one workload."""
    summary: dict
    requests: pd.DataFrame
    iterations: pd.DataFrame
    records: pd.DataFrame | None = None   # real runs: fidelity.torch_backend.StepRecord rows
    cost_args: list | None = None         # real runs: what the engine would have priced, per step
    speed_samples: list | None = None     # real runs: (sim time, probe median, probe repeats...) seconds


def run_engine(cfg: PointConfig, seed: int, cost_model, backend=None) -> RunResult:
    """The same wiring as experiments.simulate, with an optional real backend (then in real time)."""
    plan = memory_plan(cfg)
    gen = generate(cfg.workload, seed, cfg.model.max_model_len)
    limits = engine_limits(cfg, plan)
    env = simpy.rt.RealtimeEnvironment(strict=False) if backend is not None else simpy.Environment()
    if backend is not None:
        backend.reset()
    arrival = cfg.workload.arrival
    closed = (arrival.concurrency, arrival.think_time_s) if arrival.is_closed else None

    def start_real_clock(engine):   # the real clock starts now, not when the environment was built
        engine.env.real_start = time.monotonic()

    log = run_replica(cfg.policy, cost_model, limits, gen.specs, closed=closed, env=env, executor=backend,
                      before_run=start_real_clock if backend is not None else None).log
    if len(log.requests) != len(gen.specs):
        raise SimulationError(f"{cfg.policy.name}: {len(gen.specs) - len(log.requests)} requests never finished")
    requests, iterations = requests_frame(log), iterations_frame(log)
    summary = summarize(requests, iterations, log.itl_gaps_s, plan.num_gpu_blocks)
    if backend is None:
        return RunResult(summary, requests, iterations)
    return RunResult(summary, requests, iterations, backend.records_frame(), list(backend.cost_args),
                     list(backend.speed_samples))


def build_config(args, policy: str, rate_per_s: float, arrival: dict | None = None) -> PointConfig:
    """One point: the YAML's base (or the command-line workload) with this policy and arrival rate."""
    if args.config:
        raw = load_sweep_file(args.config)
        raw = {k: v for k, v in raw.items() if k not in ("grid", "seeds", "name", "description")}
    else:
        raw = {"workload": {
            "num_requests": args.num_requests,
            "prompt_tokens": {"dist": "lognormal", "median": args.prompt_median, "sigma": args.sigma,
                              "max": args.prompt_max},
            "output_tokens": {"dist": "lognormal", "median": args.output_median, "sigma": args.sigma,
                              "max": args.output_max}}}
        raw["model"] = args.model
    raw = json.loads(json.dumps(raw))  # a deep copy
    raw.setdefault("hardware", args.hardware)
    raw.pop("profile", None)
    raw["dtype"] = args.dtype  # the simulated dtype is the one the real model runs in
    engine = raw.setdefault("engine", {})
    engine["policy"] = policy
    engine.setdefault("num_gpu_blocks", -(-args.kv_tokens // engine.get("block_size", DEFAULT_BLOCK_SIZE)))
    engine.setdefault("max_model_len", args.prompt_max + args.output_max if not args.config else None)
    if engine["max_model_len"] is None:
        del engine["max_model_len"]
    if "max_num_seqs" in POLICIES[policy].__dataclass_fields__:  # another policy's knob is an error
        engine.setdefault("max_num_seqs", args.max_num_seqs)
    if policy == "chunked_prefill":
        engine.setdefault("max_num_batched_tokens", args.chunk_tokens)
    elif policy == "continuous":
        engine.pop("max_num_batched_tokens", None)  # vLLM V0: the budget is max_model_len
    raw["workload"]["arrival"] = arrival or {"process": "poisson", "rate_per_s": rate_per_s}
    cfg = resolve_point(raw)
    # The real backend neither shares KV blocks nor copies KV to the host: refuse rather than ignore.
    if getattr(cfg.engine, "enable_prefix_caching", False):
        raise ConfigError("engine.enable_prefix_caching: not supported by the real backend (fidelity.validate)")
    if cfg.engine.preemption_mode != "recompute":
        raise ConfigError("engine.preemption_mode: the real backend supports recompute only")
    return cfg


def load_profile(args, cfg: PointConfig, backend) -> object:
    """The cost model under test (see the module docstring for the choices)."""
    if args.profile == "stepfit":
        model = calibrate_stepfit(args, backend, args.out / "stepfit_steps.csv")
        save_stepfit(model, args.out / "stepfit.json", args.model, args.device, backend)
        return model
    saved = read_stepfit(args.profile)
    if saved is not None:
        return saved
    try:
        return load_cost_model(args.profile, cfg.model, cfg.gpu, cfg.tensor_parallel_size, cfg.dtype)
    except (CatalogError, ValueError) as e:
        raise ConfigError(f"--profile: {e}") from None


def calibrate_stepfit(args, backend, steps_csv: Path | None = None) -> StepFitCostModel:
    """Separate real runs (other seeds) that the step model is fitted on: per policy, one saturated run
    (large batches) and closed-loop runs with one user (lone decodes), two and four (small batches), so the
    whole range of batch sizes is covered. `steps_csv`: where to write every calibration step with the
    fitted model's price and whether it was held out of the fit."""
    cost_args, frames, probes = [], [], []
    for policy in args.policies:
        for offset, arrival in CALIBRATION_RUNS:
            cfg = build_config(args, policy, float("inf"), arrival)
            res = run_engine(cfg, args.seed + offset, _NullCost(), backend)
            label = "saturated" if arrival is None else f"{arrival['concurrency']} closed-loop user(s)"
            cost_args += res.cost_args
            frames.append(res.records.assign(policy=policy, run=label, seed=args.seed + offset))
            probes += [sample[1] for sample in res.speed_samples]
            _say(args, f"calibration run {policy} {label}: {len(res.records)} steps")
    steps = pd.concat(frames, ignore_index=True)
    measured = steps[_step_column(backend)].to_numpy()
    # normalised steps are at the baseline probe speed; raw ones at the speed the probes saw meanwhile
    reference = backend.reference_base_s if backend.speed_normalise or not probes else float(np.median(probes))
    seeds = "/".join(str(args.seed + offset) for offset, _ in CALIBRATION_RUNS)
    model = fit_step_model(cost_args, measured, source=f"fidelity.validate stepfit, seeds {seeds}, "
                           f"{len(measured)} {'speed-normalised ' * backend.speed_normalise}"
                           f"steps on {args.device} ({_device_name(args.device)}), {time.strftime('%Y-%m-%d')}",
                           reference_step_s=reference, holdout=STEPFIT_HOLDOUT, seed=args.seed, dtype=args.dtype)
    if steps_csv is not None:
        x = np.array([step_features(**a) for a in cost_args])
        steps["fitted_on"] = _step_column(backend)
        steps[[f"x_{t}" for t in TERMS]] = x  # the features, so the fit can be redone offline
        steps["sim_s"] = x @ np.array(model.coefficients)
        steps["error"] = steps["sim_s"] / measured - 1.0
        steps["held_out"] = holdout_mask(len(steps), STEPFIT_HOLDOUT, args.seed)
        steps_csv.parent.mkdir(parents=True, exist_ok=True)
        steps.to_csv(steps_csv, index=False)
    return model


def save_stepfit(model: StepFitCostModel, path: Path, model_name: str, device: str, backend, **extra) -> None:
    """The fitted step model as a reusable profile (`--profile PATH` of validate), with what it ran on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(model.to_json(), model=model_name, device=device, clock=backend.clock,
                                    speed_normalise=backend.speed_normalise, step_repeats=backend.step_repeats,
                                    **extra), indent=1))


def _step_column(backend) -> str:
    """The step time the engine advanced by: speed-normalised or raw."""
    return "normalised_s" if backend.speed_normalise else "measured_s"


class _NullCost:
    """The real backend never prices a step; this makes any accidental use fail loudly."""

    def step_time_s(self, **_):
        raise SimulationError("a real run asked the cost model for a price")

    def describe(self) -> dict:
        return {"kind": "real"}


def make_backend(args, cfg0: PointConfig):
    """The real backend for these options, warmed up, with its baseline speed probe timed."""
    import torch

    from fidelity.torch_backend import RealBackend

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = RealBackend(cfg0.model, memory_plan(cfg0).num_gpu_blocks, cfg0.engine.block_size, args.device,
                          args.dtype, args.seed, args.reference_every_s, clock=args.clock,
                          decode_attention=args.decode_attention, speed_normalise=args.speed_normalise,
                          step_repeats=args.step_repeats)
    backend.warm_up(max_tokens=min(512, cfg0.model.max_model_len // 2))
    backend.reference_base_s = backend.reference_s(reps=9)
    return backend


def run_points(args, backend, cost_model, runs: list, total: int) -> None:
    """Every point's simulated run and its real repeats, appended to `runs` as they finish. A point's
    repeats are spread over the whole validation (round robin over policies and loads), not run back to
    back: its real range then shows how the machine drifts over the validation, not over a minute."""
    done = 0
    sat_cfgs = {policy: build_config(args, policy, float("inf")) for policy in args.policies}
    capacity = {policy: [] for policy in args.policies}
    for policy, cfg in sat_cfgs.items():
        runs.append((policy, "saturated", 0, "sim", run_engine(cfg, args.seed, cost_model)))
    for rep in range(args.repeats):
        for policy, cfg in sat_cfgs.items():
            real = run_engine(cfg, args.seed, _NullCost(), backend)
            runs.append((policy, "saturated", rep, "real", real))
            capacity[policy].append(real.summary["throughput_rps"])
            done += 1
            _say(args, f"[{done}/{total}] {policy} saturated run {rep}: "
                       f"{real.summary['output_tok_per_s']:.0f} output tok/s")
    points = {}  # (policy, load label) -> (config, rate), the loads as fractions of the median capacity
    for policy in args.policies:
        for load in args.loads:
            rate = load * float(np.median(capacity[policy]))
            cfg = build_config(args, policy, rate)
            points[policy, f"{load:g}"] = cfg, rate
            runs.append((policy, f"{load:g}", 0, "sim", run_engine(cfg, args.seed, cost_model)))
    for rep in range(args.repeats):
        for (policy, load), (cfg, rate) in points.items():
            real = run_engine(cfg, args.seed, _NullCost(), backend)
            runs.append((policy, load, rep, "real", real))
            done += 1
            _say(args, f"[{done}/{total}] {policy} load {load} ({rate:.2f} req/s) run {rep}: "
                       f"p50 TTFT {real.summary['ttft_p50_ms']:.1f} ms")


def validate(args) -> dict:
    """All runs of the validation; returns what write_report needs."""
    import torch

    cfg0 = build_config(args, args.policies[0], float("inf"))
    backend = make_backend(args, cfg0)
    cost_model = load_profile(args, cfg0, backend)
    base = getattr(cost_model, "reference_step_s", None)
    if base:
        backend.reference_base_s = float(base)  # normalise to the machine's speed when the profile was taken
    runs = []  # (policy, load, repeat, kind, RunResult)
    total = len(args.policies) * args.repeats * (1 + len(args.loads))
    try:
        run_points(args, backend, cost_model, runs, total)
        interrupted = None
    except KeyboardInterrupt:  # keep what finished: the report covers the points with a real run
        interrupted = f"{sum(kind == 'real' for *_, kind, _ in runs)} of {total}"
        _say(args, f"interrupted: reporting the {interrupted} real runs that finished")
        with_real = {r[:2] for r in runs if r[3] == "real"}  # (policy, load) points with a real run
        runs = [r for r in runs if r[:2] in with_real]
    loads = ["saturated", *(f"{load:g}" for load in args.loads)]
    runs.sort(key=lambda r: (args.policies.index(r[0]), loads.index(r[1]), r[3] != "sim", r[2]))
    overheads = None
    if args.fit_overhead:
        reals = [r for *_, kind, r in runs if kind == "real"]
        cost_args = [a for r in reals for a in r.cost_args]
        measured = np.array([m for r in reals for m in r.records[_step_column(backend)]])
        overheads = (*fit_overheads(cost_model, cost_args, measured),
                     float(np.median(kernel_only_s(cost_model, cost_args) / measured)))
    return {"runs": runs, "cost_model": cost_model, "overheads": overheads,
            "reference_base_s": backend.reference_base_s, "threads": torch.get_num_threads(),
            "decode_attention": backend.decode_attention, "speed_normalise": backend.speed_normalise,
            "step_repeats": backend.step_repeats, "interrupted": interrupted,
            "device_name": _device_name(args.device), "args": vars(args)}


def _device_name(device: str) -> str:
    import platform

    import torch
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs"


def _say(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def write_corrected_profile(args, cost_model, overheads, out: Path) -> Path | None:
    """The profile with its per-step and per-request overheads replaced by the refit (profiles from
    calibration.capture, or a saved step model whose per-step term is replaced)."""
    per_step_s, per_request_s, _ = overheads
    if isinstance(cost_model, StepFitCostModel):
        return None  # fitted on whole steps already; its overheads are part of the fit
    profile = getattr(cost_model, "profile", None)
    if not isinstance(profile, dict):
        return None
    o = dict(profile.get("overheads", {}))
    o.update(per_step_s=per_step_s, per_request_s=per_request_s, per_layer_s=0.0,  # folded into per_step_s
             source=f"fidelity.validate --fit-overhead on {args.device} ({time.strftime('%Y-%m-%d')})")
    path = out / "profile_corrected.json"
    path.write_text(json.dumps(dict(profile, overheads=o), indent=1))
    return path


def parse_args(argv, prog: str = "python -m fidelity.validate", description: str | None = None):
    ap = Parser(prog=prog, description=description or __doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="catalog name or path of a Hugging Face config.json")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--profile", default="stepfit", help="profile path/name, roofline, a saved step model, "
                    "or stepfit (fit on a separate real run first)")
    ap.add_argument("--config", help="a sweep YAML whose base (model, engine, workload) is validated")
    ap.add_argument("--policies", default=None, help="comma-separated (default: the YAML's grid "
                    "engine.policy, else all three)")
    ap.add_argument("--out", type=Path, default=Path("results/fidelity"))
    ap.add_argument("--hardware", default="h100-sxm", help="catalog GPU the profile is looked up for")
    ap.add_argument("--dtype", default=None, choices=["fp32", "bf16", "fp16"],
                    help="default: the profile's dtype, else fp32 on cpu, bf16 on cuda")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: 1 on cpu)")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="time steps by the wall clock, "
                    "or (cpu, one thread) by the engine thread's CPU time: a shared machine's other work is "
                    "then not counted")
    ap.add_argument("--num-requests", type=positive_int, default=48)
    ap.add_argument("--prompt-median", type=positive_int, default=128)
    ap.add_argument("--prompt-max", type=positive_int, default=512)
    ap.add_argument("--output-median", type=positive_int, default=32)
    ap.add_argument("--output-max", type=positive_int, default=128)
    ap.add_argument("--sigma", type=non_negative_float, default=0.8, help="lognormal sigma of both length distributions")
    ap.add_argument("--max-num-seqs", type=positive_int, default=32)
    ap.add_argument("--chunk-tokens", type=positive_int, default=512, help="chunked_prefill max_num_batched_tokens")
    ap.add_argument("--decode-attention", choices=["per_seq", "batched"], default=None,
                    help="one attention call per decode, or all decodes in one masked call "
                    "(default: batched)")
    ap.add_argument("--kv-tokens", type=positive_int, default=65536, help="KV cache capacity in tokens (real and simulated)")
    ap.add_argument("--loads", default="0.5,0.8", help="fractions of the measured saturated capacity")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--reference-every-s", type=positive_float, default=0.5, help="how often to time the speed probe")
    ap.add_argument("--speed-normalise", action="store_true", help="time the speed probe right before and "
                    "after every step and advance the engine by the step time at the baseline speed (for a "
                    "machine whose speed drifts within milliseconds; raw times are reported too)")
    ap.add_argument("--step-repeats", type=positive_int, default=3, help="with --speed-normalise: run each step's "
                    "forward pass this many times back to back and take the median normalised time")
    ap.add_argument("--fit-overhead", action="store_true", help="refit per-step/per-request overheads")
    ap.add_argument("--no-reexec", action="store_true", help="do not re-execute with GLIBC_TUNABLES")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    args.policies = list(dict.fromkeys(p.strip() for p in (args.policies or _yaml_policies(args.config)).split(",")
                                       if p.strip()))
    for p in args.policies:
        if p not in POLICIES:
            ap.error(f"--policies: unknown policy {p!r}; known: {', '.join(POLICIES)}")
    try:
        args.loads = list(dict.fromkeys(float(x) for x in args.loads.split(",") if x.strip()))
    except ValueError:
        ap.error(f"--loads: expected comma-separated fractions, got {args.loads!r}")
    if any(not 0 < x < 1.5 for x in args.loads):
        ap.error("--loads: each load must be a fraction of capacity in (0, 1.5)")
    for low, high in (("prompt_median", "prompt_max"), ("output_median", "output_max")):
        if getattr(args, low) > getattr(args, high):
            ap.error(f"--{low.replace('_', '-')} {getattr(args, low)}: above --{high.replace('_', '-')} "
                     f"{getattr(args, high)}")
    if args.device == "cpu" and args.threads is None:
        args.threads = 1  # one thread: steadier on a shared machine, and what --clock cpu needs
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1):
        ap.error("--clock cpu: needs --device cpu and --threads 1")
    args.dtype = args.dtype or _profile_dtype(args.profile) or ("fp32" if args.device == "cpu" else "bf16")
    return args


def _yaml_policies(path: str | None) -> str:
    """The policies a sweep YAML grids over (its only grid key validate accepts), else all three."""
    if not path:
        return ",".join(DEFAULT_POLICIES)
    grid = load_sweep_file(path).get("grid") or {}
    for key in grid:
        if key != "engine.policy":
            raise ConfigError(f"{path}: grid.{key}: validate runs one point per policy; only engine.policy "
                              "may be gridded (loads and repeats are validate's own options)")
    policies = grid.get("engine.policy")
    return ",".join(policies) if policies else ",".join(DEFAULT_POLICIES)


def _profile_dtype(profile: str) -> str | None:
    """A measured profile fixes the dtype the real model must run in (its kernels were timed in it)."""
    try:
        return json.loads(Path(profile).read_text()).get("dtype")
    except (OSError, ValueError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:   # before minutes of real runs: a model, GPU or output folder the report could not use
        model_arg(args.model)
        get_gpu(args.hardware)
        out_dir(args.out)
    except (CatalogError, OutputError) as e:
        return refuse(e)
    if args.device == "cpu" and not args.no_reexec:
        reexec_with_tunables("fidelity.validate", argv)
    try:
        from fidelity.torch_backend import BackendError
    except ImportError as e:
        print(f"error: the real backend needs torch ({e}); pip install torch", file=sys.stderr)
        return 2
    try:
        get_gpu(args.hardware)
        result = validate(args)
    except (ConfigError, CatalogError, SimulationError, BackendError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during calibration or set-up (validate itself keeps finished runs)
        result = {"runs": []}
    if not result["runs"]:
        print("interrupted before the first real validation run finished: nothing to report", file=sys.stderr)
        return 130
    args.out.mkdir(parents=True, exist_ok=True)
    corrected = None
    if result["overheads"] is not None:
        corrected = write_corrected_profile(args, result["cost_model"], result["overheads"], args.out)
    report = write_report(result, args.out, corrected, " ".join(["python -m fidelity.validate", *argv]))
    print(report.read_text() if not args.quiet else str(report))
    return 130 if result["interrupted"] else 0


if __name__ == "__main__":
    run_main(main, (ConfigError, CatalogError, SimulationError))

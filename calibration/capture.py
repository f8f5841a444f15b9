"""Capture kernel timings of one model's forward pass on this machine's GPU (or CPU), then fit a profile.

    python -m calibration.capture --model llama-3-8b --device cuda --out calib/h200 [--tp 1] [--dtype bf16]

Writes DIR/measurements.csv + DIR/meta.json (calibration.measurements), then DIR/profile.json,
DIR/fit_report.json and DIR/fit.png (calibration.fit) unless --no-fit; a family whose held-out error
exceeds --max-holdout-error-pct refuses the profile (exit 3) unless --keep-bad-fit. On a CPU kernels run
in fp32 on one torch thread, timed by that thread's CPU time (a shared machine's other load then costs
no scheduler stalls). MoE and MLA models add their families (calibration.family_kernels), a CUDA GPU with
fp8 tensor cores fp8 GEMMs, several local GPUs NCCL all-reduces (calibration.allreduce); a family this
machine cannot time is listed with the reason in meta.json's `skipped_families`. Kernel sums miss what
dominates small models on a CPU (operator dispatch, Python): the whole-step model fitted on our own torch
engine (python -m fidelity.step_calibration) is the profile to validate there.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from calibration import allreduce, family_kernels, fit, grid, measurements
from calibration.holdout import add_quality_options, holdout_limits
from calibration.kernels import Builder, Timer, parse_batch
from calibration.layer import LlamaStep
from commandline.argtypes import positive_int
from commandline.exits import refuse, run_main
from costmodels.modelargs import check_tp, model_arg
from commandline.outputs import OutputError, out_dir
from commandline.parser import Parser
from costmodels.catalog import GPUS, CatalogError, ModelShape

NOT_MEASURED = "not measured: interrupted"  # a point Ctrl-C came before
PROBE_GEMM = (64, 256, 256)  # the CPU speed probe (capture): about 0.1 ms in fp32
SLOW_PROBE = 1.1             # a pass whose probe took longer than this x its best ran on a slowed machine
GPU_NAMES = {"H200": "h200-sxm", "H100": "h100-sxm", "A100-SXM4-40GB": "a100-40gb", "A100-SXM4-80GB": "a100-80gb",
             "A100 80GB": "a100-80gb", "L40S": "l40s", "L4": "l4"}


def catalog_gpu(device_name: str) -> str | None:
    """The catalog entry for a CUDA device name (for its datasheet peaks); None when not in the catalog
    (PCIe H100s have lower peaks than the SXM part the catalog lists)."""
    if "PCIe" in device_name or "NVL" in device_name:
        return None
    return next((g for key, g in GPU_NAMES.items() if key in device_name), None)


def machine_meta(device: torch.device) -> dict:
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "host": platform.node(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update({"device_name": props.name, "device_memory_bytes": props.total_memory,
                     "sm_count": props.multi_processor_count, "catalog_gpu": catalog_gpu(props.name),
                     "cudnn": torch.backends.cudnn.version()})
        try:
            import subprocess
            meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            meta["driver"] = None
    else:
        meta.update({"device_name": platform.processor() or platform.machine(), "catalog_gpu": None,
                     "threads": torch.get_num_threads()})
    return meta


def kernel(b: Builder, model: ModelShape, tp: int, p: dict):
    """(run, flops, bytes) of one grid point."""
    fam = p["family"]
    attn = (p.get("num_heads"), p.get("num_kv_heads"), p.get("head_dim"))
    if fam == "gemm":
        return b.gemm(p["m"], p["n"], p["k"])
    if fam == "prefill_attn":
        return b.prefill_attn(p["batch_size"], p["new_tokens"], p["cached_tokens"], *attn)
    if fam == "decode_attn":
        contexts = parse_batch(p["batch"]) if p.get("op") == "mixed" else [p["context_len"]] * p["batch_size"]
        return b.decode_attn(contexts, *attn)
    if fam == "elementwise":
        heads, kv_heads, head_dim = attn if attn[0] else (model.num_heads // tp, max(1, model.num_kv_heads // tp),
                                                          model.head_dim)
        return b.elementwise(p["op"], p["m"], model.hidden_size, heads, kv_heads, head_dim,
                             model.intermediate_size // tp, model.vocab_size // tp)
    if fam == "sampling":
        return b.sampling(p["m"], p["n"])
    if fam == "gemm_fp8":
        return family_kernels.gemm_fp8_kernel(b, p["m"], p["n"], p["k"])
    if fam == "moe":
        return family_kernels.moe_kernel(b, p["m"], p["k"], p["n"], p["batch_size"], p["top_k"], p["imbalance"])
    mla = (model.kv_lora_rank, model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim)
    if fam == "mla_prefill":
        return family_kernels.mla_prefill_kernel(b, p["batch_size"], p["new_tokens"], p["cached_tokens"],
                                                 p["num_heads"], *mla)
    if fam == "mla_decode":
        return family_kernels.mla_decode_kernel(b, p["batch_size"], p["context_len"], p["num_heads"], *mla)
    shape = parse_batch(p["batch"])
    step = LlamaStep(b, model, tp, [tuple(x) for x in shape["prefill"]], shape["decode"])
    return (step.run_layer if fam == "layer" else step.run_iteration), float("nan"), float("nan")


def capture(model: ModelShape, tp: int, dtype: str, device: torch.device, size: str,
            progress: bool = True, repeats: int | None = None, notes: set | None = None,
            clock: str = "wall", speed: dict | None = None, skipped: dict | None = None,
            stopped: dict | None = None) -> list[dict]:
    """Time every grid point; a point that fails (out of memory, unsupported kernel) is recorded, not fatal.
    The `repeats` timed runs of a point are split over the grid's `rounds` passes, each in its own
    seeded random order, so a shared machine's slow spells (seconds of a neighbour's load, up to 1.7x
    here) hit scattered points in one pass, not a whole family in every pass. On a CPU a probe kernel is
    timed before each point: a pass whose probe ran more than SLOW_PROBE x its best is slow, a point
    with only slow passes is timed again in up to `rounds` more passes, and only its passes at full
    speed count when it has any (`speed` receives how many had none). Kernel fallbacks taken are added
    to `notes`, families this device cannot time to `skipped` (family -> why). `clock`: Timer's. Ctrl-C
    ends the capture with what was timed: `stopped` receives {"interrupted": True}, and points never timed
    have status NOT_MEASURED."""
    b = Builder(device, dtype)
    warmup, default_repeats, rounds = grid.timing_settings(size)
    timer = Timer(device, warmup, repeats or default_repeats, clock=clock)
    per_round = -(-timer.repeats // rounds)
    probe = b.gemm(*PROBE_GEMM)[0] if device.type == "cpu" else None
    no_fp8 = family_kernels.fp8_supported(device)
    if skipped is not None and no_fp8:
        skipped["gemm_fp8"] = no_fp8
    rows = [dict(p, status="ok") for p in grid.design(model, tp, size, fp8=no_fp8 is None)]
    passes: list[list[tuple[list[float], int, float]]] = [[] for _ in rows]   # per point: (times, launches, probe s)
    rng = np.random.default_rng(0)
    bar = tqdm(total=rounds * len(rows), desc="calibrating", unit="pt", disable=not progress, file=sys.stderr)
    try:
        for r in range(2 * rounds):
            if r < rounds:
                todo = rng.permutation(len(rows)) if r else range(len(rows))
            else:  # the points that have no pass at full speed yet
                best = _best_probe(passes)
                todo = [i for i, point in enumerate(passes) if point and not _full_speed(point, best)]
                bar.total += len(todo)
            for i in todo:
                bar.update()
                if rows[i]["status"] == "ok":
                    _time_point(b, model, tp, rows[i], timer, per_round, probe, passes[i])
    except KeyboardInterrupt:   # Ctrl-C: the points timed so far are kept, the others marked as never measured
        if stopped is not None:
            stopped["interrupted"] = True
        for row, point in zip(rows, passes):
            if row["status"] == "ok" and not point:
                row["status"] = NOT_MEASURED
    bar.close()
    best = _best_probe(passes)
    for row, point in zip(rows, passes):
        if row["status"] == "ok":
            kept = _full_speed(point, best) or point
            row.update(timer.summary([t for times, _, _ in kept for t in times], sum(n for _, n, _ in kept)))
    if speed is not None and probe:
        speed.update({"probe_gemm": list(PROBE_GEMM), "slow_probe": SLOW_PROBE, "passes": sum(map(len, passes)),
                      "slow_passes": sum(len(point) - len(_full_speed(point, best)) for point in passes),
                      "points_without_a_full_speed_pass": sum(bool(point) and not _full_speed(point, best)
                                                              for point in passes)})
    if notes is not None:
        notes.update(b.notes)
    return rows


def capture_allreduce(model: ModelShape, tp: int, dtype: str, device: torch.device, size: str,
                      skipped: dict) -> list[dict]:
    """NCCL all-reduce rows at each TP degree the local GPUs allow (calibration.allreduce), or the reason
    they were skipped in `skipped`. Message sizes: the hidden states of the grid's token counts."""
    reason = allreduce.skip_reason(device, tp)
    if reason:
        skipped["allreduce"] = reason
        return []
    g = grid.FULL if size == "full" else grid.SMALL
    rows = []
    for world in allreduce.degrees(tp, torch.cuda.device_count()):
        try:
            rows += allreduce.capture(g["gemm_m"], model.hidden_size, dtype, world)
        except (RuntimeError, OSError) as e:   # a failed process group: recorded, the kernels are kept
            skipped[f"allreduce_tp{world}"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return rows


def _best_probe(passes: list) -> float:
    return min((probe_s for point in passes for _, _, probe_s in point), default=1.0)


def _full_speed(point: list, best_probe_s: float) -> list:
    """A point's passes whose probe ran within SLOW_PROBE of the best probe of the capture."""
    return [x for x in point if x[2] <= SLOW_PROBE * best_probe_s]


def _time_point(b: Builder, model: ModelShape, tp: int, row: dict, timer: Timer, repeats: int, probe,
                point_passes: list) -> None:
    """One pass over one point: built afresh, probed (CPU), warmed up, timed; a failure is recorded."""
    try:
        run, row["flops"], row["bytes"] = kernel(b, model, tp, row)
        probe_s = min(timer.runs(probe, 2)[0]) if probe else 1.0
        point_passes.append((*timer.runs(run, repeats), probe_s))
    except (RuntimeError, ValueError, NotImplementedError) as e:  # torch.OutOfMemoryError is a RuntimeError
        row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        tqdm.write(f"skipped {row['family']} {row.get('op', '')} {_shape(row)}: {row['status']}", file=sys.stderr)
    finally:
        run = None
        if timer.device.type == "cuda":
            torch.cuda.empty_cache()


def _shape(p: dict) -> str:
    keys = ("m", "n", "k", "batch_size", "new_tokens", "cached_tokens", "context_len", "batch")
    return " ".join(f"{k}={p[k]}" for k in keys if p.get(k) not in (None, ""))


def roofline_report(rows: list[dict], gpu_name: str | None) -> list[str]:
    """Achieved TFLOP/s and GB/s per family; above 100% of the datasheet peak means a timing bug."""
    gpu = GPUS.get(gpu_name) if gpu_name else None
    lines = [f"achieved throughput (peak: {gpu.bf16_flops_per_s / 1e12:.0f} TFLOP/s, "
             f"{gpu.hbm_bytes_per_s / 1e9:.0f} GB/s, {gpu.name})" if gpu else "achieved throughput (no peak known)"]
    for fam in measurements.ALL_FAMILIES:
        ok = [r for r in rows if r["family"] == fam and r["status"] == "ok" and r["flops"] == r["flops"]]
        if not ok:
            continue
        tflops = max(r["flops"] / r["latency_s"] / 1e12 for r in ok)
        gbs = max(r["bytes"] / r["latency_s"] / 1e9 for r in ok)
        line = f"  {fam:13s} max {tflops:8.2f} TFLOP/s  max {gbs:8.1f} GB/s"
        if gpu:
            pf, pb = tflops * 1e12 / gpu.bf16_flops_per_s, gbs * 1e9 / gpu.hbm_bytes_per_s
            line += f"  ({100 * pf:.0f}% / {100 * pb:.0f}% of peak)"
            if pf > 1.0 or pb > 1.0:
                line += "  ** ABOVE PEAK: timing bug (or data served from cache) **"
        lines.append(line)
    unmeasured = sum(r["status"] == NOT_MEASURED for r in rows)
    failed = sum(r["status"] != "ok" for r in rows) - unmeasured
    lines.append(f"{len(rows) - failed - unmeasured} points measured, {failed} failed (recorded with status)"
                 + (f", {unmeasured} not measured (interrupted)" if unmeasured else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m calibration.capture", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="catalog name or path of a Hugging Face config.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree: time the per-GPU shards")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="default: fp32 on cpu, bf16 on cuda")
    ap.add_argument("--grid", choices=["full", "small"], help="default: full on cuda, small on cpu")
    ap.add_argument("--gpu", help="catalog GPU the profile is for (default: detected; 'cpu' on CPU)")
    ap.add_argument("--repeats", type=positive_int, help="timed runs per point (default: 15)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (cpu; default 1: with more, "
                    "a kernel waits whenever the OS deschedules one of them on a shared machine)")
    ap.add_argument("--clock", choices=["cpu", "wall"], help="cpu: the timing thread's CPU time (needs --threads "
                    "1; the default on cpu); wall: elapsed time")
    ap.add_argument("--no-fit", action="store_true")
    add_quality_options(ap)
    ap.add_argument("--steps", action="store_true", help=argparse.SUPPRESS)   # moved: python -m fidelity.step_calibration
    ap.add_argument("--steps-requests", type=positive_int, default=48, help=argparse.SUPPRESS)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        model = model_arg(args.model)
        check_tp(model, args.tp)
    except CatalogError as e:
        ap.error(str(e))
    if args.gpu and args.gpu != "cpu" and args.gpu.lower() not in GPUS:   # the fit needs its datasheet peaks
        ap.error(f"--gpu {args.gpu}: not a catalog GPU (known: {', '.join(GPUS)}, or cpu)")
    if args.steps:
        ap.error("--steps: the whole-step calibration runs our own torch engine, which is fidelity's work now: "
                 f"python -m fidelity.step_calibration --model {args.model} --device {args.device} --out {args.out}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device (use --device cpu)")
    args.dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    args.clock = args.clock or ("cpu" if args.device == "cpu" and args.threads == 1 else "wall")
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1):
        ap.error("--clock cpu: needs --device cpu and --threads 1")
    try:
        holdout_limits(args.max_holdout_error_pct)   # before minutes of capture, not after
    except ValueError as e:
        ap.error(str(e))
    try:
        out_dir(args.out)   # a file, a link loop or a read-only folder: said now, not after the capture
    except OutputError as e:
        return refuse(e)
    if args.device == "cpu" and argv is None:  # from the command line (tests call main(argv) in-process)
        from calibration.cpu_process import reexec_with_tunables
        reexec_with_tunables("calibration.capture", sys.argv[1:])
    device = torch.device(args.device)
    size = args.grid or ("full" if device.type == "cuda" else "small")
    torch.manual_seed(0)
    meta = machine_meta(device)
    gpu = args.gpu or meta.get("catalog_gpu") or args.device
    t0 = time.perf_counter()
    notes: set[str] = set()
    threads = torch.get_num_threads()
    stopped: dict = {}
    try:
        if device.type == "cpu":
            torch.set_num_threads(args.threads)
            meta["threads"] = args.threads
        speed: dict = {}
        skipped: dict[str, str] = {}
        rows = capture(model, args.tp, args.dtype, device, size, progress=not args.quiet, repeats=args.repeats,
                       notes=notes, clock=args.clock, speed=speed, skipped=skipped, stopped=stopped)
        interrupted = bool(stopped)
        if not interrupted:
            rows += capture_allreduce(model, args.tp, args.dtype, device, size, skipped)
    finally:
        torch.set_num_threads(threads)  # tests call main() in-process
    meta.update({"source": "calibration.capture", "model": model.name, "model_shape": dataclasses.asdict(model),
                 "gpu": gpu, "tp": args.tp, "dtype": args.dtype, "grid": size, "grid_spec": grid.FULL
                 if size == "full" else grid.SMALL, "capture_s": round(time.perf_counter() - t0, 1),
                 "clock": "cuda events" if device.type == "cuda" else args.clock, "kernel_notes": sorted(notes),
                 "skipped_families": skipped})
    if speed:
        meta["speed"] = speed
    if interrupted:
        meta["interrupted"] = True
    meta["command"] = "python -m calibration.capture " + " ".join(sys.argv[1:] if argv is None else argv)
    path = measurements.write(args.out, rows, meta)
    print("\n".join(roofline_report(rows, meta.get("catalog_gpu"))))
    for family, reason in skipped.items():
        print(f"skipped family {family}: {reason}")
    print(f"wrote {path} ({len(rows)} rows, {meta['capture_s']} s)")
    if interrupted:
        n = sum(r["status"] == NOT_MEASURED for r in rows)
        print(f"interrupted: {len(rows) - n} points measured and kept in {path}, {n} not measured; no profile "
              "fitted (rerun the command for a complete capture)", file=sys.stderr)
        return 130
    rc = 0
    if not args.no_fit:
        quality = [f"--max-holdout-error-pct={x}" for x in args.max_holdout_error_pct or []]
        rc = fit.main([str(args.out), "--out", str(args.out / "profile.json"), *quality,
                       *(["--keep-bad-fit"] if args.keep_bad_fit else [])])
    return rc


if __name__ == "__main__":
    run_main(main, (CatalogError, measurements.MeasurementError), kept="what was written to --out stays there")

"""NCCL all-reduce of the hidden states on the local GPUs, as tensor parallelism runs it twice per layer:
one process per GPU (torch.multiprocessing, torch.distributed), messages of tokens x hidden elements in
the calibration dtype, timed with CUDA events on rank 0 after warm-up, the median of the repeats.

Eager NCCL, not vLLM's custom all-reduce (one-shot / two-shot over NVLink IPC buffers, faster for small
messages) nor CUDA-graph capture: an upper bound on the small-message latency engines reach. Skipped,
with the reason, without 2 GPUs or without NCCL. `backend="gloo"` runs the same path on CPU processes
(tests only: gloo's timings say nothing about NVLink).
"""
from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibration.kernels import TORCH_DTYPES


def degrees(tp: int, num_gpus: int) -> list[int]:
    """The TP degrees to time: powers of two from 2 up to the local GPUs, and the profile's own TP."""
    out = {d for d in (2, 4, 8, 16) if d <= num_gpus}
    if 1 < tp <= num_gpus:
        out.add(tp)
    return sorted(out)


def skip_reason(device: torch.device, tp: int) -> str | None:
    """None when all-reduces can be timed here, else why not."""
    if device.type != "cuda":
        return f"NCCL all-reduce needs CUDA GPUs; device is {device.type}"
    if not dist.is_available() or not dist.is_nccl_available():
        return "this torch has no NCCL (torch.distributed.is_nccl_available() is False)"
    if torch.cuda.device_count() < 2:
        return f"NCCL all-reduce needs 2 or more GPUs; {torch.cuda.device_count()} visible"
    if not degrees(tp, torch.cuda.device_count()):
        return "no TP degree to time"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, backend: str, tokens: list[int], hidden: int, dtype: str,
            warmup: int, repeats: int, results) -> None:
    cuda = backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        rows = []
        for m in tokens:
            x = torch.randn(m, hidden, device=device, dtype=TORCH_DTYPES[dtype])
            for _ in range(warmup):
                dist.all_reduce(x)
            times = []
            for _ in range(repeats):
                dist.barrier()
                times.append(_time_once(x, device))
            rows.append((m, times))
        if rank == 0:
            results.put(rows)
    finally:
        dist.destroy_process_group()


def _time_once(x, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(x)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    dist.all_reduce(x)
    return time.perf_counter() - t0


def capture(tokens: list[int], hidden: int, dtype: str, world: int, warmup: int = 5, repeats: int = 20,
            backend: str = "nccl") -> list[dict]:
    """Measurement rows (family allreduce) of `world` processes all-reducing tokens x hidden elements."""
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    try:
        mp.start_processes(_worker, args=(world, _free_port(), backend, tokens, hidden, dtype, warmup, repeats,
                                          results), nprocs=world, join=True, start_method="spawn")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:   # a rank died: one line for the caller
        raise RuntimeError(f"all-reduce over {world} processes: {str(e).strip().splitlines()[-1][:200]}") from None
    elem = torch.finfo(TORCH_DTYPES[dtype]).bits // 8
    rows = []
    for m, times in results.get():
        times = sorted(times)
        q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
        bus_bytes = 2.0 * m * hidden * elem * (world - 1) / world   # ring: what each GPU sends and receives
        rows.append({"family": "allreduce", "op": f"tp{world}", "m": m, "n": hidden, "num_gpus": world,
                     "latency_s": statistics.median(times), "p10_s": q[0], "p90_s": q[-1], "repeats": len(times),
                     "flops": float(m * hidden * (world - 1)), "bytes": bus_bytes, "status": "ok"})
    return rows

"""Real runs in LLMServingSim's format (its `bench/examples/<GPU>/<model>/` folders, MIT): vLLM driven in
process through AsyncLLM, one folder per run.

    <run>/vllm_requests.jsonl   one request a line: request_id, input_toks, output_toks, arrival_time (wall
                                clock), queued_ts, scheduled_ts, first_token_ts, last_token_ts (engine
                                monotonic clock)
    <run>/vllm_meta.json        vllm_version, engine_kwargs (vLLM's argument names), optionally kv_cache
                                (num_gpu_blocks, block_size, gpu_memory_utilization, enable_prefix_caching)
                                and hardware (device_name, device_total_memory_bytes)
    <run>/validation_summary.txt (optional) LLMServingSim's own prediction against the run: a peer's errors

A request's times are taken on the engine's clock, from `queued_ts` (when the engine core queued it; the
wall-clock `arrival_time` is on another clock) as LLMServingSim's own validation does: TTFT =
first_token_ts - queued_ts, TPOT = (last_token_ts - first_token_ts) / (output - 1). The engine core queues
a request only between its steps (its busy loop drains its input queue before each), so a replay measures
its simulated requests from the same point (fidelity.realruns.replay, simcore.metrics.engine_core_view). Anything missing is
a one-line RealRunError naming the file.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from fidelity.realruns import ENGINE_CORE_CLOCK, RealRun, RealRunError, _table
from fidelity.vllm_stages import data_parallel
from policies.vllm_versions import nearest_modelled

REQUESTS, META, PEER = "vllm_requests.jsonl", "vllm_meta.json", "validation_summary.txt"
NEED = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
# device names (torch.cuda.get_device_name) and LLMServingSim's hardware labels -> costmodels.catalog
DEVICE_NAMES = {"nvidia geforce rtx 4090": "rtx-4090", "rtx4090": "rtx-4090",
                "nvidia rtx pro 6000 blackwell workstation edition": "rtx-pro-6000",
                "nvidia rtx pro 6000 blackwell server edition": "rtx-pro-6000-server",
                # LLMServingSim's label for the Server Edition its profiler ran on (meta.yaml: device name)
                "rtxpro6000": "rtx-pro-6000-server",
                "nvidia h100 80gb hbm3": "h100-sxm", "h100": "h100-sxm", "nvidia a100-sxm4-80gb": "a100-80gb",
                "a100": "a100-80gb", "nvidia l40s": "l40s", "l40s": "l40s"}


# Hugging Face ids of the runs -> costmodels.catalog names (other ids resolve as costmodels.get_model does)
MODEL_NAMES = {"meta-llama/Llama-3.1-8B": "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
               "meta-llama/Meta-Llama-3-8B": "llama-3-8b", "meta-llama/Llama-2-7b-hf": "llama-2-7b"}


def is_run(path: Path) -> bool:
    return path.is_dir() and (path / REQUESTS).exists() and (path / META).exists()


def read_run(path: str | Path) -> RealRun:
    d = Path(path)
    if not is_run(d):
        raise RealRunError(f"{d}: not an LLMServingSim run folder (needs {REQUESTS} and {META})")
    try:
        meta = json.loads((d / META).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RealRunError(f"{d / META}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("engine_kwargs"), dict):
        raise RealRunError(f"{d / META}: lacks engine_kwargs (vLLM's engine arguments)")
    rows = []
    with open(d / REQUESTS) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                raise RealRunError(f"{d / REQUESTS}: line {i}: not valid JSON") from None
            missing = [k for k in NEED if not isinstance(r.get(k), (int, float)) or isinstance(r.get(k), bool)]
            if missing:
                raise RealRunError(f"{d / REQUESTS}: line {i}: lacks {', '.join(missing)}")
            rows.append(r)
    if not rows:
        raise RealRunError(f"{d / REQUESTS}: no requests")
    col = {k: np.array([float(r[k]) for r in rows]) for k in NEED}
    req = _table(d / REQUESTS, np.arange(len(rows)), col["queued_ts"], col["input_toks"].astype(int),
                 col["output_toks"].astype(int), col["first_token_ts"], col["last_token_ts"])
    if all(isinstance(r.get("scheduled_ts"), (int, float)) for r in rows):   # when prefill began (request_fit)
        req["scheduled_s"] = np.array([float(r["scheduled_ts"]) for r in rows]) - col["queued_ts"].min()
    info = {"vllm_version": meta.get("vllm_version"), "model_id": meta.get("model"),
            "engine_kwargs": meta["engine_kwargs"], "kv_cache": meta.get("kv_cache") or {},
            "hardware": meta.get("hardware") or {}, "started_at": meta.get("started_at"),
            # queued_ts is vLLM's engine core's stamp, taken when its busy loop drains its input queue
            # between steps: replays are measured from the same point (fidelity.realruns.replay)
            "clock": ENGINE_CORE_CLOCK}
    info["num_gpu_blocks"] = info["kv_cache"].get("num_gpu_blocks")
    run = RealRun(str(d), "llmservingsim", req, None, None, None, d.name, info)
    try:   # the engine it ran, so that fidelity.fit_engine and replays need no --config
        run.config = replay_point(run)
    except RealRunError:
        pass   # a GPU we cannot name: the caller gives hardware (replay_point) or a --config
    return run


# What LLMServingSim's own calibrations of its pair of RTX PRO 6000 Server say about that host's GPU-to-GPU
# path (casys-kaist/LLMServingSim `profiler/perf/RTXPRO6000/hardware.yaml`, MIT; docs/sources.md, "TP
# collectives over PCIe"): the first, written 2026-09-08 (commit e08dc38), measured NCCL at 15.9 GB/s,
# staged through host memory; the next, measured 2026-09-26 (commit 1b2cc02), at 37.6 GB/s, with "acs:
# disabled, iommu: disabled, operator-reported". The host had no GPU peer-to-peer until its operator turned
# PCIe ACS and the IOMMU off between the two, so a run on it before 2026-09-26 most likely ran without.
HOST_P2P_FROM = {"rtx-pro-6000-server": "2026-09-26"}


def host_interconnect(run: RealRun) -> str | None:
    """The interconnect kind the run's host most likely had (`pcie_host` for LLMServingSim's RTX PRO 6000
    pair before its operator turned ACS and the IOMMU off), or None where nothing says (the catalog's kind
    then stands)."""
    try:
        base = gpu_of(run)
    except RealRunError:
        return None
    base = base["base"] if isinstance(base, dict) else base
    started = str(run.meta.get("started_at") or "")
    since = HOST_P2P_FROM.get(base)
    return "pcie_host" if since and started and started[:10] < since else None


def gpu_of(run: RealRun) -> str | dict:
    """The `hardware:` value the run ran on: the catalog GPU its device name (or folder prefix) names, with
    the memory CUDA reported when recorded."""
    hw = run.meta.get("hardware") or {}
    name = str(hw.get("device_name") or Path(run.name).name.split("_")[0]).lower()
    base = DEVICE_NAMES.get(name)
    if base is None:
        raise RealRunError(f"{run.name}: GPU {name!r} not known; pass hardware: a catalog name or a mapping")
    mem = hw.get("device_total_memory_bytes")
    return {"base": base, "name": base, "memory_bytes": float(mem)} if mem else base


def replay_point(run: RealRun, model: str | None = None, hardware=None) -> dict:
    """The sweep-style point that replays the run: its engine arguments, GPU, parallelism and precision.
    `model`: a catalog name or config.json path (default: the run's Hugging Face id)."""
    kw, kv = run.meta["engine_kwargs"], run.meta.get("kv_cache") or {}
    dtype = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "auto": "bf16"}.get(str(kw.get("dtype", "auto")), "bf16")
    engine = {"policy": "chunked_prefill",
              "max_num_seqs": int(kw.get("max_num_seqs") or 256),
              "max_num_batched_tokens": int(kw.get("max_num_batched_tokens") or 2048),
              "enable_prefix_caching": bool(kv.get("enable_prefix_caching", True)),   # on by default in V1
              "gpu_memory_utilization": float(kv.get("gpu_memory_utilization") or 0.9),
              # no front end: the run's times are all the engine core's (queued_ts when the core received
              # the request, already tokenised; first/last_token_ts when the core's step produced the token)
              "frontend": "none"}
    if kw.get("max_model_len"):
        engine["max_model_len"] = int(kw["max_model_len"])
    if kv.get("block_size"):
        engine["block_size"] = int(kv["block_size"])
    version = nearest_modelled(run.meta.get("vllm_version"))   # its release's rules (policies/vllm_versions.py)
    if version is not None:
        engine["vllm_version"] = version
    hf_id = kw.get("model") or run.meta.get("model_id")
    point = {"model": model or MODEL_NAMES.get(hf_id, hf_id),
             "hardware": hardware if hardware is not None else gpu_of(run),
             "dtype": dtype, "tensor_parallel_size": int(kw.get("tensor_parallel_size") or 1), "engine": engine}
    data_parallel(point, int(kw.get("data_parallel_size") or 1))
    if kw.get("enable_expert_parallel"):
        point["enable_expert_parallel"] = True
    if kw.get("kv_cache_dtype") not in (None, "auto"):
        point["kv_cache_dtype"] = kw["kv_cache_dtype"]
    return point


_PEER_ROW = re.compile(r"^(TTFT|TPOT|Latency)\s+(Mean|Median|P50|P99)\s+([-\d.]+)\s+([-\d.]+)\s+([-+\d.]+)%")


def peer_errors(path: str | Path) -> dict:
    """The peer simulator's relative errors from validation_summary.txt, as {'ttft_mean_ms': 0.006, ...}
    (Latency is E2E, Median is p50); {} when the file is absent."""
    p = Path(path) / PEER
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        m = _PEER_ROW.match(line.strip())
        if m:
            metric = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}[m.group(1)]
            stat = {"Mean": "mean", "Median": "p50", "P50": "p50", "P99": "p99"}[m.group(2)]
            real, sim = float(m.group(3)), float(m.group(4))
            out[f"{metric}_{stat}_ms"] = sim / real - 1 if real else float("nan")
    return out

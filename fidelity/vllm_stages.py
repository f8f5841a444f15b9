"""Files of real vLLM load stages (one row per constant-rate stage of an inference-perf run) and the engine
settings each row was run with.

A row's settings come from its own columns where the file has them (several spellings accepted, COLUMNS),
else from the file's name (`vllm-0.15.1-a100-80gb-stages.csv`: the vLLM version and the GPU), else from
the README of the first such file (DEFAULTS: vLLM 0.15.1 on H100 SXM, docs/fidelity/gpu/README.md "Other
stage files"). A GPU is named as people write it ("NVIDIA A100-SXM4-80GB", "H100 80GB HBM3", "L40S") and
resolved through the catalog (costmodels.catalog.get_gpu); one the catalog does not know, or an A100
without its memory size, gives the row a reason to be skipped instead of a GPU it did not run on.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from costmodels.catalog import GPU_ALIASES, GPUS, CatalogError, get_gpu

# What the stage replay needs of every row to rebuild its load (the H100 file's columns)
REQUIRED = ("experiment", "model", "profile", "tensor_parallel_size", "stage", "requested_rate_per_s", "sent",
            "prompt_tokens_mean", "output_tokens_counted_mean")
NUMERIC = tuple(c for c in REQUIRED if c not in ("experiment", "model", "profile", "stage"))
# What the run measured, compared with the replay: a file needs one of them; a column it lacks, or an empty
# cell (a stage whose every request timed out has no latency), leaves that comparison out, not the stage
MEASURED = ("failed", "ttft_mean_ms", "ttft_p99_ms", "e2e_mean_ms", "e2e_p99_ms", "per_token_ms_counted",
            "output_tok_per_s")
# Other names the run tables give a needed column (inference-perf's workload, the experiment configs' TP key)
REQUIRED_ALIASES = {"profile": ("workload", "workload_profile"),
                    "tensor_parallel_size": ("tp", "tensor_parallelism", "tp_size"),
                    "experiment": ("run", "experiment_name", "experiment_folder"), "stage": ("stage_index", "stage_name")}
# Optional per-row settings: each key's accepted column names, vLLM's own first
COLUMNS = {
    "gpu": ("gpu", "hardware", "hw", "accelerator", "gpu_type", "gpu_name", "gpu_model", "accelerator_type", "device"),
    "max_num_batched_tokens": ("max_num_batched_tokens", "token_budget", "max_batched_tokens", "mbt"),
    "max_num_seqs": ("max_num_seqs", "max_seqs", "max_batch_size"),
    "dtype": ("dtype", "torch_dtype"),
    "quantization": ("quantization", "quant"),
    "gpu_memory_utilization": ("gpu_memory_utilization", "gpu_mem_util"),
    # vLLM's --kv-offloading-size (GiB of host memory for offloaded KV); vLLM's --cpu-offload-gb offloads
    # weights instead, which the simulator does not model: such a row is skipped (WEIGHT_OFFLOAD_COLUMNS)
    "kv_offload_gb": ("kv_offload_gb", "kv_offload_gib", "kv_offloading_size", "kv_cpu_offload_gb"),
    "max_model_len": ("max_model_len", "max_len"),
    "vllm_version": ("vllm_version", "engine_version"),
    "data_parallel_size": ("data_parallel_size", "dp", "dp_size", "data_parallel"),
    # KV CPU offloading on or off (true / false), as inference-perf run tables note it; on: `kv_offload_gb`
    "kv_offload": ("kv_offload", "kv_cpu_offload", "cpu_offload", "kv_offloading"),
    # one word for the weights' format or the 16-bit type (FP8, FP16, BF16), as run tables note it
    "precision": ("precision", "weight_precision"),
}
WEIGHT_OFFLOAD_COLUMNS = ("cpu_offload_gb",)
# The first stage file's engine (its README, ../shared/real-runs/README.md section 2): vLLM 0.15.1 on H100
# SXM 80 GB, fp16, max_model_len 4,096, 128 sequences, a 2,048-token budget, 8 GiB of KV CPU offloading,
# gpu_memory_utilization not stated (vLLM's default, 0.9)
DEFAULTS = {"gpu": "h100-sxm", "max_num_batched_tokens": 2048, "max_num_seqs": 128, "dtype": "fp16",
            "quantization": None, "gpu_memory_utilization": 0.9, "kv_offload_gb": 8.0, "max_model_len": 4096,
            "vllm_version": "0.15.1", "data_parallel_size": 1, "kv_offload": None, "precision": None}
INTEGER_KEYS = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "data_parallel_size")
BOOLEANS = {"true": True, "yes": True, "on": True, "1": True, "1.0": True,
            "false": False, "no": False, "off": False, "0": False, "0.0": False, "none": False}
# `precision` words that name a weight format (the rest name the 16-bit type, as DTYPES)
PRECISION_QUANTIZATION = {"fp8": "fp8", "fp8_dynamic": "fp8", "w8a8_fp8": "fp8", "fp8_block": "fp8_block",
                          "mxfp4": "mxfp4", "nvfp4": "nvfp4"}
# How model cards and vLLM's --dtype spell the sweep file's dtypes; `auto` is the checkpoint's own 16-bit type
DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16",
          "auto": "fp16", "fp32": "fp32", "float32": "fp32", "float": "fp32"}
# The load profiles of inference-perf's runs (the first file's README): system prompt tokens, requested
# output tokens, stage seconds, and the measured prompt mean a row of that profile has
PROFILES = {"general": (100, 248, 600, 575), "codegen": (100, 247, 600, 592), "roleplay": (150, 251, 1200, 786),
            "reasoning": (100, 1448, 1200, 1082)}
# A row matches its named profile when its duration (sent / rate) and prompt mean are within this share of
# the profile's; otherwise the profile is rebuilt from the row
PROFILE_TOLERANCE = 0.10
# Words in a GPU's marketing or driver name that do not tell parts apart
NOISE_WORDS = ("nvidia", "geforce", "tesla")


class StageFileError(ValueError):
    """A stage file that cannot be read at all; the message names the file and what is missing."""


def stage_files(real_runs: Path | None, named: list[str]) -> list[Path]:
    """Every `vllm-*-stages.csv` in `real_runs` (sorted), then the files named, each once."""
    found = sorted(real_runs.glob("vllm-*-stages.csv")) if real_runs is not None and real_runs.is_dir() else []
    for name in named:
        p = Path(name)
        if not p.is_file():
            raise StageFileError(f"--stages: no such file {name!r}")
        found.append(p)
    out, seen = [], set()
    for p in found:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def column_key(name) -> str:
    """'GPU Type' -> 'gpu_type', 'max-num-batched-tokens' -> 'max_num_batched_tokens': how the columns are
    matched, so that a header's case and separators do not hide a setting."""
    return re.sub(r"[^0-9a-z]+", "_", str(name).strip().lower()).strip("_")


def read_stage_file(path: Path) -> pd.DataFrame:
    """The rows of one stage file, each with `stage_file` (the file's name); column names as `column_key`."""
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise StageFileError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    keys = [column_key(c) for c in table.columns]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        raise StageFileError(f"{path}: two columns read as {twice!r} ({', '.join(c for c in table.columns if column_key(c) == twice)})")
    table.columns = keys
    for name, aliases in REQUIRED_ALIASES.items():   # a needed column under another name the run tables use
        present = [a for a in aliases if a in table.columns]
        if name not in table.columns and len(present) == 1:
            table = table.rename(columns={present[0]: name})
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise StageFileError(f"{path}: missing column {missing[0]!r} (a stage file has {', '.join(REQUIRED)})")
    if not any(c in table.columns for c in MEASURED):
        raise StageFileError(f"{path}: no measured column (one of {', '.join(MEASURED)}): nothing to compare")
    for c in MEASURED:   # absent: not measured; a cell that is not a number: not measured either
        table[c] = pd.to_numeric(table[c], errors="coerce") if c in table.columns else math.nan
    table.insert(0, "stage_file", path.name)
    return table


def per_token_ms(e2e_mean_ms, ttft_mean_ms, output_tokens) -> float:
    """(E2E mean - TTFT mean) / (output - 1), the runs' per-token time (../shared/real-runs/README.md); NaN
    when a figure is missing or the output is a single token."""
    if pd.isna(e2e_mean_ms) or pd.isna(ttft_mean_ms) or pd.isna(output_tokens) or float(output_tokens) <= 1:
        return math.nan
    return (float(e2e_mean_ms) - float(ttft_mean_ms)) / (float(output_tokens) - 1)


def measured_per_token_ms(row: pd.Series) -> float:
    """The run's per-token time: its `per_token_ms_counted`, else `per_token_ms` of its E2E, TTFT and counted
    output means (the definition that column has); NaN when neither is there."""
    v = row.get("per_token_ms_counted", math.nan)
    if pd.notna(v):
        return float(v)
    return per_token_ms(*(row.get(c, math.nan) for c in ("e2e_mean_ms", "ttft_mean_ms", "output_tokens_counted_mean")))


def row_problem(row: pd.Series) -> str:
    """Why a row's own figures cannot be replayed ('' when they can): a needed figure empty or not a number,
    a tensor-parallel size or rate that is not positive, no measured figure to compare with."""
    if all(pd.isna(row.get(c, math.nan)) for c in MEASURED):
        return "no measured figure (" + ", ".join(MEASURED) + " all empty)"
    for col in NUMERIC:
        try:
            v = float(row[col])
        except (TypeError, ValueError):
            return f"{col} {row[col]!r} is not a number"
        if math.isnan(v):
            return f"{col} is empty"
    tp = float(row["tensor_parallel_size"])
    if tp < 1 or not tp.is_integer():
        return f"tensor_parallel_size {row['tensor_parallel_size']!r} is not a positive integer"
    if float(row["requested_rate_per_s"]) <= 0 or float(row["sent"]) < 1:
        return "requested_rate_per_s and sent must be positive"
    return ""


def gpu_key(text: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'a100-sxm4-80gb', 'H100 SXM' -> 'h100-sxm'."""
    words = re.split(r"[\s_\-]+", str(text).strip().lower())
    return "-".join(w for w in words if w and w not in NOISE_WORDS)


def catalog_gpu(text: str) -> tuple[str | None, str]:
    """(the catalog's name of the GPU `text` names, '') or (None, why not)."""
    key = gpu_key(text)
    if key in ("a100", "a100-sxm4", "a100-sxm", "a100-pcie"):
        return None, (f"GPU {text!r} does not say its memory (A100 40 GB or 80 GB): name a100-80gb or "
                      f"a100-40gb in a gpu column or the file's name")
    try:
        return get_gpu(key).name, ""
    except CatalogError:
        return None, f"GPU {text!r} is not in the catalog (costmodels/catalog.py)"


def gpu_in_file_name(name: str) -> str | None:
    """The longest catalog name, alias or bare A100 that stands between separators in a file's name."""
    stem = "-" + gpu_key(Path(name).name.replace(".", "-")) + "-"
    keys = sorted(set(GPUS) | set(GPU_ALIASES) | {"a100"}, key=len, reverse=True)
    return next((k for k in keys if f"-{k}-" in stem), None)


def version_in_file_name(name: str) -> str | None:
    m = re.search(r"vllm[-_]v?(\d+\.\d+(?:\.\d+)?)", Path(name).name, re.IGNORECASE)
    return m.group(1) if m else None


def _cell(row: pd.Series, key: str):
    for col in COLUMNS[key]:
        v = row.get(col)
        if v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v).strip() != "":
            return v
    return None


def row_settings(row: pd.Series) -> dict:
    """The engine settings of one row: each key's value and, under `skipped`, why the row cannot be
    replayed ('' when it can). `gpu` is a catalog name when resolved, else what the row or file said."""
    file_name = str(row.get("stage_file", ""))
    s = {}
    for key in COLUMNS:
        v = _cell(row, key)
        if v is None and key == "gpu":   # the row's experiment name, then the file's, may name its GPU
            v = gpu_in_file_name(str(row.get("experiment", ""))) or gpu_in_file_name(file_name)
        if v is None and key == "vllm_version":
            v = version_in_file_name(file_name)
        s[key] = DEFAULTS[key] if v is None else v
    skipped = ""
    gpu, why = catalog_gpu(s["gpu"])
    if gpu is None:
        skipped = why
    else:
        s["gpu"] = gpu
    for key in INTEGER_KEYS:
        try:
            v = float(s[key])
            if v != int(v) or v < 1:
                raise ValueError
            s[key] = int(v)
        except (TypeError, ValueError):
            skipped = skipped or f"{key} {s[key]!r} is not a positive integer"
    for key in ("gpu_memory_utilization", "kv_offload_gb"):
        try:
            v = float(s[key])
            s[key] = int(v) if key == "kv_offload_gb" and v.is_integer() else v   # 8 GiB written as vLLM takes it
        except (TypeError, ValueError):
            skipped = skipped or f"{key} {s[key]!r} is not a number"
    dtype = DTYPES.get(str(s["dtype"]).strip().lower())
    if dtype is None:
        skipped = skipped or f"dtype {s['dtype']!r} is not one of {', '.join(DTYPES)}"
    else:
        s["dtype"] = dtype
    if s["quantization"] is not None:
        s["quantization"] = str(s["quantization"]).strip().lower()
    if s["kv_offload"] is not None:   # a yes/no column switches the offloading the GiB figure sizes
        on = BOOLEANS.get(str(s["kv_offload"]).strip().lower())
        if on is None:
            skipped = skipped or f"KV offload {s['kv_offload']!r} is not true or false"
        elif not on:
            s["kv_offload_gb"] = 0
    if s["precision"] is not None:
        word = column_key(s["precision"])   # 'FP8-dynamic' -> 'fp8_dynamic'
        if word in PRECISION_QUANTIZATION:
            s["quantization"] = s["quantization"] or PRECISION_QUANTIZATION[word]
        elif word in DTYPES:
            if _cell(row, "dtype") is None:   # a dtype column says it first
                s["dtype"] = DTYPES[word]
        else:
            skipped = skipped or f"precision {s['precision']!r} is not one of {', '.join([*PRECISION_QUANTIZATION, *DTYPES])}"
    for col in WEIGHT_OFFLOAD_COLUMNS:
        v = row.get(col)
        if v is not None and not pd.isna(v) and float(v) > 0:
            skipped = skipped or f"{col} {v} (vLLM's weight CPU offload) is not modelled"
    s["vllm_version"] = str(s["vllm_version"])
    s["skipped"] = skipped
    return s


def data_parallel(point: dict, dp: int) -> dict:
    """`point` with vLLM's `dp` data-parallel ranks: engines of their own behind one front end, which sends
    each request to a rank as vLLM's DP load balancer does in the row's release (policies/routers.py
    `VllmDP`, from the DP coordinator's snapshots: waiting x 4 + running before 0.27). An MoE model's ranks
    step together (simcore/dp_lockstep.py)."""
    if dp > 1:
        point["data_parallel_size"] = dp
        point["cluster"] = {"num_replicas": dp, "router": "vllm_dp"}
    return point


def stage_profile(row: pd.Series) -> dict:
    """The load profile a row replays: system prompt tokens, requested output tokens (None when only the
    counted mean is known) and stage seconds, with `source` saying where they came from. A known profile
    whose duration and prompt mean the row agrees with is taken as the README gives it; otherwise the row
    is its own profile: the counted output mean, `sent` / rate for the duration, and the general profile's
    share of the prompt as the system prompt."""
    name = str(row["profile"])
    rate, sent, prompt = float(row["requested_rate_per_s"]), float(row["sent"]), float(row["prompt_tokens_mean"])
    duration = sent / rate if rate > 0 else math.nan
    known = PROFILES.get(name)
    if known is not None:
        system, output, seconds, prompt_mean = known
        if abs(duration / seconds - 1) <= PROFILE_TOLERANCE and abs(prompt / prompt_mean - 1) <= PROFILE_TOLERANCE:
            return {"system_tokens": system, "requested_output": output, "duration_s": seconds, "source": name}
        why = f"from the row ({name}'s {seconds} s and {prompt_mean}-token prompts disagree)"
    else:
        why = f"from the row (profile {name!r} unknown)"
    g_system, _, _, g_prompt = PROFILES["general"]
    return {"system_tokens": round(prompt * g_system / g_prompt), "requested_output": None, "duration_s": duration,
            "source": why}

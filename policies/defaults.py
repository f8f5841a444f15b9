"""The engines' own per-GPU defaults for the knobs our policies share with them, read from their source.

Each policy's `for_gpu(gpu, max_model_len, **knobs)` fills unset knobs from here, so the sweep file
(`engine: {policy: chunked_prefill}`) and Python (`ChunkedPrefill.for_gpu(get_gpu("h100-sxm"), 8192)`) build
the same value. A plain constructor (`ChunkedPrefill()`) gives the engine's defaults for a GPU under 70 GiB.
"""
from __future__ import annotations

from typing import Protocol

GIB = 1024**3


class GpuLike(Protocol):
    """What the defaults look at: costmodels.catalog.GPU has both."""
    name: str
    memory_bytes: float


def vllm_server_batch_defaults(gpu: GpuLike, rules=None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of vLLM 0.32's OpenAI-compatible server when neither is given:
    `EngineArgs.get_batch_defaults` in vllm/engine/arg_utils.py (UsageContext.OPENAI_API_SERVER). It looks at
    the device's total memory and name: >= 160 GiB 1024 / 16384 (B200-class; since vLLM 0.28, before it as
    an H100: `rules`, policies/vllm_versions.py); >= 70 GiB and not an A100 1024 / 8192 (H100, H200);
    anything else 256 / 2048 (vLLM's comment: large budgets lowered A100 throughput, PR #17885). The
    catalog's memory is what the driver reports; the 0.1% slack keeps a figure a user rounded on the same
    side of a threshold."""
    memory_gib = gpu.memory_bytes / GIB * 1.001
    if memory_gib >= 160 and (rules is None or rules.large_gpu_budget):
        return 1024, 16384
    if memory_gib >= 70 and "a100" not in gpu.name.lower():
        return 1024, 8192
    return 256, 2048


def sglang_chunked_prefill_size(gpu: GpuLike) -> int:
    """SGLang 0.5.10's `chunked_prefill_size` when not given (`ServerArgs` in sglang/srt/server_args.py, by
    the GPU's memory in GiB): under 35 2048, under 60 4096, under 160 (H100, H200) 8192, else 16384."""
    memory_gib = gpu.memory_bytes / GIB
    if memory_gib < 35:
        return 2048
    if memory_gib < 60:
        return 4096
    if memory_gib < 160:
        return 8192
    return 16384


def vllm_batch_knobs(knobs: dict, num_seqs: int, num_batched_tokens: int, max_model_len: int | None) -> dict:
    """`knobs` with vLLM's defaulting of max_num_seqs / max_num_batched_tokens applied, as
    `_set_default_max_num_seqs_and_batched_tokens_args` (vllm/engine/arg_utils.py) does: an unset budget is
    capped at max_num_seqs x max_model_len (when `max_model_len` is given), then an unset max_num_seqs at
    the budget. Given values are kept as they are."""
    out = dict(knobs)
    if "max_num_batched_tokens" not in out:
        cap = out.get("max_num_seqs", num_seqs) * max_model_len if max_model_len else num_batched_tokens
        out["max_num_batched_tokens"] = min(cap, num_batched_tokens)
    if "max_num_seqs" not in out:
        out["max_num_seqs"] = min(num_seqs, out["max_num_batched_tokens"])
    return out


def check_vllm_budget(policy, max_model_len: int | None = None) -> None:
    """What vLLM's `SchedulerConfig.verify_max_model_len` (vllm/config/scheduler.py) refuses: a budget below
    max_num_seqs and, with `max_model_len` (chunked prefill off), a budget below the longest prompt."""
    seqs, tokens = policy.max_num_seqs, policy.max_num_batched_tokens
    if tokens < seqs:
        raise ValueError(f"engine.max_num_batched_tokens ({tokens}) must be >= engine.max_num_seqs ({seqs}), "
                         "as vLLM requires")
    if max_model_len is not None and tokens < max_model_len:
        raise ValueError(f"engine.max_num_batched_tokens ({tokens}) < max_model_len ({max_model_len}): without "
                         "chunked prefill a long prompt could never be scheduled (vLLM refuses this too); raise it "
                         "or lower engine.max_model_len")


def check_at_least(policy, minimum: int, *names: str) -> None:
    """Each named knob must be an integer >= `minimum` (None allowed: the knob's 'derive it' value)."""
    for k in names:
        v = getattr(policy, k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < minimum):
            raise ValueError(f"engine.{k}: must be an integer >= {minimum}, got {v!r}")

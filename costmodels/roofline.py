"""Roofline cost model: each operator of one forward pass costs max(compute time, memory time) at
realistic efficiencies plus a fixed launch cost; the step adds CPU-side overheads.

It is the prior for GPUs without a measured profile (datasheet figures from `costmodels.catalog`).
It ignores GEMM tile quantisation, wave effects and cache reuse; calibrated profiles capture those.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from costmodels.catalog import DTYPE_BYTES, GPU, ModelShape


@dataclass(frozen=True)
class Efficiencies:
    """Fractions of datasheet peaks that kernels reach, with the measurement behind each."""
    # bf16 GEMM: aiconfigurator's H100 tables peak near 937 and sit near 820 TFLOP/s for large shapes
    # (0.83 of 989); decode-shaped GEMMs reach 63-88% of HBM bandwidth (references.md).
    gemm_compute: float = 0.80
    gemm_memory: float = 0.75
    # Fused (flash) attention reaches roughly 50-70% of peak in prefill; decode attention streams KV.
    attention_compute: float = 0.55
    attention_memory: float = 0.70
    elementwise_memory: float = 0.60     # RMSNorm, rotary, SiLU*mul, residual adds: bandwidth-bound
    allreduce_link: float = 0.70         # NCCL ring bus bandwidth over the datasheet NVLink figure
    kernel_launch_s: float = 2.0e-6      # per kernel, with CUDA graphs (a few microseconds each)
    allreduce_latency_s: float = 8.0e-6  # NCCL small-message latency per all-reduce
    # CPU time real engines add (scheduling, input prep, sampling bookkeeping, detokenisation):
    per_step_s: float = 4.0e-4
    per_request_s: float = 6.0e-6        # per sequence in the batch


class RooflineCostModel:
    """`step_time_s(prefill=[(new, cached), ...], decode=[context, ...])` for one replica of `model` on
    `tp` GPUs of kind `gpu`. All times in seconds."""

    def __init__(self, model: ModelShape, gpu: GPU, tp: int = 1, dtype: str = "bf16",
                 eff: Efficiencies = Efficiencies()):
        self.model, self.gpu, self.tp, self.dtype, self.eff = model, gpu, tp, dtype, eff
        self.dt = DTYPE_BYTES[dtype]
        m = model
        self.q_dim = m.num_heads * m.head_dim // tp
        self.kv_dim = 2 * max(1, m.num_kv_heads // tp) * m.head_dim   # K and V, per GPU
        self.heads = m.num_heads // tp
        mlp_in = (2 if m.gated_mlp else 1) * m.intermediate_size // tp
        # (N, K) of each per-layer GEMM on one GPU: QKV, O, gate+up (or fc1), down (or fc2).
        self.layer_gemms = [(self.q_dim + self.kv_dim, m.hidden_size), (m.hidden_size, self.q_dim),
                            (mlp_in, m.hidden_size), (m.hidden_size, m.intermediate_size // tp)]
        self.peak_flops = gpu.bf16_flops_per_s * (2 if dtype == "fp8" else 1)
        self._by_tokens: dict[int, tuple[float, float, float, float]] = {}
        self._heads: dict[int, float] = {}
        e = eff   # 4 * head_dim * heads FLOP per context token (QK^T and PV), and the attained rates
        self._decode_attention_consts = (4.0 * model.head_dim * self.heads, self.peak_flops * e.attention_compute,
                                         gpu.hbm_bytes_per_s * e.attention_memory, e.kernel_launch_s)

    def describe(self) -> dict:
        return {"kind": "roofline", "source": "datasheet roofline prior (no measured profile)",
                "gpu": self.gpu.name, "model": self.model.name, "tp": self.tp, "dtype": self.dtype,
                **{f"eff_{k}": v for k, v in asdict(self.eff).items()}}

    def _gemm_s(self, m: float, n: int, k: int) -> float:
        e = self.eff
        flops = 2.0 * m * n * k
        bytes_ = (m * k + k * n + m * n) * self.dt   # read activations + weights, write outputs
        return max(flops / (self.peak_flops * e.gemm_compute),
                   bytes_ / (self.gpu.hbm_bytes_per_s * e.gemm_memory)) + e.kernel_launch_s

    def _prefill_attention_s(self, prefill: Sequence[tuple[int, int]]) -> float:
        """Varlen flash attention, causal over the new tokens, full over the cached ones. The sums are of
        integers and half-integers, exact in float64 in any order."""
        e, hd, dt = self.eff, self.model.head_dim, self.dt
        flops = 4.0 * hd * self.heads * float(sum(n * (c + (n + 1) / 2.0) for n, c in prefill))
        bytes_ = dt * float(sum(2 * n * self.q_dim + (c + n) * self.kv_dim for n, c in prefill))
        return max(flops / (self.peak_flops * e.attention_compute),
                   bytes_ / (self.gpu.hbm_bytes_per_s * e.attention_memory)) + e.kernel_launch_s

    def _decode_attention_s(self, context_sum, num_seqs: int):
        """Paged decode attention: stream every sequence's K and V once. `context_sum` (the sum of the
        sequences' contexts, exact in float64) may be a float or an array of them, one per step."""
        flops_per_ctx, compute_rate, memory_rate, launch_s = self._decode_attention_consts
        flops = flops_per_ctx * context_sum
        bytes_ = self.dt * (context_sum * self.kv_dim + 2 * num_seqs * self.q_dim)
        maximum = max if isinstance(context_sum, float) else np.maximum
        return maximum(flops / compute_rate, bytes_ / memory_rate) + launch_s

    def _elementwise_s(self, num_tokens: int) -> float:
        """Two RMSNorms, rotary, SiLU*mul and two residual adds per layer: read + write each tensor."""
        m, e = self.model, self.eff
        bytes_ = self.dt * num_tokens * (2 * 2 * m.hidden_size + 2 * (self.q_dim + self.kv_dim)
                                         + 3 * m.intermediate_size // self.tp + 2 * 3 * m.hidden_size)
        return bytes_ / (self.gpu.hbm_bytes_per_s * e.elementwise_memory) + 5 * e.kernel_launch_s

    def _allreduce_s(self, num_tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        e = self.eff
        bytes_ = num_tokens * self.model.hidden_size * self.dt * 2 * (self.tp - 1) / self.tp  # ring
        return 2 * (bytes_ / (self.gpu.interconnect_bytes_per_s * e.allreduce_link) + e.allreduce_latency_s)

    def step_time_s(self, prefill: Sequence[tuple[int, int]] = (), decode: Sequence[int] = (),
                    num_logits: int | None = None) -> float:
        return self.step_time_sums_s(prefill, len(decode), sum(decode), num_logits)

    def step_time_sums_s(self, prefill: Sequence[tuple[int, int]], num_decode: int, decode_context_sum: int,
                         num_logits: int | None = None) -> float:
        """`step_time_s` when only the count and the sum of the decode contexts are at hand: the roofline
        depends on nothing else about them (equal results, bitwise)."""
        num_seqs = len(prefill) + num_decode
        num_tokens = sum(n for n, _ in prefill) + num_decode
        if num_tokens == 0:
            return 0.0
        if num_logits is None:
            num_logits = num_seqs
        attention = 0.0
        if prefill:
            attention += self._prefill_attention_s(prefill)
        if num_decode:
            attention += float(self._decode_attention_s(float(decode_context_sum), num_decode))
        return self._step_s(num_tokens, num_seqs, num_logits, attention)

    def decode_steps_time_s(self, num_seqs: int, context_sums: np.ndarray, num_logits: int | None = None):
        """Many decode-only steps at once: step i runs `num_seqs` sequences whose contexts (each including
        its new token) sum to `context_sums[i]`. Element i equals, bitwise, `step_time_s(decode=contexts_i,
        num_logits=num_logits)`: the same float operations in the same order, elementwise (the fast path's
        quiet stretches rely on it)."""
        attention = self._decode_attention_s(np.asarray(context_sums, dtype=float), num_seqs)
        return self._step_s(num_seqs, num_seqs, num_seqs if num_logits is None else num_logits, attention)

    def _step_s(self, num_tokens: int, num_seqs: int, num_logits: int, attention):
        """Everything but attention depends on token and sequence counts only; `attention` may be an array."""
        by_tokens = self._by_tokens.get(num_tokens)
        if by_tokens is None:   # memoised: a pure function of the token count
            by_tokens = self._by_tokens[num_tokens] = self._token_terms_s(num_tokens)
        head = self._heads.get(num_logits)
        if head is None:
            head = self._heads[num_logits] = self._head_s(num_logits)
        gemms, elementwise, allreduce, embed = by_tokens
        layer = gemms + (attention + elementwise)
        layer = layer + allreduce
        e = self.eff
        return (self.model.num_layers * layer + head + embed + e.per_step_s + e.per_request_s * num_seqs)

    def decode_step_time_fn(self, num_seqs: int, num_logits: int | None = None):
        """A function of the decode context sum giving `step_time_sums_s((), num_seqs, sum, num_logits)`,
        bitwise: the same operations, with everything that depends only on the counts evaluated once."""
        num_logits = num_seqs if num_logits is None else num_logits
        self._step_s(num_seqs, num_seqs, num_logits, 0.0)   # fills the memos
        gemms, elementwise, allreduce, embed = self._by_tokens[num_seqs]
        head, num_layers, e = self._heads[num_logits], self.model.num_layers, self.eff
        per_step_s, per_seqs_s = e.per_step_s, e.per_request_s * num_seqs
        # _decode_attention_s for a float, inlined (this runs once per simulated step)
        flops_per_ctx, compute_rate, memory_rate, launch_s = self._decode_attention_consts
        dt, kv_dim, q_bytes = self.dt, self.kv_dim, 2 * num_seqs * self.q_dim

        def step_time_s(context_sum: int) -> float:
            context_sum = float(context_sum)
            flops_s = flops_per_ctx * context_sum / compute_rate
            bytes_s = dt * (context_sum * kv_dim + q_bytes) / memory_rate
            layer = gemms + (((flops_s if flops_s >= bytes_s else bytes_s) + launch_s) + elementwise)
            layer = layer + allreduce
            return num_layers * layer + head + embed + per_step_s + per_seqs_s
        return step_time_s

    def _token_terms_s(self, num_tokens: int) -> tuple[float, float, float, float]:
        m, e = self.model, self.eff
        gemms = sum(self._gemm_s(num_tokens, n, k) for n, k in self.layer_gemms)
        embed = num_tokens * m.hidden_size * self.dt * 2 / (self.gpu.hbm_bytes_per_s * e.elementwise_memory)
        return gemms, self._elementwise_s(num_tokens), self._allreduce_s(num_tokens), embed

    def _head_s(self, num_logits: int) -> float:
        """Final norm, LM head over the vocabulary shard, logits to fp32, sampling."""
        if not num_logits:
            return 0.0
        m, e = self.model, self.eff
        head = self._gemm_s(num_logits, m.vocab_size // self.tp, m.hidden_size)
        head += num_logits * m.vocab_size * 4 * 2 / (self.gpu.hbm_bytes_per_s * e.elementwise_memory)
        return head + 3 * e.kernel_launch_s


def weight_bytes(model: ModelShape, tp: int = 1, dtype: str = "bf16") -> float:
    return model.num_params * DTYPE_BYTES[dtype] / tp


def activation_reserve_bytes(model: ModelShape, max_num_batched_tokens: int, max_num_seqs: int,
                             tp: int = 1, dtype: str = "bf16") -> float:
    """Peak non-KV memory of vLLM's profiling forward at the token budget: the largest live activations
    (hidden states, QKV, the gated MLP intermediate), fp32 logits for the sampled sequences, plus
    about 1.5 GiB of CUDA context, NCCL buffers and CUDA graphs that vLLM also counts."""
    dt = DTYPE_BYTES[dtype]
    per_token = dt * (4 * model.hidden_size + 3 * model.intermediate_size // tp)
    logits = min(max_num_seqs, max_num_batched_tokens) * model.vocab_size // tp * 4 * 2
    return max_num_batched_tokens * per_token + logits + 1.5 * 1024**3

"""torch implementations of each kernel family of a Llama-style forward pass, and the timer.

Each `build_*` allocates the inputs of one grid point and returns (run, flops, bytes): `run()` launches
the kernel(s) once. Attention uses torch's fused SDPA (flash / memory-efficient on CUDA, whatever the
device offers elsewhere); elementwise work is eager torch, so it is an upper bound on the fused kernels
production engines use. GEMM weights rotate over copies larger than L2, as in a real forward pass where
each layer's weights come cold from HBM.
"""
from __future__ import annotations

import json
import statistics
import time

import torch
import torch.nn.functional as F

L2_BYTES = 64 * 1024**2  # above the L2 of H100 (50 MB) and H200 (60 MB)
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}  # cuda: events, whatever the clock


class Timer:
    """Timed runs of one kernel after `warmup` runs. On a GPU: CUDA events, the median of `repeats` runs.
    Elsewhere: the calling thread's CPU time (`clock="cpu"`, needs one torch thread: a thread the OS
    deschedules on a shared machine is not charged for the wait) or wall time (`clock="wall"`), and the
    fastest run: other load on a shared CPU only ever adds time (evicted caches, interrupts), so the
    minimum is the kernel's own time and repeats best. Short kernels are launched `inner` times per run,
    enough for `min_run_s` (default 0.2 ms on a GPU; 1 ms elsewhere, where a run of a 2 us kernel would
    otherwise be as short as the clock's own cost)."""

    def __init__(self, device: torch.device, warmup: int, repeats: int, min_run_s: float | None = None,
                 clock: str = "wall"):
        if clock not in CLOCKS:
            raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
        if clock == "cpu" and (device.type != "cpu" or torch.get_num_threads() != 1):
            raise ValueError("clock cpu needs device cpu and one torch thread (torch.set_num_threads(1)): "
                             "the calling thread's CPU time must cover all of the kernel's work")
        cuda = device.type == "cuda"
        self.device, self.warmup, self.repeats = device, warmup, repeats
        self.min_run_s = min_run_s or (2e-4 if cuda else 1e-3)
        self.max_inner = 50 if cuda else 1000
        self.clock, self._now = clock, CLOCKS[clock]

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _once(self, run, inner: int) -> float:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner
        self.sync()
        t0 = self._now()
        for _ in range(inner):
            run()
        self.sync()
        return (self._now() - t0) / inner

    def runs(self, run, repeats: int | None = None) -> tuple[list[float], int]:
        """(seconds per launch of each timed run, launches) after the warm-up."""
        first = min(self._once(run, 1) for _ in range(max(1, self.warmup)))  # the fastest warm-up run
        inner = max(1, min(self.max_inner, int(self.min_run_s / max(first, 1e-7))))
        return [self._once(run, inner) for _ in range(repeats or self.repeats)], (repeats or self.repeats) * inner

    def summary(self, samples: list[float], launches: int) -> dict:
        """latency_s (the median on a GPU, the fastest run elsewhere), p10_s, p90_s and launches timed."""
        samples = sorted(samples)
        q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 9
        latency_s = statistics.median(samples) if self.device.type == "cuda" else samples[0]
        # the interpolation's rounding can put p10 an ulp below the fastest run when two runs tie: clamp to them
        return {"latency_s": latency_s, "p10_s": max(q[0], samples[0]), "p90_s": min(q[-1], samples[-1]),
                "repeats": launches}

    def measure(self, run) -> dict:
        return self.summary(*self.runs(run))


class Builder:
    """Inputs for every family on one device, in one dtype."""

    def __init__(self, device: torch.device, dtype: str):
        self.device, self.dtype = device, TORCH_DTYPES[dtype]
        self.elem = torch.finfo(self.dtype).bits // 8
        self.gqa = _sdpa_has_gqa()
        self.notes: set[str] = set()   # kernel fallbacks taken, written to meta.json
        if not self.gqa:
            self.notes.add("torch without enable_gqa: KV heads repeated before attention")

    def randn(self, *shape, dtype=None):
        return torch.randn(*shape, device=self.device, dtype=dtype or self.dtype)

    def gemm(self, m: int, n: int, k: int):
        weight_bytes = n * k * self.elem
        copies = max(1, min(8, -(-2 * L2_BYTES // weight_bytes))) if self.device.type == "cuda" else 1
        x, ws = self.randn(m, k), [self.randn(n, k) for _ in range(copies)]
        counter = iter(range(1 << 62))
        run = lambda: F.linear(x, ws[next(counter) % copies])  # noqa: E731
        return run, 2.0 * m * n * k, float((m * k + n * k + m * n) * self.elem)

    def _sdpa(self, q, k, v, mask=None, causal=False):
        """Fused attention with grouped KV heads. Where the device's kernels reject GQA with this mask
        (or torch predates enable_gqa), KV heads are repeated beforehand: more traffic, noted in meta."""
        if self.gqa or k.shape[1] == q.shape[1]:
            extra = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
            run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **extra)  # noqa: E731
            try:
                run()
                return run
            except RuntimeError as e:
                self.notes.add(f"GQA attention fell back to repeated KV heads ({str(e).splitlines()[0][:120]})")
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    def prefill_attn(self, b: int, new: int, cached: int, heads: int, kv_heads: int, head_dim: int):
        q = self.randn(b, heads, new, head_dim)
        k, v = self.randn(b, kv_heads, cached + new, head_dim), self.randn(b, kv_heads, cached + new, head_dim)
        if cached:
            from torch.nn.attention.bias import causal_lower_right  # new tokens see the whole cache
            run = self._sdpa(q, k, v, mask=causal_lower_right(new, cached + new))
        else:
            run = self._sdpa(q, k, v, causal=True)
        flops = 4.0 * b * heads * head_dim * new * (cached + (new + 1) / 2)
        bytes_ = self.elem * b * head_dim * (2 * heads * new + 2 * kv_heads * (cached + new))
        return run, flops, float(bytes_)

    def decode_attn(self, contexts: list[int], heads: int, kv_heads: int, head_dim: int):
        b, longest = len(contexts), max(contexts)
        q = self.randn(b, heads, 1, head_dim)
        k, v = self.randn(b, kv_heads, longest, head_dim), self.randn(b, kv_heads, longest, head_dim)
        mask = None
        if min(contexts) != longest:  # mixed lengths: pad to the longest and mask the padding
            lens = torch.tensor(contexts, device=self.device)
            mask = (torch.arange(longest, device=self.device)[None, :] < lens[:, None])[:, None, None, :]
        total = sum(contexts)
        flops = 4.0 * heads * head_dim * total
        bytes_ = self.elem * head_dim * (2 * kv_heads * total + 2 * heads * b)
        return self._sdpa(q, k, v, mask=mask), flops, float(bytes_)

    def elementwise(self, op: str, m: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                    intermediate: int, vocab: int):
        e = self.elem
        if op == "rmsnorm":
            x, w = self.randn(m, hidden), self.randn(hidden)
            return lambda: rms_norm(x, w), 4.0 * m * hidden, 2.0 * m * hidden * e
        if op == "residual_add":
            x, y = self.randn(m, hidden), self.randn(m, hidden)
            return lambda: x + y, float(m * hidden), 3.0 * m * hidden * e
        if op == "silu_mul":
            x = self.randn(m, 2 * intermediate)
            return (lambda: F.silu(x[:, :intermediate]) * x[:, intermediate:],
                    4.0 * m * intermediate, 3.0 * m * intermediate * e)
        if op == "rotary":
            q, k = self.randn(m, heads, head_dim), self.randn(m, kv_heads, head_dim)
            cos, sin = self.randn(m, 1, head_dim), self.randn(m, 1, head_dim)
            run = lambda: (rotate(q, cos, sin), rotate(k, cos, sin))  # noqa: E731
            return run, 3.0 * m * (heads + kv_heads) * head_dim, 2.0 * m * (heads + kv_heads) * head_dim * e
        if op == "embedding":
            ids, table = torch.randint(0, vocab, (m,), device=self.device), self.randn(vocab, hidden)
            return lambda: F.embedding(ids, table), 0.0, 2.0 * m * hidden * e
        raise ValueError(f"unknown elementwise op {op!r}")

    def sampling(self, m: int, vocab: int):
        """vLLM's random sampling: fp32 logits, temperature, softmax, exponential race (Gumbel-max)."""
        logits = self.randn(m, vocab)

        def run():
            probs = torch.softmax(logits.float() / 0.8, dim=-1)
            return probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
        return run, 5.0 * m * vocab, float(m * vocab * (self.elem + 4 * 4))


def rms_norm(x, weight, eps: float = 1e-5):
    """torch's RMSNorm (torch >= 2.4), else its definition in eager ops."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * weight


def rotate(x, cos, sin):
    """Rotary embedding (rotate-half form, as in Llama)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def parse_batch(text: str):
    return json.loads(text)


def _sdpa_has_gqa() -> bool:
    q = torch.zeros(1, 2, 1, 8)
    try:
        F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
        return True
    except TypeError:
        return False

"""torch kernels of the model families beyond a dense Llama, on a calibration.kernels.Builder: a MoE layer
(router GEMM, softmax top-k, tokens permuted to their experts, grouped gate/up and down GEMMs, weighted
un-permute), MLA attention over a latent KV cache (prefill: decompressed; decode: absorbed), and fp8 GEMMs.

The grouped GEMM is torch._grouped_mm over the routed tokens sorted by expert (offsets = tokens per
expert): one launch each way, the work of exactly the routed tokens, as vLLM's fused MoE kernels do (they
pad each expert's tokens to a tile only). Not a loop over experts (3 launches per expert: 384 at Qwen3's
128 experts, launch-bound on a GPU) nor torch.bmm on groups padded to the busiest expert (reads every
expert's weights even at batch 1, and charges imbalance as padding). Where _grouped_mm is missing or
rejects the shapes, a loop over the experts that got tokens stands in and meta.json's notes say so.
Which tokens go to which expert is fixed by the grid point (its top-k and imbalance), not by the random
router, whose GEMM, softmax and top-k still run for their cost. MLA attention runs through torch's SDPA
(no FlashMLA in torch): a 576-wide absorbed head may land on a slower SDPA backend than the engines'
MLA kernels, so on a GPU its timings are an upper bound. Each `*_kernel` returns (run, flops, bytes).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from calibration.kernels import L2_BYTES, Builder


def routed_counts(num_tokens: int, top_k: int, num_experts: int, imbalance: float) -> list[int]:
    """Tokens per expert for `num_tokens` x `top_k` routed pairs: the busiest expert gets `imbalance` x the
    mean (at least its ceiling, at most every token), the others share the rest evenly."""
    pairs = num_tokens * top_k
    mean = pairs / num_experts
    busiest = min(num_tokens, max(math.ceil(mean), round(imbalance * mean)))
    rest, others = pairs - busiest, num_experts - 1
    counts = [busiest] + [rest // others + (1 if i < rest % others else 0) for i in range(others)]
    if max(counts[1:], default=0) > num_tokens or sum(counts) != pairs:
        raise ValueError(f"moe: cannot route {num_tokens} tokens x top-{top_k} over {num_experts} experts")
    return counts


def assignment(counts: list[int], num_tokens: int) -> np.ndarray:
    """Token index of each routed pair, sorted by expert: each expert takes the next `count` tokens round
    robin, so no expert sees a token twice and every token is routed to top_k experts."""
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.concatenate([(s + np.arange(c)) % num_tokens for s, c in zip(start, counts)]).astype(np.int64)


def _grouped(b: Builder, counts: list[int]):
    """y = x_e @ w[e] for each expert's rows of x (sorted by expert); w: [experts, K, N]."""
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32, device=b.device)
    active = [(e, c) for e, c in enumerate(counts) if c]

    def grouped_mm(x, w):
        return torch._grouped_mm(x, w, offs=offs)

    def loop(x, w):
        out, start = [], 0
        for e, c in active:
            out.append(x[start:start + c] @ w[e])
            start += c
        return torch.cat(out)
    return grouped_mm if hasattr(torch, "_grouped_mm") else loop, loop


def moe_kernel(b: Builder, num_tokens: int, hidden: int, width: int, num_experts: int, top_k: int,
               imbalance: float):
    """One MoE layer's routed part on one GPU (`width`: each expert's intermediate size there)."""
    counts = routed_counts(num_tokens, top_k, num_experts, imbalance)
    pairs = num_tokens * top_k
    weight_bytes = num_experts * 3 * hidden * width * b.elem
    copies = max(1, min(4, -(-2 * L2_BYTES // weight_bytes))) if b.device.type == "cuda" else 1
    x, router = b.randn(num_tokens, hidden), b.randn(num_experts, hidden)
    ws = [(b.randn(num_experts, hidden, 2 * width), b.randn(num_experts, width, hidden)) for _ in range(copies)]
    token_of_pair = torch.from_numpy(assignment(counts, num_tokens)).to(b.device)
    fast, loop = _grouped(b, counts)
    counter = iter(range(1 << 62))

    def layer(grouped):
        def run():
            w_gate_up, w_down = ws[next(counter) % copies]
            gates, _ = torch.topk(torch.softmax(F.linear(x, router).float(), dim=-1), top_k)
            h = grouped(x.index_select(0, token_of_pair), w_gate_up)
            y = grouped(F.silu(h[:, :width]) * h[:, width:], w_down)
            y = y * gates.reshape(-1, 1).to(y.dtype)
            return torch.zeros_like(x).index_add_(0, token_of_pair, y)
        return run
    run = layer(fast)
    if fast is not loop:
        try:
            run()
        except (RuntimeError, TypeError, NotImplementedError) as e:
            b.notes.add(f"moe: torch._grouped_mm unavailable here ({str(e).splitlines()[0][:100]}); "
                        "a loop over the active experts timed instead")
            run = layer(loop)
    active = sum(1 for c in counts if c)
    flops = 2.0 * num_tokens * num_experts * hidden + 2.0 * pairs * 3 * hidden * width
    bytes_ = b.elem * (active * 3 * hidden * width + num_tokens * (num_experts + 2 * hidden)
                       + pairs * (2 * hidden + 3 * width))
    return run, flops, float(bytes_)


def _pads_v(b: Builder, q, k, v, **kw) -> bool:
    """Whether this device's SDPA needs V zero-padded to the QK head dim (flash kernels want them equal);
    vLLM's MLA prefill pads the same way and cuts the output back."""
    try:
        F.scaled_dot_product_attention(q, k, v, **kw)
        return False
    except RuntimeError as e:
        b.notes.add(f"MLA prefill: V padded to the QK head dim ({str(e).splitlines()[0][:100]})")
        return True


def mla_prefill_kernel(b: Builder, batch: int, new: int, cached: int, heads: int, rank: int, rope: int,
                       nope: int, v_dim: int):
    """Decompressed MLA prefill: the latent of every context token up-projected by kv_b to per-head K_nope
    and V, the rope key broadcast over heads, causal attention of the new tokens (head dim nope + rope)."""
    ctx = cached + new
    q = b.randn(batch, heads, new, nope + rope)
    latent, k_pe = b.randn(batch, ctx, rank), b.randn(batch, 1, ctx, rope)
    w_kv_b = b.randn(heads * (nope + v_dim), rank)
    kw = {"is_causal": True}
    if cached:
        from torch.nn.attention.bias import causal_lower_right
        kw = {"attn_mask": causal_lower_right(new, ctx)}

    def keys_values():
        kv = F.linear(latent, w_kv_b).view(batch, ctx, heads, nope + v_dim).transpose(1, 2)
        return torch.cat([kv[..., :nope], k_pe.expand(-1, heads, -1, -1)], dim=-1), kv[..., nope:]
    pad = _pads_v(b, q, *keys_values(), **kw)

    def run():
        k, v = keys_values()
        if not pad:
            return F.scaled_dot_product_attention(q, k, v, **kw)
        return F.scaled_dot_product_attention(q, k, F.pad(v, (0, nope + rope - v_dim)), **kw)[..., :v_dim]
    pairs = batch * new * (cached + (new + 1) / 2)
    flops = 2.0 * batch * ctx * rank * heads * (nope + v_dim) + 2.0 * heads * (nope + rope + v_dim) * pairs
    bytes_ = b.elem * (batch * ctx * (rank + rope) + heads * (nope + v_dim) * rank
                       + batch * new * heads * (nope + rope + v_dim))
    return run, flops, float(bytes_)


def mla_decode_kernel(b: Builder, batch: int, context: int, heads: int, rank: int, rope: int, nope: int,
                      v_dim: int):
    """Absorbed MLA decode (FlashMLA's form): W_UK folded into the query (per-head bmm), multi-query
    attention of all heads over the cached latent + rope key (one KV head of width rank + rope, values
    the latent itself), W_UV applied to the latent output."""
    q_nope, q_pe = b.randn(heads, batch, nope), b.randn(batch, heads, 1, rope)
    w_uk, w_uv = b.randn(heads, nope, rank), b.randn(heads, rank, v_dim)
    cache = b.randn(batch, 1, context, rank + rope)   # vLLM's MLA cache entry: latent, then rope key
    scale = 1.0 / math.sqrt(nope + rope)

    def absorbed(kv, extra):
        def run():
            q_lat = torch.bmm(q_nope, w_uk).transpose(0, 1)[:, :, None]          # [batch, heads, 1, rank]
            q = torch.cat([q_lat, q_pe], dim=-1)
            o = F.scaled_dot_product_attention(q, kv, kv[..., :rank], scale=scale, **extra)
            return torch.bmm(o[:, :, 0].transpose(0, 1), w_uv)                  # [heads, batch, v_dim]
        return run
    run = absorbed(cache, {"enable_gqa": True}) if b.gqa else None
    try:
        if run is not None:
            run()
    except RuntimeError as e:   # the device's kernels reject one shared KV head here
        b.notes.add(f"MLA decode: latent KV repeated over heads ({str(e).splitlines()[0][:100]})")
        run = None
    run = run or absorbed(cache.expand(-1, heads, -1, -1), {})
    flops = 2.0 * batch * heads * (nope * rank + rank * v_dim) + 2.0 * batch * heads * context * (2 * rank + rope)
    bytes_ = b.elem * (batch * context * (rank + rope) + heads * rank * (nope + v_dim) + batch * heads * (nope + rope))
    return run, flops, float(bytes_)


def fp8_supported(device: torch.device) -> str | None:
    """None when torch._scaled_mm can run fp8 GEMMs here, else why not."""
    if device.type != "cuda":
        return f"fp8 GEMMs need a CUDA GPU with fp8 tensor cores (sm89+); device is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"fp8 GEMMs need sm89+ (Ada, Hopper, Blackwell); this GPU is sm{major}{minor}"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no _scaled_mm / float8_e4m3fn"
    return None


def gemm_fp8_kernel(b: Builder, m: int, n: int, k: int):
    """fp8 (e4m3) activations x fp8 weights with per-tensor scales, bf16 out: vLLM's Fp8LinearMethod on
    Hopper (torch._scaled_mm, cuBLASLt). Weights rotate over copies larger than L2, as in kernels.gemm."""
    fp8 = torch.float8_e4m3fn
    copies = max(1, min(8, -(-2 * L2_BYTES // (n * k))))
    x = b.randn(m, k).to(fp8)
    ws = [b.randn(n, k).to(fp8) for _ in range(copies)]
    one = torch.ones((), device=b.device, dtype=torch.float32)
    counter = iter(range(1 << 62))
    run = lambda: torch._scaled_mm(x, ws[next(counter) % copies].t(), scale_a=one, scale_b=one,  # noqa: E731
                                   out_dtype=torch.bfloat16)
    return run, 2.0 * m * n * k, float(m * k + n * k + 2 * m * n)

"""A Llama-style decoder with random weights that runs one engine iteration as ONE forward pass.

Prefill chunks and decodes of different requests are packed into one token batch (no padding): the
projections and MLP run on all tokens at once, attention runs per sequence (variable length) over a
paged KV cache (vLLM's block table + slot mapping). Sequences with the same (new, context) shape share
one attention call, so a padded static batch attends as one dense batch, as Hugging Face `generate` does;
optionally all decodes share one call, padded to the longest context and masked (one kernel per layer,
like a paged-attention kernel, at the price of reading padding).
Ignores: tensor parallelism, quantisation, fused kernels (flash/paged attention), sampling other than
greedy. The numbers it produces are meaningless (random weights); only its cost is of interest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from costmodels.catalog import ModelShape

ROPE_THETA = 10000.0
RMS_EPS = 1e-5


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor   # [hidden]
    wqkv: torch.Tensor        # [hidden, (heads + 2 kv_heads) * head_dim], fused as vLLM's QKVParallelLinear
    wo: torch.Tensor          # [heads * head_dim, hidden]
    mlp_norm: torch.Tensor    # [hidden]
    w_gate_up: torch.Tensor   # [hidden, 2 * intermediate] (gated) or [hidden, intermediate] (OPT-style fc1)
    w_down: torch.Tensor      # [intermediate, hidden]


@dataclass
class DecoderWeights:
    shape: ModelShape
    embed: torch.Tensor       # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor     # [hidden, vocab]


def random_weights(shape: ModelShape, device: str = "cpu", dtype: torch.dtype = torch.float32,
                   seed: int = 0) -> DecoderWeights:
    """Random weights scaled by 1/sqrt(fan_in) so activations stay O(1) through any depth. Drawn on the
    target device (an 8B model's 16 GB would take minutes to draw on a CPU), so values differ by device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, hd, i = shape.hidden_size, shape.head_dim, shape.intermediate_size
    qkv = (shape.num_heads + 2 * shape.num_kv_heads) * hd

    def mat(rows: int, cols: int) -> torch.Tensor:
        w = torch.randn(rows, cols, generator=gen, device=device, dtype=dtype)
        return w.mul_(1.0 / math.sqrt(rows))

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    layers = [LayerWeights(ones(h), mat(h, qkv), mat(shape.num_heads * hd, h), ones(h),
                           mat(h, (2 if shape.gated_mlp else 1) * i), mat(i, h))
              for _ in range(shape.num_layers)]
    embed = mat(shape.vocab_size, h)
    lm_head = embed.t() if shape.tie_embeddings else mat(h, shape.vocab_size)
    return DecoderWeights(shape, embed, layers, ones(h), lm_head)


@dataclass
class SeqGroup:
    """Sequences attended together: each has `num_new` query tokens and `num_ctx` keys (cached + new).
    `query_rows`: [num_seqs, num_new] rows of the packed token batch; `ctx_slots`: [num_seqs, num_ctx]
    KV-cache slots of the whole context, in position order."""
    num_new: int
    num_ctx: int
    query_rows: torch.Tensor
    ctx_slots: torch.Tensor
    key_mask: torch.Tensor | None = None  # [num_seqs, 1, 1, num_ctx] bool: decodes padded to one context


@dataclass
class StepInput:
    """One iteration, packed. `slots`: where each new token's K/V is written; `logit_rows`: rows that
    sample (the last token of each sequence that caught up)."""
    token_ids: torch.Tensor   # [T] long
    positions: torch.Tensor   # [T] long
    slots: torch.Tensor       # [T] long
    groups: list[SeqGroup]
    logit_rows: torch.Tensor  # [S] long


class PagedKVCache:
    """K and V for every layer in `num_blocks` blocks of `block_size` token slots (flattened)."""

    def __init__(self, shape: ModelShape, num_blocks: int, block_size: int, device: str, dtype: torch.dtype):
        n = num_blocks * block_size
        # zeros, not empty: touch every page now rather than inside a timed step
        self.k = [torch.zeros(n, shape.num_kv_heads, shape.head_dim, device=device, dtype=dtype)
                  for _ in range(shape.num_layers)]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.num_blocks, self.block_size = num_blocks, block_size


def rope_tables(shape: ModelShape, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    hd = shape.head_dim
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(shape.max_model_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim] (Llama's rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: SeqGroup) -> torch.Tensor:
    """q: [T, heads, hd] for the whole batch; returns [B, num_new, heads, hd] for the group's rows."""
    qg = q[group.query_rows].transpose(1, 2)              # [B, heads, new, hd]
    kg = k_cache[group.ctx_slots].transpose(1, 2)         # [B, kv_heads, ctx, hd]
    vg = v_cache[group.ctx_slots].transpose(1, 2)
    n, c = group.num_new, group.num_ctx
    if group.key_mask is not None:
        mask, causal = group.key_mask, False              # decodes of different lengths in one call
    elif n == 1:
        mask, causal = None, False                        # a decode sees its whole context
    elif n == c:
        mask, causal = None, True                         # a first prefill chunk: plain causal
    else:                                                 # a later chunk: query i sits at position c-n+i
        mask = torch.arange(c, device=q.device)[None, :] <= torch.arange(c - n, c, device=q.device)[:, None]
        causal = False
    out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2)


class Decoder:
    """The forward pass over a packed batch. Stateless except for the weights and rope tables."""

    def __init__(self, weights: DecoderWeights):
        self.w = weights
        s = weights.shape
        self.num_heads, self.num_kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, s.head_dim
        self.cos, self.sin = rope_tables(s, weights.embed.device, weights.embed.dtype)

    @torch.inference_mode()
    def forward(self, step: StepInput, cache: PagedKVCache) -> torch.Tensor:
        """Runs every layer on all new tokens, writes their K/V into `cache`, returns the greedy next
        token of each row in `step.logit_rows`."""
        return self.logits(step, cache).argmax(dim=-1)

    @torch.inference_mode()
    def logits(self, step: StepInput, cache: PagedKVCache) -> torch.Tensor:
        w, nh, nkv, hd = self.w, self.num_heads, self.num_kv_heads, self.head_dim
        x = w.embed[step.token_ids]
        cos, sin = self.cos[step.positions], self.sin[step.positions]
        num_tokens = x.shape[0]
        for layer, k_cache, v_cache in zip(w.layers, cache.k, cache.v):
            qkv = rms_norm(x, layer.attn_norm) @ layer.wqkv
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = apply_rope(q.view(num_tokens, nh, hd), cos, sin)
            k_cache.index_copy_(0, step.slots, apply_rope(k.view(num_tokens, nkv, hd), cos, sin))
            v_cache.index_copy_(0, step.slots, v.view(num_tokens, nkv, hd))
            attn = torch.empty_like(q)
            for group in step.groups:
                attn[group.query_rows] = _attend(q, k_cache, v_cache, group)
            x = x + attn.view(num_tokens, nh * hd) @ layer.wo
            h = rms_norm(x, layer.mlp_norm) @ layer.w_gate_up
            if w.shape.gated_mlp:
                gate, up = h.chunk(2, dim=-1)
                h = F.silu(gate) * up
            else:
                h = F.relu(h)
            x = x + h @ layer.w_down
        return rms_norm(x[step.logit_rows], w.final_norm) @ w.lm_head


def reference_logits(weights: DecoderWeights, token_ids: torch.Tensor) -> torch.Tensor:
    """Dense causal forward of ONE sequence, no cache, attention written out by hand (for tests)."""
    s = weights.shape
    nh, nkv, hd = s.num_heads, s.num_kv_heads, s.head_dim
    cos, sin = rope_tables(s, weights.embed.device, weights.embed.dtype)
    t, dev = token_ids.shape[0], weights.embed.device
    pos = torch.arange(t, device=dev)
    x = weights.embed[token_ids.to(dev)]
    causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    for layer in weights.layers:
        q, k, v = (rms_norm(x, layer.attn_norm) @ layer.wqkv).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = apply_rope(q.view(t, nh, hd), cos[pos], sin[pos])
        k = apply_rope(k.view(t, nkv, hd), cos[pos], sin[pos]).repeat_interleave(nh // nkv, dim=1)
        v = v.view(t, nkv, hd).repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + torch.einsum("hqk,khd->qhd", probs, v).reshape(t, nh * hd) @ layer.wo
        h = rms_norm(x, layer.mlp_norm) @ layer.w_gate_up
        if s.gated_mlp:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.relu(h)
        x = x + h @ layer.w_down
    return rms_norm(x, weights.final_norm) @ weights.lm_head

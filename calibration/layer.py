"""A whole Llama decoder layer and a whole iteration (embedding, layers, final norm, LM head, sampling) in
eager torch, for one mixed batch of prefill chunks and decodes: checks that the per-kernel timings compose
and measures the per-step overhead. Weights are random (timings do not depend on values); one layer's
weights and KV cache are reused by every layer, which still streams them from HBM (far larger than L2)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from calibration.kernels import Builder, rms_norm, rotate
from costmodels.catalog import ModelShape
from costmodels.profile import attention_heads, gemm_shapes


class LlamaStep:
    """One iteration's forward over `prefill` [(new, cached), ...] and `decode` [context, ...]."""

    def __init__(self, b: Builder, model: ModelShape, tp: int, prefill: list, decode: list):
        self.b, self.model = b, model
        self.heads, self.kv_heads, self.head_dim = attention_heads(model, tp)
        self.inter = model.intermediate_size // tp
        shapes = gemm_shapes(model, tp)
        self.w = {op: b.randn(n, k) for op, (n, k) in shapes.items()}
        self.norm = b.randn(model.hidden_size)
        self.embed = b.randn(model.vocab_size // tp, model.hidden_size)
        self.num_tokens = sum(n for n, _ in prefill) + len(decode)
        self.num_logits = len(prefill) + len(decode)
        self.ids = torch.randint(0, model.vocab_size // tp, (self.num_tokens,), device=b.device)
        self.cos = b.randn(self.num_tokens, 1, self.head_dim)
        self.sin = b.randn(self.num_tokens, 1, self.head_dim)
        # KV cache of the tokens already computed, per sequence (shared by all layers, see docstring).
        self.prefill = [(new, cached, b.randn(1, self.kv_heads, cached, self.head_dim),
                         b.randn(1, self.kv_heads, cached, self.head_dim)) for new, cached in prefill]
        self.decode = decode
        self.x0 = F.embedding(self.ids, self.embed)
        if decode:
            longest = max(decode)
            self.dk = b.randn(len(decode), self.kv_heads, longest - 1, self.head_dim)
            self.dv = b.randn(len(decode), self.kv_heads, longest - 1, self.head_dim)
            # Mixed lengths: pad to the longest and mask (values and mask positions do not affect timing).
            lens = torch.tensor(decode, device=b.device)
            self.dmask = None if min(decode) == longest else \
                (torch.arange(longest, device=b.device)[None, :] < lens[:, None])[:, None, None, :]

    def attention(self, q, k, v):
        """Prefill sequences one SDPA call each (varlen), then all decodes in one batched call."""
        out, start = [], 0
        hd, sdpa = self.head_dim, self.b._sdpa
        for new, cached, ck, cv in self.prefill:
            sl = slice(start, start + new)
            qs = q[sl].transpose(0, 1)[None]
            ks = torch.cat([ck, k[sl].transpose(0, 1)[None]], dim=2)
            vs = torch.cat([cv, v[sl].transpose(0, 1)[None]], dim=2)
            if cached:
                from torch.nn.attention.bias import causal_lower_right
                run = sdpa(qs, ks, vs, mask=causal_lower_right(new, cached + new))
            else:
                run = sdpa(qs, ks, vs, causal=True)
            out.append(run()[0].transpose(0, 1))
            start += new
        if self.decode:
            sl = slice(start, start + len(self.decode))
            qd = q[sl][:, :, None]
            kd = torch.cat([self.dk, k[sl][:, :, None]], dim=2)
            vd = torch.cat([self.dv, v[sl][:, :, None]], dim=2)
            out.append(sdpa(qd, kd, vd, mask=self.dmask)()[:, :, 0])
        return torch.cat(out).reshape(self.num_tokens, self.heads * hd)

    def layer(self, x):
        w, hd = self.w, self.head_dim
        y = rms_norm(x, self.norm)
        qkv = F.linear(y, w["qkv"])
        q_dim, kv_dim = self.heads * hd, self.kv_heads * hd
        q = rotate(qkv[:, :q_dim].reshape(-1, self.heads, hd), self.cos, self.sin)
        k = rotate(qkv[:, q_dim:q_dim + kv_dim].reshape(-1, self.kv_heads, hd), self.cos, self.sin)
        v = qkv[:, q_dim + kv_dim:].reshape(-1, self.kv_heads, hd)
        x = x + F.linear(self.attention(q, k, v), w["o"])
        gu = F.linear(rms_norm(x, self.norm), w["gate_up"])
        return x + F.linear(F.silu(gu[:, :self.inter]) * gu[:, self.inter:], w["down"])

    def run_layer(self):
        return self.layer(self.x0)

    def run_iteration(self):
        x = F.embedding(self.ids, self.embed)
        for _ in range(self.model.num_layers):
            x = self.layer(x)
        last = self._last_token_rows()
        logits = F.linear(rms_norm(x[last], self.norm), self.w["lm_head"])
        probs = torch.softmax(logits.float() / 0.8, dim=-1)
        return probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)

    def _last_token_rows(self):
        ends, start = [], 0
        for new, *_ in self.prefill:
            start += new
            ends.append(start - 1)
        ends += range(start, start + len(self.decode))
        return torch.tensor(ends, device=self.b.device)

"""The grid of kernel shapes a calibration times: every kernel family of one forward pass of the model,
with its per-GPU shapes. `full` is sized for one H100/H200-class GPU in a few minutes; `small` runs on a
CPU with a tiny model in seconds and exercises the same code paths. MoE models add the `moe` family (over
tokens, top-k around the model's and routing imbalance) and their shared-expert GEMMs; MLA models time
MLA attention and projections instead of GQA attention; fp8 GEMMs are added where the device has them.
The whole-layer and whole-iteration checks run a dense Llama layer, so only dense GQA models have them."""
from __future__ import annotations

from costmodels.catalog import ModelShape
from costmodels.profile import ELEMENTWISE_PER_LAYER, ELEMENTWISE_PER_STEP, attention_heads, gemm_shapes
from costmodels.profile_families import extra_gemm_shapes, mla_shape, moe_shape

MOE_IMBALANCE = (1.0, 1.5, 2.0)   # busiest expert's tokens over the mean (Deployment.expert_load_imbalance)

FULL = {
    "gemm_m": [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
               4096, 6144, 8192, 12288, 16384],
    "prefill_b": [1, 2, 4, 8, 16, 32, 64],
    "prefill_new": [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "prefill_max_tokens": 65536,
    "cached": [(1, 512, 1024), (1, 2048, 4096), (4, 128, 1024), (4, 512, 4096), (16, 256, 2048),
               (1, 1, 8192), (8, 64, 512), (2, 4096, 8192)],
    "decode_b": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    "decode_ctx": [16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768],
    "decode_max_kv_tokens": 2_000_000,
    "mixed": [[128, 4096], [16, 512, 8192], [64] * 7 + [16384], [100, 900, 2000, 3000] * 8,
              [32, 8000] * 32, [1000] * 60 + [7000] * 4],
    "elementwise_m": [1, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384],
    "sampling_m": [1, 4, 16, 64, 256, 1024],
    "steps": [  # (prefill [(new, cached)], decode [context]): mixed chunked-prefill style iterations
        ([], [512] * 32), ([], [2048] * 128), ([(2048, 0)], []), ([(512, 0)], [1024] * 16),
        ([(256, 1024)], [300] * 64), ([(4096, 0), (1024, 2048)], [800] * 8)],
    "moe_max_pairs": 131072,   # tokens x top-k: 16384 tokens at top-8
    "warmup": 3, "repeats": 15, "rounds": 1,
}

SMALL = {  # sizes 2x apart: a CPU's kinks are sharp, and a fifth of each family must be held out
    "gemm_m": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
    "prefill_b": [1, 2, 4, 8],
    "prefill_new": [16, 32, 64, 128, 256],
    "prefill_max_tokens": 1024,
    "cached": [(1, 32, 128), (2, 16, 64), (1, 64, 192), (4, 32, 32)],
    "decode_b": [1, 2, 4, 8, 16],
    "decode_ctx": [16, 32, 64, 128, 256],
    "decode_max_kv_tokens": 4096,
    "mixed": [[16, 200], [32, 64, 128, 256]],
    "elementwise_m": [2**i for i in range(13)],   # 1 ... 4096: 13 points, 3 held out
    "sampling_m": sorted({round(2 ** (i / 2)) for i in range(21)}),   # 1 ... 1024: 20 points, 4 held out
    "steps": [([], [64] * 4), ([(64, 0)], [32] * 2), ([(32, 16)], [])],
    "moe_max_pairs": 4096,
    "warmup": 3, "repeats": 15, "rounds": 3,   # a CPU shared with other load: see calibration.capture.capture
}


def design(model: ModelShape, tp: int, size: str, fp8: bool = False) -> list[dict]:
    """Grid points as measurement rows without timings (family, op and shape columns); `fp8`: also the
    model's GEMMs in fp8 (the device supports them)."""
    g = FULL if size == "full" else SMALL
    points = []
    gemms = {**timed_gemm_shapes(model, tp), **extra_gemm_shapes(model, tp)}
    for family in ("gemm", "gemm_fp8") if fp8 else ("gemm",):
        for op, (n, k) in gemms.items():
            for m in g["gemm_m"]:
                points.append({"family": family, "op": op, "m": m, "n": n, "k": k})
    if model.is_mla:
        points += _mla_points(model, tp, g)
    else:
        heads, kv_heads, head_dim = attention_heads(model, tp)
        points += _attention_points({"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}, g)
    if model.num_moe_layers:
        points += _moe_points(model, tp, g)
    for op in sorted(set(ELEMENTWISE_PER_LAYER) | set(ELEMENTWISE_PER_STEP)):
        for m in g["elementwise_m"]:
            points.append({"family": "elementwise", "op": op, "m": m, "n": model.hidden_size})
    for m in g["sampling_m"]:
        points.append({"family": "sampling", "m": m, "n": model.vocab_size // tp})
    if model.is_moe or model.is_mla:
        return points
    for family in ("layer", "iteration"):
        for prefill, decode in g["steps"]:
            points.append({"family": family, "batch": str({"prefill": [list(p) for p in prefill],
                                                            "decode": decode}).replace("'", '"')})
    return points


def timed_gemm_shapes(model: ModelShape, tp: int) -> dict[str, tuple[int, int]]:
    """The dense GEMMs a step of this model runs: not GQA's qkv / o for an MLA model, nor the dense MLP
    when every layer is MoE (the fit still gives them curves, from its (m, n, k) grid; nothing prices them)."""
    unused = (("qkv", "o") if model.is_mla else ()) + (("gate_up", "down") if model.num_dense_layers == 0 else ())
    return {op: s for op, s in gemm_shapes(model, tp).items() if op not in unused}


def _prefill_shapes(g: dict) -> list[tuple[int, int, int]]:
    shapes = [(b, new, 0) for b in g["prefill_b"] for new in g["prefill_new"] if b * new <= g["prefill_max_tokens"]]
    return shapes + [tuple(c) for c in g["cached"]]


def _decode_shapes(g: dict) -> list[tuple[int, int]]:
    return [(b, ctx) for b in g["decode_b"] for ctx in g["decode_ctx"] if b * ctx <= g["decode_max_kv_tokens"]]


def _attention_points(attn: dict, g: dict) -> list[dict]:
    points = [{"family": "prefill_attn", "batch_size": b, "new_tokens": new, "cached_tokens": cached, **attn}
              for b, new, cached in _prefill_shapes(g)]
    points += [{"family": "decode_attn", "batch_size": b, "context_len": ctx, **attn} for b, ctx in _decode_shapes(g)]
    for ctxs in g["mixed"]:
        points.append({"family": "decode_attn", "op": "mixed", "batch_size": len(ctxs),
                       "context_len": sum(ctxs) / len(ctxs), "batch": str(ctxs), **attn})
    return points


def _mla_points(model: ModelShape, tp: int, g: dict) -> list[dict]:
    """MLA attention at this GPU's heads: `head_dim` holds kv_lora_rank (the latent's width)."""
    s = mla_shape(model, tp)
    attn = {"num_heads": s["num_heads"], "num_kv_heads": 1, "head_dim": s["kv_lora_rank"]}
    points = [{"family": "mla_prefill", "batch_size": b, "new_tokens": new, "cached_tokens": cached, **attn}
              for b, new, cached in _prefill_shapes(g)]
    points += [{"family": "mla_decode", "batch_size": b, "context_len": ctx, **attn} for b, ctx in _decode_shapes(g)]
    return points


def moe_top_ks(model: ModelShape) -> list[int]:
    """The model's top-k, half and twice it: the profile prices other top-k by interpolation."""
    k = model.experts_per_token
    return sorted({max(1, k // 2), k, min(model.num_experts, 2 * k)})


def _moe_points(model: ModelShape, tp: int, g: dict) -> list[dict]:
    s = moe_shape(model, tp)
    return [{"family": "moe", "m": m, "n": s["expert_width"], "k": s["hidden_size"], "batch_size": s["num_experts"],
             "top_k": top_k, "imbalance": imbalance}
            for top_k in moe_top_ks(model) for imbalance in MOE_IMBALANCE for m in g["gemm_m"]
            if m * top_k <= g["moe_max_pairs"]]


def timing_settings(size: str) -> tuple[int, int, int]:
    """(warm-up runs, timed runs, passes over the grid the timed runs are split over)."""
    g = FULL if size == "full" else SMALL
    return g["warmup"], g["repeats"], g["rounds"]

"""The grid of kernel shapes a calibration times: every kernel family of one forward pass of the model,
with its per-GPU shapes. `full` is sized for one H100/H200-class GPU in a few minutes; `small` runs on a
CPU with a tiny model in seconds and exercises the same code paths."""
from __future__ import annotations

from costmodels.catalog import ModelShape
from costmodels.profile import ELEMENTWISE_PER_LAYER, ELEMENTWISE_PER_STEP, attention_heads, gemm_shapes

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
    "warmup": 3, "repeats": 15, "rounds": 3,   # a CPU shared with other load: see calibration.run.capture
}


def design(model: ModelShape, tp: int, size: str) -> list[dict]:
    """Grid points as measurement rows without timings (family, op and shape columns)."""
    g = FULL if size == "full" else SMALL
    heads, kv_heads, head_dim = attention_heads(model, tp)
    attn = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}
    points = []
    for op, (n, k) in gemm_shapes(model, tp).items():
        for m in g["gemm_m"]:
            points.append({"family": "gemm", "op": op, "m": m, "n": n, "k": k})
    for b in g["prefill_b"]:
        for new in g["prefill_new"]:
            if b * new <= g["prefill_max_tokens"]:
                points.append({"family": "prefill_attn", "batch_size": b, "new_tokens": new,
                               "cached_tokens": 0, **attn})
    for b, new, cached in g["cached"]:
        points.append({"family": "prefill_attn", "batch_size": b, "new_tokens": new, "cached_tokens": cached,
                       **attn})
    for b in g["decode_b"]:
        for ctx in g["decode_ctx"]:
            if b * ctx <= g["decode_max_kv_tokens"]:
                points.append({"family": "decode_attn", "batch_size": b, "context_len": ctx, **attn})
    for ctxs in g["mixed"]:
        points.append({"family": "decode_attn", "op": "mixed", "batch_size": len(ctxs),
                       "context_len": sum(ctxs) / len(ctxs), "batch": str(ctxs), **attn})
    for op in sorted(set(ELEMENTWISE_PER_LAYER) | set(ELEMENTWISE_PER_STEP)):
        for m in g["elementwise_m"]:
            points.append({"family": "elementwise", "op": op, "m": m, "n": model.hidden_size})
    for m in g["sampling_m"]:
        points.append({"family": "sampling", "m": m, "n": model.vocab_size // tp})
    for family in ("layer", "iteration"):
        for prefill, decode in g["steps"]:
            points.append({"family": family, "batch": str({"prefill": [list(p) for p in prefill],
                                                            "decode": decode}).replace("'", '"')})
    return points


def timing_settings(size: str) -> tuple[int, int, int]:
    """(warm-up runs, timed runs, passes over the grid the timed runs are split over)."""
    g = FULL if size == "full" else SMALL
    return g["warmup"], g["repeats"], g["rounds"]

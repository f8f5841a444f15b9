"""What a sum of kernel timings misses: per-layer launch gaps and per-step / per-request CPU overhead,
fitted from whole-layer and whole-iteration timings; and roofline-prior curves for the kernel families a
measurement source lacks (the published tables have no elementwise or sampling timings)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from costmodels.catalog import DTYPE_BYTES, ModelShape, get_gpu
from costmodels.profile import LogGrid, ProfileCostModel, decode_coords
from costmodels.roofline import Efficiencies

PRIOR_M_KNOTS = np.array([1, 4, 16, 64, 256, 1024, 4096, 16384, 65536], dtype=float)


def prior_family(name: str, model: ModelShape, gpu_name: str, tp: int, dtype: str) -> LogGrid:
    """Bandwidth-bound roofline curve over tokens (or sampled sequences) for a family without data."""
    gpu, e, dt = get_gpu(gpu_name), Efficiencies(), DTYPE_BYTES[dtype]
    h, hd = model.hidden_size, model.head_dim
    q_dim, kv_dim = model.num_heads * hd // tp, max(1, model.num_kv_heads // tp) * hd
    bytes_per_token = {  # read + write of each tensor, per token
        "elementwise_rmsnorm": 2 * h * dt, "elementwise_residual_add": 3 * h * dt,
        "elementwise_silu_mul": 3 * model.intermediate_size // tp * dt,
        "elementwise_rotary": 2 * (q_dim + kv_dim) * dt, "elementwise_embedding": 2 * h * dt,
        "sampling": model.vocab_size // tp * (dt + 4 * 4),  # bf16 logits -> fp32 probs, noise, argmax
    }
    if name not in bytes_per_token:
        raise ValueError(f"no roofline prior for family {name!r}")
    launches = 4 if name == "sampling" else 1
    t = PRIOR_M_KNOTS * bytes_per_token[name] / (gpu.hbm_bytes_per_s * e.elementwise_memory) \
        + launches * e.kernel_launch_s
    return LogGrid(("m",), (np.log(PRIOR_M_KNOTS),), np.log(t), (1.0,))


def _shape(batch: str) -> tuple[list, list]:
    s = json.loads(batch)
    return [tuple(p) for p in s["prefill"]], list(s["decode"])


def _layer_kernels_s(cm: ProfileCostModel, prefill: list, decode: list) -> float:
    pf = np.asarray(prefill, dtype=float).reshape(-1, 2)
    t = cm.dense_layer_s(int(pf[:, 0].sum()) + len(decode))
    if len(pf):
        t += cm.prefill_layer_s([(int(n), int(c)) for n, c in pf])
    if decode:
        t += cm.decode_attn(*decode_coords(np.asarray(decode, dtype=float)))
    return t


def fit_overheads(profile: dict, frame: pd.DataFrame, model: ModelShape) -> tuple[dict, dict]:
    """(overheads for the profile, composition report). Without whole-step timings: the prior's figures."""
    layers = frame[frame["family"] == "layer"]
    steps = frame[frame["family"] == "iteration"]
    e = Efficiencies()
    if not len(steps):
        return ({"per_step_s": e.per_step_s, "per_request_s": e.per_request_s, "per_layer_s": 0.0,
                 "source": "roofline prior (vLLM-like CPU overheads); no whole-iteration timings in the "
                           "measurements: refit against engine traces"}, {})
    zero = dict(profile, overheads={"per_step_s": 0.0, "per_request_s": 0.0, "per_layer_s": 0.0})
    cm = ProfileCostModel(zero, model, None, profile["tp"], profile["dtype"])
    report = {}
    per_layer_s = 0.0
    if len(layers):
        meas = layers["latency_s"].to_numpy()
        pred = np.array([_layer_kernels_s(cm, *_shape(b)) for b in layers["batch"]])
        per_layer_s = max(0.0, float(np.median(meas - pred)))
        report["layer_kernel_sum_error_pct"] = _errors(pred, meas)
    meas = steps["latency_s"].to_numpy()
    shapes = [_shape(b) for b in steps["batch"]]
    kernels = np.array([cm.step_time_s(p, d) for p, d in shapes]) + model.num_layers * per_layer_s
    num_seqs = np.array([len(p) + len(d) for p, d in shapes], dtype=float)
    (per_step_s, per_request_s), _ = nnls(np.column_stack([np.ones_like(num_seqs), num_seqs]), meas - kernels)
    report["iteration_kernel_sum_error_pct"] = _errors(kernels, meas)
    report["iteration_with_overheads_error_pct"] = _errors(kernels + per_step_s + per_request_s * num_seqs, meas)
    return ({"per_step_s": float(per_step_s), "per_request_s": float(per_request_s), "per_layer_s": per_layer_s,
             "source": f"fitted to {len(layers)} whole-layer and {len(steps)} whole-iteration timings "
                       f"(eager torch in calibration.capture; refit against engine traces)"}, report)


def _errors(pred: np.ndarray, meas: np.ndarray) -> list[float]:
    """Signed percentage error of each prediction."""
    return [round(float(x), 1) for x in (pred / meas - 1.0) * 100]

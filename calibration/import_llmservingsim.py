"""Import LLMServingSim's per-layer timings of vLLM's own kernels (its `profiler/perf/<GPU>/<model>/<variant>/`
folders, MIT) into the measurement format, so `calibration.fit` builds a profile of that GPU from them.

    python -m calibration.import_llmservingsim PROFILER_DIR --out DIR [--model NAME] [--gpu NAME] [--tp 1]
                                               [--fit PROFILE.json]

Read: meta.yaml (vLLM version, GPU, model, engine settings), tp<N>/dense.csv (layer, tokens, time_us: one
decoder layer's qkv/o/gate_up/down projections, norms, rotary, activation, embedding), tp<N>/attention.csv
(prefill_chunk, kv_prefill, n_decode, kv_decode, time_us), tp<N>/per_sequence.csv (lm_head, sampler over
sequences). Mapped: the four projections to GEMM rows of the model's shapes (N, K from its config), layer
norm / rotary / act_fn / embedding to elementwise rows, decode-only attention rows to decode_attn, prefill-only
rows to prefill_attn, lm_head to the lm_head GEMM, sampler to sampling. The
mixed prefill+decode attention rows (one varlen kernel over both, as vLLM runs a mixed step) become the
profile's `mixed_attn` grid: what the mixed kernel takes beyond the decode-only and prefill-only kernels
of its parts, over (decodes, decode context, prefill tokens), as measured at the profiler's grid points
with no cached prefill (on FlashAttention 2 the decodes lose their grouped-query fold in a mixed step:
costmodels/attention_kernel.py). The timings were taken in eager mode (enforce_eager): each includes its
kernel launch, which CUDA graphs remove in a served engine.
"""
from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pandas as pd
import yaml

import json
import math

import numpy as np

from calibration import measurements
from commandline.argtypes import positive_int
from commandline.exits import refuse, run_main
from commandline.outputs import OutputError, out_dir, out_file
from commandline.parser import Parser
from costmodels.catalog import CatalogError, ModelShape, get_gpu, get_model
from costmodels.profile import LogGrid, attention_heads, gemm_shapes

GEMMS = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}
ELEMENTWISE = {"layernorm": "rmsnorm", "rotary_emb": "rotary", "act_fn": "silu_mul", "embedding": "embedding"}
MODEL_NAMES = {"meta-llama/Llama-3.1-8B": "llama-3.1-8b", "meta-llama/Meta-Llama-3-8B": "llama-3-8b"}
GPU_NAMES = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000-server", "H100": "h100-sxm", "A100": "a100-80gb"}


class ProfilerFolderError(ValueError):
    """A profiler folder that cannot be read; the message names the file."""


def _csv(path: Path, need: set) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise ProfilerFolderError(f"{path}: no such file") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ProfilerFolderError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if not need <= set(df.columns):
        raise ProfilerFolderError(f"{path}: lacks {', '.join(sorted(need - set(df.columns)))}")
    return df


def read_meta(folder: Path) -> dict:
    """The profiler folder's meta.yaml (vLLM version, GPU, model, engine settings) as a mapping."""
    path = Path(folder) / "meta.yaml"
    try:
        meta = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ProfilerFolderError(f"{path}: no such file (not an LLMServingSim profiler folder)") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ProfilerFolderError(f"{path}: unreadable ({str(e).splitlines()[0]})") from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise ProfilerFolderError(f"{path}: not a mapping of keys to values")
    return meta


def import_profiler(folder: Path, model: ModelShape, tp: int = 1) -> tuple[list[dict], dict]:
    folder = Path(folder)
    meta = read_meta(folder)
    d = folder / f"tp{tp}"
    dense = _csv(d / "dense.csv", {"layer", "tokens", "time_us"})
    attn = _csv(d / "attention.csv", {"prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"})
    per_seq = _csv(d / "per_sequence.csv", {"layer", "sequences", "time_us"})
    shapes, e = gemm_shapes(model, tp), 2.0
    heads, kv_heads, hd = attention_heads(model, tp)
    h, q, kvw, width = model.hidden_size, heads * hd, kv_heads * hd, model.intermediate_size // tp
    rows = []
    for layer, tokens, us in dense[["layer", "tokens", "time_us"]].itertuples(index=False):
        s = float(us) * 1e-6
        if layer in GEMMS:
            n, k = shapes[GEMMS[layer]]
            rows.append({"family": "gemm", "op": GEMMS[layer], "m": int(tokens), "n": n, "k": k, "latency_s": s,
                         "flops": 2.0 * tokens * n * k, "bytes": e * (tokens * k + n * k + tokens * n), "status": "ok"})
        elif layer in ELEMENTWISE:   # bytes each op reads and writes per token (16-bit activations)
            per_token = {"rmsnorm": 4 * h, "rotary": 2 * (q + kvw), "silu_mul": 3 * width, "embedding": 2 * h}
            rows.append({"family": "elementwise", "op": ELEMENTWISE[layer], "m": int(tokens), "latency_s": s,
                         "bytes": e * tokens * per_token[ELEMENTWISE[layer]], "status": "ok"})
    head = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": hd}
    for chunk, kvp, nd, kvd, us in attn[["prefill_chunk", "kv_prefill", "n_decode", "kv_decode",
                                          "time_us"]].itertuples(index=False):
        s = float(us) * 1e-6
        if chunk == 0 and nd > 0:
            rows.append({"family": "decode_attn", "batch_size": int(nd), "context_len": float(kvd), "latency_s": s,
                         "flops": 4.0 * hd * heads * nd * kvd, "bytes": e * hd * nd * (2 * kv_heads * kvd + 2 * heads),
                         "status": "ok", **head})
        elif nd == 0 and chunk > 0:
            rows.append({"family": "prefill_attn", "batch_size": 1, "new_tokens": int(chunk),
                         "cached_tokens": int(kvp), "latency_s": s,
                         "flops": 2.0 * hd * heads * chunk * (2 * kvp + chunk + 1),
                         "bytes": e * hd * (chunk * 2 * heads + (chunk + kvp) * 2 * kv_heads), "status": "ok", **head})
    n, k = shapes["lm_head"]
    for layer, seqs, us in per_seq[["layer", "sequences", "time_us"]].itertuples(index=False):
        s = float(us) * 1e-6
        if layer == "lm_head":
            rows.append({"family": "gemm", "op": "lm_head", "m": int(seqs), "n": n, "k": k, "latency_s": s,
                         "flops": 2.0 * seqs * n * k, "bytes": e * (seqs * k + n * k + seqs * n), "status": "ok"})
        elif layer == "sampler":
            rows.append({"family": "sampling", "m": int(seqs), "latency_s": s, "status": "ok",
                         "bytes": 2 * 4.0 * seqs * model.vocab_size})   # fp32 logits read and written
    if not rows:
        raise ProfilerFolderError(f"{d}: no rows of a known layer")
    info = {"source": "llmservingsim profiler", "model": model.name, "gpu": meta.get("hardware"),
            "device_name": meta.get("gpu"), "tp": tp, "dtype": "bf16",
            "framework": f"vllm {meta.get('vllm_version')}", "engine_effective": meta.get("engine_effective"),
            "note": "eager-mode timings (enforce_eager): each includes its kernel launch",
            "publisher": "casys-kaist/LLMServingSim (MIT), profiler/perf",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "folder": str(folder)}
    return rows, info


# The excess of a mixed kernel over its parts is at most noise where the parts already cover it (a handful
# of decodes); the grid is in log time, so those cells hold this floor: a tenth of a microsecond, nothing.
MIXED_FLOOR_S = 1e-7


def mixed_attention_grid(attention: pd.DataFrame) -> LogGrid | None:
    """The `mixed_attn` family: per layer, a mixed kernel's time less the decode-only kernel (same decodes
    and context) and the prefill-only kernel (same chunk, no cached tokens), at every (decodes, context,
    chunk) of the profiler's grid that has all three; the largest complete tensor grid of powers of two.
    None when the folder has no such rows."""
    a = attention[attention["kv_prefill"] == 0]
    dec = a[a["prefill_chunk"] == 0].set_index(["n_decode", "kv_decode"])["time_us"]
    pre = a[a["n_decode"] == 0].set_index("prefill_chunk")["time_us"]
    mixed = a[(a["prefill_chunk"] > 0) & (a["n_decode"] > 0)]
    if not len(mixed):   # (an empty frame's boolean masks below would select columns, not rows)
        return None
    pow2 = lambda v: v > 0 and (int(v) & (int(v) - 1)) == 0   # noqa: E731
    mixed = mixed[mixed["n_decode"].map(pow2) & mixed["kv_decode"].map(pow2) & mixed["prefill_chunk"].map(pow2)]
    extra = {}
    for nd, kvd, chunk, us in mixed[["n_decode", "kv_decode", "prefill_chunk", "time_us"]].itertuples(index=False):
        if (nd, kvd) in dec.index and chunk in pre.index:
            extra[(int(nd), int(kvd), int(chunk))] = max((us - dec[(nd, kvd)] - pre[chunk]) * 1e-6, MIXED_FLOOR_S)
    axes = [sorted({k[i] for k in extra}) for i in range(3)]
    # drop the knots that leave holes (the largest decode count may lack long contexts, and so on)
    while axes and all(axes) and len(extra) < math.prod(len(x) for x in axes):
        holes = [sum(1 for k in _product(axes) if k not in extra and k[i] == v) for i in range(3) for v in axes[i]]
        worst = int(np.argmax(holes))
        for i in range(3):
            if worst < len(axes[i]):
                axes[i].pop(worst)
                break
            worst -= len(axes[i])
    if not axes or not all(len(x) >= 2 for x in axes):
        return None
    values = np.array([extra[k] for k in _product(axes)]).reshape([len(x) for x in axes])
    # beyond the grid: linear in decodes and in context (the re-read KV grows with both), flat in chunk
    return LogGrid(("decode_sequences", "decode_context", "prefill_tokens"),
                   tuple(np.log(np.asarray(x, dtype=float)) for x in axes), np.log(values), (1.0, 1.0, 0.0))


def _product(axes):
    return [(x, y, z) for x in axes[0] for y in axes[1] for z in axes[2]]


# The step a served vLLM 0.19 engine takes over these kernels adds no CPU time of its own: async scheduling
# (on by default on CUDA) prepares step n+1 on the CPU while the GPU runs step n, so the CPU's per-step and
# per-sequence work hides behind the kernels (the roofline prior's rule: max(GPU, CPU), and here the GPU's
# 10-90 ms is far above the prior's 0.4 ms + 6 us a sequence); and the eager timings already include each
# kernel's launch, which the served engine's CUDA graphs remove.
SERVED_OVERHEADS = {"per_step_s": 0.0, "per_request_s": 0.0, "per_layer_s": 0.0,
                    "source": "none beyond the eager kernel timings: vLLM V1's async scheduling overlaps the "
                              "CPU's step with the GPU's, and each eager timing includes its launch"}


def finish_profile(profile_path: Path, folder: Path, tp: int = 1) -> bool:
    """Complete a profile fitted from the profiler folder: the `mixed_attn` grid (True when the folder has
    mixed rows) and the served engine's overheads (SERVED_OVERHEADS)."""
    grid = mixed_attention_grid(_csv(Path(folder) / f"tp{tp}" / "attention.csv",
                                     {"prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"}))
    profile = json.loads(Path(profile_path).read_text())
    profile["overheads"] = dict(SERVED_OVERHEADS)
    if grid is not None:
        profile["families"]["mixed_attn"] = grid.to_dict()
        profile.setdefault("family_sources", {})["mixed_attn"] = "measured (mixed kernel less its parts)"
    Path(profile_path).write_text(json.dumps(profile, indent=1) + "\n")
    return grid is not None


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m calibration.import_llmservingsim", description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="profiler/perf/<GPU>/<model>/<variant>/ (with meta.yaml, tp<N>/)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", help="catalog name or config.json (default: meta.yaml's model)")
    ap.add_argument("--gpu", help="catalog GPU name (default: meta.yaml's hardware)")
    ap.add_argument("--tp", type=positive_int, default=1)
    ap.add_argument("--fit", type=Path, metavar="PROFILE.json", help="also fit and write this profile")
    args = ap.parse_args(argv)
    try:
        out_dir(args.out, "--out")
        if args.fit:
            out_file(args.fit, "--fit")
        if not args.folder.is_dir():
            raise ProfilerFolderError(f"{args.folder}: no such profiler folder")
        meta = read_meta(args.folder)
        for flag, key in (("--model", "model"), ("--gpu", "hardware")):
            if not getattr(args, flag[2:]) and not meta.get(key):
                raise ProfilerFolderError(f"{args.folder / 'meta.yaml'}: no '{key}'; give {flag}")
        model = get_model(args.model or MODEL_NAMES.get(str(meta["model"]), str(meta["model"])))
        gpu = get_gpu(args.gpu or GPU_NAMES.get(str(meta["hardware"]), str(meta["hardware"])))
        rows, info = import_profiler(args.folder, model, args.tp)
    except (CatalogError, ProfilerFolderError, OutputError) as e:
        return refuse(e)
    info["gpu"] = gpu.name
    info["command"] = "python -m calibration.import_llmservingsim " + " ".join(sys.argv[1:] if argv is None else argv)
    path = measurements.write(args.out, rows, info)
    print(f"wrote {path}: {pd.Series([r['family'] for r in rows]).value_counts().to_dict()}")
    if args.fit:
        from calibration import fit
        rc = fit.main([str(args.out), "--out", str(args.fit), "--report-dir", str(args.out)])
        if rc == 0 and finish_profile(args.fit, args.folder, args.tp):
            print(f"{args.fit}: mixed prefill+decode attention from the profiler's mixed rows (mixed_attn)")
        return rc
    return 0


if __name__ == "__main__":
    run_main(main, kept="nothing: the measurements are written once every layer is read")

"""Import NVIDIA's published kernel tables (aiconfigurator, measured with vLLM kernels) into the
measurement format, for one model's shapes, so `calibration.fit` builds a profile for a GPU we do not have.

    python -m calibration.import_aic --gpu h200_sxm --model llama-3-8b --out DIR \
        [--root /work/shared/kernel-timings/aiconfigurator] [--tp 1] [--dtype bf16] [--vllm VERSION]

Layout read: ROOT/<gpu>/{gemm,attention}/vllm/<version>/*.parquet (as in the repository and in the
`aiconfigurator-core` package's systems/data). Kept: bf16 GEMMs whose N and K bracket the model's GEMM
shapes (the fit interpolates between them); prefill and decode attention rows with the model's per-GPU
heads, full attention (no sliding window), bf16 KV cache. Duplicate shapes (0.19.0 and 0.19.1 rows) are
merged by their median. Rows faster than the GPU's datasheet peak FLOP/s or bandwidth are timing bugs
and are dropped (counted in meta.json; --keep-above-peak keeps them). The tables have no elementwise,
sampling or whole-step timings.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibration import measurements
from commandline.argtypes import positive_int
from commandline.exits import refuse, run_main
from costmodels.modelargs import check_tp, model_arg
from commandline.outputs import OutputError, out_dir, out_file
from commandline.parser import Parser
from costmodels.catalog import DTYPE_BYTES, GPUS, CatalogError, ModelShape
from costmodels.profile import attention_heads, gemm_shapes

TABLE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8"}


def default_root() -> Path | None:
    """systems/data of an installed aiconfigurator-core package, if any."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"
    return None


def newest_version(root: Path, gpu: str) -> str:
    """The newest vLLM version folder with GEMM tables (the installed package ships 0.24.0, the copy
    beside the repository 0.19.0); 0.19.0 when there is none, so the error names the missing table."""
    from costmodels.aic import version_key
    base = root / gpu / "gemm" / "vllm"
    found = [p.name for p in base.iterdir() if (p / "gemm_perf.parquet").exists()] if base.is_dir() else []
    return max(found, key=version_key) if found else "0.19.0"


def bracket(available: np.ndarray, targets: list[int]) -> list[int]:
    """For each target, the nearest available value at or below it and at or above it."""
    available = np.unique(available)
    keep = set()
    for t in targets:
        below, above = available[available <= t], available[available >= t]
        keep.update(int(v) for v in (below[-1:].tolist() + above[:1].tolist()))
    return sorted(keep)


def _read(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise CatalogError(f"{path}: no such kernel table")
    try:
        return pd.read_parquet(path)
    except ImportError:
        raise CatalogError(f"{path}: reading parquet needs pyarrow (pip install 'batchsim[calibrate]')") from None


def gemm_rows(table: pd.DataFrame, model: ModelShape, tp: int, dtype: str) -> list[dict]:
    g = table[table["gemm_dtype"] == TABLE_DTYPES[dtype]]
    shapes = gemm_shapes(model, tp).values()
    ns = bracket(g["n"].to_numpy(), [n for n, _ in shapes])
    ks = bracket(g["k"].to_numpy(), [k for _, k in shapes])
    g = g[g["n"].isin(ns) & g["k"].isin(ks)]
    merged = g.groupby(["m", "n", "k"], as_index=False)["latency"].median()
    e = DTYPE_BYTES[dtype]
    return [{"family": "gemm", "op": "", "m": m, "n": n, "k": k, "latency_s": ms / 1e3, "flops": 2.0 * m * n * k,
             "bytes": float((m * k + n * k + m * n) * e), "status": "ok"}
            for m, n, k, ms in merged.itertuples(index=False)]


def attention_rows(context: pd.DataFrame, generation: pd.DataFrame, model: ModelShape, tp: int,
                   dtype: str) -> list[dict]:
    heads, kv_heads, head_dim = attention_heads(model, tp)
    attn = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}

    def select(t):
        return t[(t["num_heads"] == heads) & (t["num_key_value_heads"] == kv_heads) & (t["head_dim"] == head_dim)
                 & (t["window_size"] == 0) & (t["kv_cache_dtype"] == TABLE_DTYPES[dtype])]
    rows = []
    c = select(context)
    c = c[c["step"] == 0].groupby(["batch_size", "isl"], as_index=False)["latency"].median()
    e = DTYPE_BYTES[dtype]
    for b, isl, ms in c.itertuples(index=False):  # causal: 2 matmuls x 2 FLOP x hd x heads x L(L+1)/2
        rows.append({"family": "prefill_attn", "batch_size": b, "new_tokens": isl, "cached_tokens": 0,
                     "latency_s": ms / 1e3, "status": "ok", "flops": 2.0 * head_dim * heads * b * isl * (isl + 1),
                     "bytes": float(e * head_dim * b * isl * (2 * heads + 2 * kv_heads)), **attn})
    g = select(generation).groupby(["batch_size", "step"], as_index=False)["latency"].median()
    for b, step, ms in g.itertuples(index=False):  # `step` tokens are cached; the decoded one makes step + 1
        rows.append({"family": "decode_attn", "batch_size": b, "context_len": step + 1, "latency_s": ms / 1e3,
                     "status": "ok", "flops": 4.0 * head_dim * heads * b * (step + 1),
                     "bytes": float(e * head_dim * b * (2 * kv_heads * (step + 1) + 2 * heads)), **attn})
    if not rows:
        raise CatalogError(f"no attention rows for {heads} heads / {kv_heads} KV heads / head dim {head_dim} "
                           f"with {dtype} KV cache")
    return rows


def above_peak(rows: list[dict], gpu_name: str) -> tuple[list[dict], dict]:
    """(rows a real kernel can achieve, what was set aside): a row faster than the catalog GPU's
    datasheet peak FLOP/s or HBM bandwidth cannot be a correct timing of that shape."""
    gpu = GPUS.get(gpu_name)
    if gpu is None:
        return rows, {}
    kept, dropped = [], {}
    for r in rows:
        pct = max(r["flops"] / r["latency_s"] / gpu.bf16_flops_per_s, r["bytes"] / r["latency_s"] / gpu.hbm_bytes_per_s)
        if pct <= 1.0:
            kept.append(r)
            continue
        d = dropped.setdefault(r["family"], {"rows": 0, "max_fraction_of_peak": 0.0})
        d["rows"] += 1
        d["max_fraction_of_peak"] = round(max(d["max_fraction_of_peak"], pct), 2)
    return kept, dropped


def import_tables(root: Path, gpu: str, model: ModelShape, tp: int, dtype: str, version: str,
                  keep_above_peak: bool = False) -> tuple[list, dict]:
    base = root / gpu
    gemm_dir, attn_dir = base / "gemm" / "vllm" / version, base / "attention" / "vllm" / version
    gemm = _read(gemm_dir / "gemm_perf.parquet")
    context = _read(attn_dir / "context_attention_perf.parquet")
    generation = _read(attn_dir / "generation_attention_perf.parquet")
    rows = gemm_rows(gemm, model, tp, dtype) + attention_rows(context, generation, model, tp, dtype)
    catalog_gpu = gpu.replace("_", "-")
    kept, dropped = above_peak(rows, catalog_gpu)
    if not keep_above_peak:
        rows = kept
    collection = {}
    for d in (gemm_dir, attn_dir):
        if (d / "collection_meta.yaml").exists():
            collection[d.parent.parent.name] = yaml.safe_load((d / "collection_meta.yaml").read_text())
    meta = {"source": "aiconfigurator", "model": model.name, "model_shape": dataclasses.asdict(model),
            "gpu": catalog_gpu, "tp": tp, "dtype": dtype, "device_name": str(gemm["device"].iloc[0]),
            "framework": f"vllm {version}", "table_versions": sorted(set(context["version"]) | set(gemm["version"])),
            "kernel_sources": sorted(set(gemm["kernel_source"]) | set(context["kernel_source"])),
            "tables": {"root": str(root), "gpu_dir": gpu, "version_dir": version}, "collection_meta": collection,
            "publisher": "NVIDIA ai-dynamo/aiconfigurator (Apache-2.0), systems/data",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "grid": "published tables",
            "rows_above_datasheet_peak": dropped, "rows_above_peak_kept": keep_above_peak}
    return rows, meta


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m calibration.import_aic", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="table folder name, e.g. h200_sxm or h100_sxm")
    ap.add_argument("--model", required=True, help="catalog name or path of a Hugging Face config.json")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--root", type=Path, help="tables root (default: installed aiconfigurator_core data)")
    ap.add_argument("--tp", type=positive_int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=sorted(TABLE_DTYPES))
    ap.add_argument("--vllm", help="vLLM version folder of the tables (default: the newest with GEMM tables)")
    ap.add_argument("--keep-above-peak", action="store_true",
                    help="keep rows faster than the GPU's datasheet peak (dropped by default: timing bugs)")
    ap.add_argument("--fit", type=Path, metavar="PROFILE.json", help="also fit and write this profile")
    args = ap.parse_args(argv)
    try:   # the arguments themselves first, whatever tables are installed
        model = model_arg(args.model)
        check_tp(model, args.tp)
        out_dir(args.out)
        if args.fit:
            out_file(args.fit, "--fit")
    except (CatalogError, OutputError) as e:
        return refuse(e)
    root = args.root or default_root()
    if root is None:
        ap.error("--root: no tables root given and no aiconfigurator_core package installed")
    if not root.is_dir():
        return refuse(f"--root {root}: no such folder")
    if not (root / args.gpu).is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir())
        return refuse(f"--gpu {args.gpu}: no such kernel table folder in {root} "
                      f"(there: {', '.join(known) or 'none'})")
    version = args.vllm or newest_version(root, args.gpu)
    try:
        rows, meta = import_tables(root, args.gpu, model, args.tp, args.dtype, version, args.keep_above_peak)
    except (CatalogError, OutputError) as e:
        return refuse(e)
    meta["command"] = "python -m calibration.import_aic " + " ".join(sys.argv[1:] if argv is None else argv)
    path = measurements.write(args.out, rows, meta)
    counts = pd.Series([r["family"] for r in rows]).value_counts().to_dict()
    for family, d in meta["rows_above_datasheet_peak"].items():
        print(f"warning: {d['rows']} {family} rows run faster than the {meta['gpu']} datasheet peak (up to "
              f"{100 * d['max_fraction_of_peak']:.0f}%): {'kept' if args.keep_above_peak else 'dropped'}")
    print(f"wrote {path}: {counts}")
    if args.fit:
        from calibration import fit
        return fit.main([str(args.out), "--out", str(args.fit), "--report-dir", str(args.out)])
    return 0


if __name__ == "__main__":
    run_main(main, (CatalogError,))

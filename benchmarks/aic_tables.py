"""Held-out error of the table-built cost model per family, GPU and framework, and the roofline sanity
table (weights-only decode floor against predicted batch-1 decode), for the README.

    python -m benchmarks.aic_tables            # needs the [aic] extra
"""
from __future__ import annotations

import sys

import numpy as np

from commandline.exits import run_main
from commandline.parser import Parser
from costmodels import RooflineCostModel, get_gpu, get_model, load_cost_model
from costmodels.aic import GPU_DIRS, build_grids, tables_root
from costmodels.catalog import CatalogError
from costmodels.deployment import Deployment

LAYOUTS = tuple((name, Deployment()) for name in ("meta-llama/Meta-Llama-3.1-8B", "Qwen/Qwen3-30B-A3B",
                                                   "openai/gpt-oss-120b", "deepseek-ai/DeepSeek-V3")) + (
    ("meta-llama/Meta-Llama-3.1-70B", Deployment(tensor_parallel_size=4)),          # TP all-reduce
    ("deepseek-ai/DeepSeek-V3", Deployment(data_parallel_size=8, enable_expert_parallel=True)))  # EP8
FRAMEWORKS = ("vllm", "sglang", "trtllm")


def held_out_table() -> list[str]:
    lines = ["| GPU | framework | family | rows held out | median | p90 |", "|---|---|---|---|---|---|"]  # p90: the worst model
    for gpu in GPU_DIRS:
        for fw in FRAMEWORKS:
            by_family: dict[str, list] = {}
            for name, layout in LAYOUTS:
                try:
                    grids = build_grids(get_model(name), get_gpu(gpu), layout, fw)
                except (CatalogError, KeyError, FileNotFoundError, ValueError) as e:
                    print(f"# {gpu} {fw} {name}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
                    continue
                for fam, f in grids["families"].items():
                    fam = "gemm" if fam.startswith("gemm") else fam
                    if f["held_out"].get("rows") and (fam != "gemm" or fam not in by_family):
                        by_family.setdefault(fam, []).append(f["held_out"])
            for fam, hs in sorted(by_family.items()):
                rows = sum(h["rows"] for h in hs)
                med = np.average([h["median_pct"] for h in hs], weights=[h["rows"] for h in hs])
                p90 = max(h["p90_pct"] for h in hs)   # the worst layout's
                lines.append(f"| {gpu} | {fw} | {fam} | {rows} | {med:.1f}% | {p90:.1f}% |")
    return lines


SANITY = (("meta-llama/Meta-Llama-3.1-8B", "h100-sxm", Deployment()),
          ("Qwen/Qwen3-32B", "h100-sxm", Deployment()),
          ("Qwen/Qwen3-30B-A3B", "h100-sxm", Deployment()),
          ("meta-llama/Meta-Llama-3.1-70B", "h200-sxm", Deployment(quantization="fp8")),
          ("meta-llama/Meta-Llama-3.1-70B", "h100-sxm", Deployment(tensor_parallel_size=2)),
          ("openai/gpt-oss-120b", "h100-sxm", Deployment()),
          ("openai/gpt-oss-120b", "h200-sxm", Deployment()),
          ("mistralai/Mixtral-8x7B-v0.1", "h100-sxm", Deployment(tensor_parallel_size=2)),
          ("deepseek-ai/DeepSeek-V3", "h200-sxm", Deployment(tensor_parallel_size=8)),
          ("deepseek-ai/DeepSeek-V3", "h200-sxm", Deployment(data_parallel_size=8, enable_expert_parallel=True)),
          ("meta-llama/Meta-Llama-3.1-8B", "b200-sxm", Deployment()),
          ("meta-llama/Meta-Llama-3.1-8B", "l40s", Deployment()))


def sanity_table() -> list[str]:
    lines = ["| model | GPU | layout | weights/GPU | floor (weights / HBM) | roofline bs-1 | tables bs-1 |",
             "|---|---|---|---|---|---|---|"]
    from costmodels.deployment import weight_bytes_per_gpu
    for name, gpu, d in SANITY:
        m, g = get_model(name), get_gpu(gpu)
        rf = RooflineCostModel(m, g, deployment=d)
        try:
            tab = f"{load_cost_model('aic', m, g, deployment=d).step_time_s(decode=[1024]) * 1e3:.2f} ms"
        except CatalogError as e:
            tab = f"- ({str(e)[:40]})"
        layout = f"tp{d.tp}" + (f" dp{d.data_parallel_size} ep{d.ep}" if d.ep > 1 else "") + f" {d.weight_format(m)}"
        lines.append(f"| {name} | {gpu} | {layout} | {weight_bytes_per_gpu(m, d) / 1e9:.1f} GB | "
                     f"{rf.weights_floor_s() * 1e3:.2f} ms | {rf.step_time_s(decode=[1024]) * 1e3:.2f} ms | {tab} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    Parser(prog="python -m benchmarks.aic_tables", description=__doc__.splitlines()[0]).parse_args(argv)
    if tables_root() is None:
        print("error: needs the [aic] extra (pip install -e '.[aic]')", file=sys.stderr)
        return 2
    print("\n".join(sanity_table()))
    print()
    print("\n".join(held_out_table()))
    return 0


if __name__ == "__main__":
    run_main(main, kept="the tables printed above")

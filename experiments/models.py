"""`python -m experiments.models [--hf] [--json]`: the names a sweep file's `model:` and `hardware:` accept.

Lists the catalog's models (shape, context length, weights), its GPUs (datasheet figures), the measured
profiles shipped for (model, GPU, TP, dtype), and how many Hugging Face ids it can read by name: this
package's configs of widely served models, and the [aic] extra's when installed (every one with --hf). A model name may also be an alias: the Instruct / Chat / base names of
the same model, with or without "Meta-" (costmodels/model_names.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from costmodels.catalog import GPUS, MODELS
from costmodels.model_names import AIC_INSTALL, aic_configs_dir, packaged_hf_ids, shipped_hf_ids
from costmodels.selection import shipped_profiles


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


def listing(show_hf: bool) -> dict:
    models = [{"name": m.name, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_heads,
               "kv_heads": m.num_kv_heads, "family": m.family, "max_model_len": m.max_model_len,
               "params_b": round(m.num_params / 1e9, 2)} for m in MODELS.values()]
    gpus = [{"name": g.name, "memory_gb": round(g.memory_bytes / 1e9), "bf16_tflops": round(g.bf16_flops_per_s / 1e12),
             "hbm_tb_per_s": round(g.hbm_bytes_per_s / 1e12, 2),
             # the share of that peak large GEMMs sustain, measured on the GPU (None: the prior's pooled share)
             "gemm_compute": g.gemm_compute} for g in GPUS.values()]
    hf = packaged_hf_ids()
    return {"models": models, "gpus": gpus, "profiles": shipped_profiles(),
            "aic_installed": aic_configs_dir() is not None, "hf_ids": hf if show_hf else [], "num_hf_ids": len(hf),
            "num_shipped_hf_ids": len(shipped_hf_ids())}


def text(data: dict) -> str:
    lines = ["Catalog models (model: NAME):"]
    lines += [f"  {m['name']:14s} {m['params_b']:>7.2f}B params, {m['layers']} layers, hidden {m['hidden']}, "
              f"{m['heads']} heads / {m['kv_heads']} KV, {m['family']}, context {m['max_model_len']:,}"
              for m in data["models"]]
    lines += ["  aliases: the Instruct / Chat / base names of these, with or without 'Meta-' and the organisation "
              "(meta-llama/Llama-3.1-8B-Instruct is llama-3.1-8b)", "", "GPUs (hardware: NAME):"]
    lines += [f"  {g['name']:10s} {g['memory_gb']:>4} GB, {g['bf16_tflops']:>5} dense BF16 TFLOP/s, "
              f"{g['hbm_tb_per_s']} TB/s HBM"
              + (f"; large GEMMs at {g['gemm_compute']:.2f} of that peak (measured)" if g["gemm_compute"] else "")
              for g in data["gpus"]]
    lines += ["", "Measured profiles shipped (chosen automatically for the same architecture, GPU, TP, dtype):"]
    lines += [f"  {p}" for p in data["profiles"]] or ["  none"]
    lines.append("")
    more = "" if data["aic_installed"] else f"; the [aic] extra ({AIC_INSTALL}) ships more"
    if data["hf_ids"]:
        lines += [f"Hugging Face ids shipped ({data['num_hf_ids']}, {data['num_shipped_hf_ids']} with this package, "
                  f"the rest with the [aic] extra{more}; aliases resolve here too):"]
        lines += [f"  {h}" for h in data["hf_ids"]]
    else:
        lines.append(f"Hugging Face ids: {data['num_hf_ids']} shipped ({data['num_shipped_hf_ids']} with this package, "
                     f"the rest with the [aic] extra{more}; --hf lists them); any config.json path works too.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m experiments.models", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf", action="store_true", help="list every Hugging Face id shipped (this package's and the [aic] extra's)")
    ap.add_argument("--json", action="store_true", help="print the listing as JSON")
    args = ap.parse_args(argv)
    data = listing(args.hf)
    try:
        print(json.dumps(data, indent=1) if args.json else text(data))
    except BrokenPipeError:   # `| head`
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

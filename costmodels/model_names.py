"""The names users type for a model, resolved to what the simulator knows: a catalog entry, or a Hugging
Face config.json this package ships (costmodels/hf_configs/: the shapes of widely served models) or the [aic]
extra ships.

People copy names from the Hub: `meta-llama/Llama-3.1-8B-Instruct`, `Meta-Llama-3-8B`, `Qwen2.5-7B-Instruct`.
An instruction-tuned checkpoint has its base model's architecture, and Meta wrote "Meta-" in front of some
names and not others, so each name is compared by a key without the organisation, the "Meta-" prefix, the
case and the -Instruct / -Chat / -hf / -Base suffixes.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

SUFFIXES = ("-instruct", "-chat", "-hf", "-base")
AIC_INSTALL = "pip install -e '.[aic]'"


def name_key(name: str) -> str:
    """'meta-llama/Meta-Llama-3.1-8B-Instruct' -> 'llama-3.1-8b'; 'Mixtral-8x7B-Instruct-v0.1' ->
    'mixtral-8x7b-v0.1' (the tuning's word may stand before a version)."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    if key.startswith("meta-"):
        key = key[len("meta-"):]
    words = key.split("-")
    kept = [w for i, w in enumerate(words) if i == 0 or f"-{w}" not in SUFFIXES]
    return "-".join(kept)


def aic_configs_dir() -> Path | None:
    """The folder of config.json files aiconfigurator-core ships, when the [aic] extra is installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "model_configs"
    return d if d.is_dir() else None


SHIPPED_CONFIGS = Path(__file__).resolve().parent / "hf_configs"


def config_dirs() -> list[Path]:
    """Where Hugging Face config.json files are looked up, in order: this package's, then the [aic] extra's."""
    return [SHIPPED_CONFIGS] + [d for d in (aic_configs_dir(),) if d is not None]


def _ids(folder: Path) -> list[str]:
    return sorted(p.name[: -len("_config.json")].replace("--", "/", 1) for p in folder.glob("*_config.json")
                  if not p.name.endswith("_hf_quant_config.json"))   # a quantised checkpoint's second file


def shipped_hf_ids() -> list[str]:
    """The Hugging Face ids whose shapes this package ships (no extra needed)."""
    return _ids(SHIPPED_CONFIGS)


def packaged_hf_ids() -> list[str]:
    """Every Hugging Face id a name resolves to without a path: this package's and the [aic] extra's."""
    return sorted(set().union(*(_ids(d) for d in config_dirs())))


def catalog_alias(name: str, catalog_names) -> str | None:
    """The catalog name `name` stands for (same key), or None."""
    key = name_key(name)
    return next((c for c in catalog_names if name_key(c) == key), None)


def packaged_alias(name: str) -> str | None:
    """The shipped Hugging Face id `name` stands for (same key), or None."""
    key = name_key(name)
    return next((h for h in packaged_hf_ids() if name_key(h) == key), None)


# A quantised checkpoint's id and its weight format (costmodels/deployment.py WEIGHT_BYTES): where its own config
# is not shipped, it is its base model with those weights (costmodels.catalog.get_model). RedHatAI's "-FP8-dynamic"
# and "-FP8-static" and the "-FP8" releases: FP8; RedHatAI's "-quantized.w4a16" (compressed-tensors, groups of 128)
# and the "-AWQ" / "-GPTQ-Int4" releases: 4-bit weights in groups of 128, which vLLM runs with its Marlin kernels;
# RedHatAI's "-quantized.w8a8": INT8 weights and activations (W8A8).
QUANTIZED_CHECKPOINTS = ((re.compile(r"[-_]fp8(?:[-_](?:dynamic|static))?(?=$|[-_])", re.IGNORECASE), "fp8"),
                         (re.compile(r"[-_]quantized\.w4a16(?=$|[-_])", re.IGNORECASE), "int4"),
                         (re.compile(r"[-_]quantized\.w8a8(?=$|[-_])", re.IGNORECASE), "int8"),
                         (re.compile(r"[-_](?:awq|gptq(?:[-_]int4)?)(?=$|[-_])", re.IGNORECASE), "int4"))


def quantized_base(name: str) -> tuple[str, str] | None:
    """'RedHatAI/phi-4-FP8-dynamic' -> ('RedHatAI/phi-4', 'fp8') (which resolves as microsoft/phi-4),
    'Qwen/Qwen2.5-7B-Instruct-AWQ' -> ('Qwen/Qwen2.5-7B-Instruct', 'int4'); None for other ids."""
    for pattern, weights in QUANTIZED_CHECKPOINTS:
        base = pattern.sub("", name)
        if base != name:
            return base, weights
    return None


def unknown_model_message(name: str, catalog_names) -> str:
    """One line for a name nothing resolves: what is known, and what to install or run to see more."""
    head = (f"unknown model {name!r}; catalog: {', '.join(catalog_names)}; nor one of the {len(packaged_hf_ids())} "
            f"Hugging Face ids shipped (python -m experiments.models --hf lists them); or a config.json path (a "
            f"folder holding one)")
    if aic_configs_dir() is None:
        return head + f"; the [aic] extra ({AIC_INSTALL}) ships more configs"
    return head

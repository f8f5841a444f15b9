"""The names users type for a model, resolved to what the simulator knows: a catalog entry, or a Hugging
Face config.json the [aic] extra ships.

People copy names from the Hub: `meta-llama/Llama-3.1-8B-Instruct`, `Meta-Llama-3-8B`, `Qwen2.5-7B-Instruct`.
An instruction-tuned checkpoint has its base model's architecture, and Meta wrote "Meta-" in front of some
names and not others, so each name is compared by a key without the organisation, the "Meta-" prefix, the
case and the -Instruct / -Chat / -hf / -Base suffixes.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

SUFFIXES = ("-instruct", "-chat", "-hf", "-base")
AIC_INSTALL = "pip install -e '.[aic]'"


def name_key(name: str) -> str:
    """'meta-llama/Meta-Llama-3.1-8B-Instruct' -> 'llama-3.1-8b'."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    if key.startswith("meta-"):
        key = key[len("meta-"):]
    stripped = True
    while stripped:
        stripped = False
        for s in SUFFIXES:
            if key.endswith(s):
                key, stripped = key[: -len(s)], True
    return key


def aic_configs_dir() -> Path | None:
    """The folder of config.json files aiconfigurator-core ships, when the [aic] extra is installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "model_configs"
    return d if d.is_dir() else None


def packaged_hf_ids() -> list[str]:
    """The Hugging Face ids whose config.json the [aic] extra ships ([] without it)."""
    d = aic_configs_dir()
    if d is None:
        return []
    return sorted(p.name[: -len("_config.json")].replace("--", "/", 1) for p in d.glob("*_config.json")
                  if not p.name.endswith("_hf_quant_config.json"))   # a quantised checkpoint's second file


def catalog_alias(name: str, catalog_names) -> str | None:
    """The catalog name `name` stands for (same key), or None."""
    key = name_key(name)
    return next((c for c in catalog_names if name_key(c) == key), None)


def packaged_alias(name: str) -> str | None:
    """The shipped Hugging Face id `name` stands for (same key), or None."""
    key = name_key(name)
    return next((h for h in packaged_hf_ids() if name_key(h) == key), None)


def unknown_model_message(name: str, catalog_names) -> str:
    """One line for a name nothing resolves: what is known, and what to install or run to see more."""
    head = (f"unknown model {name!r}; catalog: {', '.join(catalog_names)}; or a config.json path (a folder "
            f"holding one)")
    if aic_configs_dir() is None:
        return head + f"; Hugging Face ids need the [aic] extra ({AIC_INSTALL}), which ships their configs"
    return head + (f"; nor one of the {len(packaged_hf_ids())} Hugging Face ids the [aic] extra ships "
                   "(python -m experiments.models lists them)")

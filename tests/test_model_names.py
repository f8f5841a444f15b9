"""The names users type: aliases resolve, the listing command shows what is known, errors say what to install."""
from __future__ import annotations

import dataclasses

import pytest

from costmodels.catalog import CatalogError, get_model
from costmodels.model_names import name_key, unknown_model_message
from experiments import models


@pytest.mark.parametrize("typed, catalog", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"),
    ("Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("LLAMA-3-8B", "llama-3-8b"),
])
def test_instruct_base_and_meta_names_resolve_to_the_catalog(typed, catalog):
    assert get_model(typed).name == catalog


def test_name_key_drops_organisation_meta_prefix_case_and_tuning_suffixes():
    assert name_key("meta-llama/Meta-Llama-3.1-70B-Instruct") == "llama-3.1-70b"
    assert name_key("mistralai/Mistral-7B-Instruct") == "mistral-7b"


def test_unknown_model_names_the_catalog_and_the_extra(monkeypatch):
    import costmodels.model_names as names
    monkeypatch.setattr(names, "aic_configs_dir", lambda: None)
    msg = unknown_model_message("gpt-5", ["llama-3-8b"])
    assert "llama-3-8b" in msg and "[aic] extra" in msg and "pip install" in msg
    with pytest.raises(CatalogError, match=r"unknown model 'gpt-5'.*\[aic\]"):
        get_model("gpt-5")


def test_models_command_lists_models_gpus_profiles_and_says_how_to_get_hf_ids(capsys):
    assert models.main([]) == 0
    out = capsys.readouterr().out
    for name in ("llama-3.1-8b", "qwen2.5-7b", "h200-sxm", "l4", "llama-3-8b__h200-sxm__tp1__bf16"):
        assert name in out
    assert "Hugging Face ids" in out and "aliases" in out
    # what a GPU's GEMMs rest on: its own measured share of the peak where it has one
    assert "l40s" in out and "large GEMMs at 0.64 of that peak (measured)" in out


def test_models_command_lists_the_extras_hf_ids_when_installed(capsys):
    pytest.importorskip("aiconfigurator_core")
    assert models.main(["--hf"]) == 0
    out = capsys.readouterr().out
    assert "meta-llama/Meta-Llama-3.1-70B" in out and "_hf_quant" not in out
    assert get_model("meta-llama/Llama-3.1-70B-Instruct").num_layers == 80   # an alias of a shipped id


def test_widely_served_models_resolve_without_the_aic_extra(monkeypatch):
    # the shapes shipped in costmodels/hf_configs/ need no extra: a plain install names them as the Hub does
    import costmodels.model_names as names
    monkeypatch.setattr(names, "aic_configs_dir", lambda: None)
    assert get_model("meta-llama/Llama-3.1-70B-Instruct").num_layers == 80
    assert get_model("mistralai/Mixtral-8x7B-Instruct-v0.1").num_experts == 8   # "-Instruct" before a version
    fp8 = get_model("Qwen/Qwen3-30B-A3B-FP8")
    assert fp8.num_experts == 128 and fp8.quantization is not None
    assert get_model("Qwen/Qwen2.5-72B-Instruct").intermediate_size == 29568
    assert name_key("mistralai/Mixtral-8x7B-Instruct-v0.1") == "mixtral-8x7b-v0.1"


def test_every_shipped_config_parses_and_agrees_with_the_extras_copy():
    from costmodels.hfconfig import model_from_hf_config
    from costmodels.model_names import SHIPPED_CONFIGS, aic_configs_dir
    files = sorted(SHIPPED_CONFIGS.glob("*_config.json"))
    assert len(files) >= 30
    for f in files:
        m = model_from_hf_config(f)
        assert m.name == f.name[: -len("_config.json")].replace("--", "/", 1) and m.num_params > 1e8, f.name
        theirs = aic_configs_dir() and aic_configs_dir() / f.name
        if theirs and theirs.is_file():   # the shipped shapes are the [aic] extra's, trimmed to what is read
            assert dataclasses.replace(model_from_hf_config(theirs), name=m.name) == m, f.name


def test_llama_shaped_families_and_fp8_dynamic_checkpoints_resolve(monkeypatch):
    import costmodels.model_names as names
    monkeypatch.setattr(names, "aic_configs_dir", lambda: None)
    granite, phi4 = get_model("ibm-granite/granite-3.1-8b-instruct"), get_model("microsoft/phi-4")
    assert (granite.num_layers, granite.intermediate_size, phi4.num_kv_heads) == (40, 12800, 10)
    small = get_model("mistralai/Mistral-Small-3.1-24B-Instruct-2503")   # the decoder under text_config
    assert (small.num_layers, small.hidden_size, small.vocab_size) == (40, 5120, 131072)
    # RedHatAI's "-FP8-dynamic" checkpoints are their base model with FP8 weights, by name alone
    fp8 = get_model("RedHatAI/phi-4-FP8-dynamic")
    assert dataclasses.replace(fp8, quantization=None) == phi4 and fp8.quantization == "fp8"
    scout = get_model("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic")
    assert scout.quantization == "fp8" and scout.num_experts == 16
    assert get_model("Qwen/Qwen3-30B-A3B-FP8").quantization == "fp8_block"   # its own shipped config says so
    with pytest.raises(CatalogError, match="unknown model 'acme/Nothing-7B-FP8'"):
        get_model("acme/Nothing-7B-FP8")
    # 4-bit weight-only checkpoints (Marlin in vLLM) and W8A8 INT8 ones likewise
    assert get_model("RedHatAI/phi-4-quantized.w4a16").quantization == "int4"
    awq = get_model("Qwen/Qwen2.5-7B-Instruct-AWQ")
    assert (awq.name, awq.quantization) == ("qwen2.5-7b", "int4")
    assert get_model("RedHatAI/Llama-3.3-70B-Instruct-quantized.w8a8").quantization == "int8"

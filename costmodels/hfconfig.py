"""Read a Hugging Face config.json into a ModelShape: dense (Llama, Qwen, Mistral), MoE (Mixtral, Qwen3-MoE,
gpt-oss, Llama-4), MLA (DeepSeek-V2/V3) and OPT. An architecture it does not know, or a known family whose
config lacks a key it needs, is a one-line CatalogError naming it: never silently read as dense."""
from __future__ import annotations

import json
from pathlib import Path

from costmodels.catalog import CatalogError, ModelShape

# Llama-shaped decoders: Granite adds scalar multipliers, Phi-3/4 fuses qkv and gate_up (the same GEMM
# shapes), SmolLM3 drops rotary on some layers, Mistral-3 is a Mistral decoder under text_config beside a
# vision encoder (its weights, about 2% of Mistral-Small-3.1's, are not counted)
DENSE = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MiMoForCausalLM",
         "GraniteForCausalLM", "Phi3ForCausalLM", "SmolLM3ForCausalLM", "Mistral3ForConditionalGeneration"}
MOE = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM",
       "Llama4ForConditionalGeneration", "Llama4ForCausalLM"}
MLA = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}
OPT = {"OPTForCausalLM"}
KNOWN = DENSE | MOE | MLA | OPT
# checkpoint quantisation (quantization_config.quant_method) -> the weight format priced
QUANT_METHODS = {"fp8": "fp8", "mxfp4": "mxfp4", "modelopt_fp4": "nvfp4", "nvfp4": "nvfp4"}
# NVIDIA ModelOpt checkpoints (quant_method "modelopt", or none) name their format in quant_algo
MODELOPT_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4"}
# AWQ and GPTQ: 4-bit integer weights in groups, each group with a 16-bit scale and a 4-bit zero point; vLLM
# serves them with its Marlin kernels (awq_marlin, gptq_marlin), which dequantise in registers and multiply
# in 16 bits. Priced as the "int4" weight format (costmodels/deployment.py) for groups of 128 weights (AWQ's
# and most GPTQ checkpoints' size) or larger; smaller groups carry more scale bytes and are refused.
INT4_METHODS = ("awq", "gptq", "awq_marlin", "gptq_marlin")
MIN_INT4_GROUP = 128


class _Config(dict):
    """config.json values; a missing required key is a one-line error naming it and the family."""

    def __init__(self, data: dict, path: Path, family: str):
        super().__init__(data)
        self.path, self.family = path, family

    def need(self, *keys: str):
        for k in keys:
            if k in self:
                return _positive_int(self[k], k, self.path)
        raise CatalogError(f"{self.path}: config.json lacks required key {keys[0]!r} ({self.family} model)")

    def optional(self, key: str, default):
        v = self.get(key)
        return default if v is None else _positive_int(v, key, self.path)


def _positive_int(v, key: str, path: Path) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CatalogError(f"{path}: {key}: expected a positive integer, got {v!r}")
    return v


def packaged_config(hf_id: str) -> Path | None:
    """The config.json shipped for a Hugging Face id ("org/name"): this package's (costmodels/hf_configs/),
    else aiconfigurator-core's when the [aic] extra is installed; None when neither has it."""
    from costmodels.model_names import config_dirs
    if "/" not in hf_id:
        return None
    name = f"{hf_id.replace('/', '--')}_config.json"
    return next((d / name for d in config_dirs() if (d / name).is_file()), None)


def model_from_hf_config(path: Path) -> ModelShape:
    if Path(path).exists() and not Path(path).is_file():   # a pipe or a device would block the read
        raise CatalogError(f"{path}: not a regular file (expected a model's config.json)")
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such model config file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: not a valid JSON config ({e})") from None
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the model config ({e.strerror})") from None
    if not isinstance(raw, dict):
        raise CatalogError(f"{path}: expected a JSON object of model settings, got a JSON {type(raw).__name__}")
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    if arch is not None and arch not in KNOWN:
        raise CatalogError(f"{path}: architecture {arch!r} is not modelled; known: {', '.join(sorted(KNOWN))}")
    cfg = {**raw, **raw.get("text_config", {})}  # Llama-4 keeps the decoder under text_config
    name = raw.get("_name_or_path") or (Path(path).name.removesuffix("_config.json").replace("--", "/")
                                        if Path(path).name.endswith("_config.json") else Path(path).parent.name) or "hf-model"
    if arch in OPT or (arch is None and "ffn_dim" in cfg):
        c = _Config(cfg, path, "OPT")
        h, heads = c.need("hidden_size"), c.need("num_attention_heads")
        return ModelShape(name if raw.get("_name_or_path") else Path(path).parent.name or "opt",
                          c.need("num_hidden_layers"), h, heads, heads, c.need("ffn_dim"), c.need("vocab_size"),
                          cfg.get("max_position_embeddings", 2048), gated_mlp=False,
                          tie_embeddings=cfg.get("tie_word_embeddings", True))
    moe_keys = ("num_local_experts", "num_experts", "n_routed_experts")
    is_mla = arch in MLA or (arch is None and "kv_lora_rank" in cfg)
    is_moe = arch in MOE or (arch in MLA and "n_routed_experts" in cfg) or (
        arch is None and any(cfg.get(k) for k in moe_keys))
    family = "MLA" if is_mla else "MoE" if is_moe else "dense"
    c = _Config(cfg, path, family)
    heads, layers = c.need("num_attention_heads"), c.need("num_hidden_layers")
    fields = dict(
        name=name, num_layers=layers, hidden_size=c.need("hidden_size"), num_heads=heads,
        num_kv_heads=c.optional("num_key_value_heads", heads),
        intermediate_size=c.need("intermediate_size_mlp", "intermediate_size"),  # Llama-4 dense layers
        vocab_size=c.need("vocab_size"), max_model_len=c.optional("max_position_embeddings", 4096),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), head_dim=c.optional("head_dim", None),
        quantization=_quantization(raw, path), **_sliding(cfg, layers, path))
    if is_moe:
        fields.update(_moe(c, arch, layers))
    if is_mla:
        fields.update(kv_lora_rank=c.need("kv_lora_rank"), qk_rope_head_dim=c.need("qk_rope_head_dim"),
                      qk_nope_head_dim=c.need("qk_nope_head_dim"), v_head_dim=c.need("v_head_dim"),
                      q_lora_rank=cfg.get("q_lora_rank") or 0)
    return ModelShape(**fields)


def _moe(c: _Config, arch: str | None, layers: int) -> dict:
    """Expert counts, widths and which layers are MoE, under each family's key names."""
    experts = c.need("num_local_experts", "num_experts", "n_routed_experts")
    top_k = c.need("num_experts_per_tok", "experts_per_token")
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM") or "moe_intermediate_size" not in c and \
            "intermediate_size_mlp" not in c:
        expert_width = c.need("intermediate_size")          # Mixtral, gpt-oss: every layer MoE
    elif "intermediate_size_mlp" in c:
        expert_width = c.need("intermediate_size")          # Llama-4: intermediate_size is the expert's
    else:
        expert_width = c.need("moe_intermediate_size")      # Qwen-MoE, DeepSeek
    if "interleave_moe_layer_step" in c:                    # Llama-4: every step-th layer
        num_moe = layers // max(1, c["interleave_moe_layer_step"])
    elif "first_k_dense_replace" in c:                      # DeepSeek: the first k layers dense
        freq = max(1, c.get("moe_layer_freq", 1))
        num_moe = sum(1 for i in range(c["first_k_dense_replace"], layers) if i % freq == 0)
    elif "decoder_sparse_step" in c:                        # Qwen-MoE
        dense = set(c.get("mlp_only_layers") or [])
        step = max(1, c["decoder_sparse_step"])
        num_moe = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    else:
        num_moe = layers
    shared = c.get("shared_expert_intermediate_size") or 0   # Qwen2-MoE
    shared += (c.get("n_shared_experts") or 0) * expert_width  # DeepSeek
    if arch and arch.startswith("Llama4"):
        shared += expert_width                               # Llama-4: one shared expert per MoE layer
    return dict(num_experts=experts, experts_per_token=top_k, moe_intermediate_size=expert_width,
                shared_expert_intermediate_size=shared, num_moe_layers=num_moe)


# `layer_types` values (transformers' names) whose KV and attention are modelled
LAYER_TYPES = ("full_attention", "sliding_attention")


def _sliding(cfg: dict, layers: int, path) -> dict:
    """Which layers attend through a sliding window, and its width. `layer_types` names each layer
    (gpt-oss: alternating); `sliding_window_pattern` makes every pattern-th layer full (Gemma 3: 6);
    with neither, a window applies to every layer (Mistral v0.1). Qwen2-style configs carry a window with
    `use_sliding_window: false`: no window."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise CatalogError(f"{path}: layer_types: expected a list of {layers} layer types (num_hidden_layers), "
                               f"got {types!r:.60}")
        unknown = sorted({str(t) for t in types} - set(LAYER_TYPES))
        if unknown:
            raise CatalogError(f"{path}: layer_types: {', '.join(map(repr, unknown))} not modelled; known: "
                               f"{', '.join(LAYER_TYPES)}")
    if window is None or cfg.get("use_sliding_window") is False:
        if types is not None and "sliding_attention" in types:
            raise CatalogError(f"{path}: sliding_window: layer_types has sliding_attention layers but no window")
        return {}
    window = _positive_int(window, "sliding_window", path)
    if types is not None:
        num = types.count("sliding_attention")
    elif cfg.get("sliding_window_pattern") is not None:
        pattern = _positive_int(cfg["sliding_window_pattern"], "sliding_window_pattern", path)
        num = layers - layers // pattern   # layer i is full when (i + 1) % pattern == 0 (transformers' Gemma 3)
    else:
        num = layers
    return {"sliding_window": window, "num_sliding_layers": num} if num else {}


def _quantization(raw: dict, path) -> str | None:
    """The weight format of a quantised checkpoint, or None for an unquantised one. A method the cost
    models do not price is one line naming it: never priced as 16-bit weights."""
    q = raw.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise CatalogError(f"{path}: quantization_config: expected an object with quant_method, got "
                           f"{type(q).__name__} {str(q)[:40]!r}")
    method, algo = q.get("quant_method"), q.get("quant_algo")
    if method is not None and not isinstance(method, str):
        raise CatalogError(f"{path}: quantization_config.quant_method: expected a string, got {method!r}")
    method = (method or "").lower()
    if method == "fp8" and q.get("weight_block_size"):
        return "fp8_block"
    if method in QUANT_METHODS:
        return QUANT_METHODS[method]
    if method in ("modelopt", "") and algo in MODELOPT_ALGOS:
        return MODELOPT_ALGOS[algo]
    if method in INT4_METHODS:
        return _int4(q, method, path)
    what = f"quant_method {method!r}" + (f" with quant_algo {algo!r}" if algo is not None else "") if method \
        else "no quant_method" + (f" (quant_algo {algo!r})" if algo is not None else "")
    raise CatalogError(f"{path}: quantization_config: {what} is not modelled; priced: "
                       f"{', '.join(sorted(QUANT_METHODS))}, modelopt {'/'.join(MODELOPT_ALGOS)}, "
                       f"{', '.join(INT4_METHODS)} (4-bit)")


def _int4(q: dict, method: str, path) -> str:
    bits = q.get("bits", q.get("w_bit"))           # transformers' AwqConfig / GPTQConfig, AutoAWQ's own
    group = q.get("group_size", q.get("q_group_size", MIN_INT4_GROUP))
    if bits != 4:
        raise CatalogError(f"{path}: quantization_config.bits: {method} with {bits!r}-bit weights is not "
                           "modelled (4-bit only)")
    if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group >= MIN_INT4_GROUP):
        raise CatalogError(f"{path}: quantization_config.group_size: {group!r} is not modelled (-1 or at least "
                           f"{MIN_INT4_GROUP}: smaller groups carry more scale bytes per weight)")
    return "int4"

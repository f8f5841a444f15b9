"""Catalogs of GPUs (datasheet figures) and decoder model shapes (from public config.json files).

Sources: NVIDIA datasheets (dense BF16, no sparsity) and each model's Hugging Face config.json,
as tabulated in ../shared/docs/references.md. Only what the cost and memory models need is kept.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops_per_s: float      # dense tensor-core peak
    hbm_bytes_per_s: float       # datasheet HBM bandwidth
    memory_bytes: float          # total device memory
    interconnect_bytes_per_s: float  # per-GPU NVLink (or PCIe) bandwidth used by TP all-reduce
    host_link_bytes_per_s: float     # GPU<->host copies (KV swap), PCIe gen4 x16 ~25 GB/s, gen5 ~50 GB/s


GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("a100-40gb", 312e12, 1555e9, 40e9, 300e9, 25e9),
        GPU("a100-80gb", 312e12, 2039e9, 80e9, 300e9, 25e9),
        GPU("h100-sxm", 989e12, 3350e9, 80e9, 450e9, 50e9),
        GPU("h200-sxm", 989e12, 4800e9, 141e9, 450e9, 50e9),
        GPU("l4", 121e12, 300e9, 24e9, 32e9, 25e9),      # PCIe gen4 only, no NVLink
        GPU("l40s", 362e12, 864e9, 48e9, 32e9, 25e9),    # PCIe gen4 only, no NVLink
    ]
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    gated_mlp: bool = True        # SwiGLU (gate + up + down); False for OPT-style fc1/fc2
    tie_embeddings: bool = False  # LM head shares the embedding matrix (weights counted once)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * (h + 2 * kv) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * h) + embed + h

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """K and V of every layer for one token, on one of `tp` GPUs (KV heads are split by TP)."""
        kv_heads_per_gpu = max(1, self.num_kv_heads // tp)  # replicated when tp > kv heads
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * dtype_bytes


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
        ModelShape("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        ModelShape("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
        ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768),
        ModelShape("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, gated_mlp=False, tie_embeddings=True),
        # A small Llama-shaped decoder for CPU calibration, the real backend and tests.
        ModelShape("tiny", 4, 256, 4, 2, 512, 1024, 2048),
    ]
}

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


class CatalogError(ValueError):
    """A model, GPU or config file that cannot be resolved; the message names it."""


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise CatalogError(f"unknown hardware {name!r}; known: {', '.join(GPUS)}") from None


def get_model(name_or_path: str) -> ModelShape:
    """A catalog name, or the path of a Hugging Face config.json (or a folder holding one)."""
    if name_or_path.lower() in MODELS:
        return MODELS[name_or_path.lower()]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        return model_from_hf_config(path)
    raise CatalogError(f"unknown model {name_or_path!r}; known: {', '.join(MODELS)} or a config.json path")


def model_from_hf_config(path: Path) -> ModelShape:
    try:
        cfg = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such model config file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: not a valid JSON config ({e})") from None
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the model config ({e.strerror})") from None
    if not isinstance(cfg, dict):
        raise CatalogError(f"{path}: expected a JSON object of model settings, got a JSON {type(cfg).__name__}")
    try:
        if "ffn_dim" in cfg:  # OPT family: fc1/fc2 without a gate
            h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
            return ModelShape(Path(path).parent.name or "opt", cfg["num_hidden_layers"], h, heads, heads,
                              cfg["ffn_dim"], cfg["vocab_size"], cfg.get("max_position_embeddings", 2048),
                              gated_mlp=False, tie_embeddings=cfg.get("tie_word_embeddings", True))
        heads = cfg["num_attention_heads"]
        return ModelShape(
            name=cfg.get("_name_or_path") or Path(path).parent.name or "hf-model",
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            max_model_len=cfg.get("max_position_embeddings", 4096),
            tie_embeddings=cfg.get("tie_word_embeddings", False),
        )
    except KeyError as e:
        raise CatalogError(f"{path}: config.json lacks required key {e.args[0]!r}") from None


def with_max_model_len(model: ModelShape, max_model_len: int) -> ModelShape:
    return replace(model, max_model_len=max_model_len)

"""A model and its tensor-parallel degree from the command line, checked before any work: the model known
(catalog name or config.json), and the degree one vLLM could shard it with (attention heads, KV heads and
MLP width divisible; a command that would otherwise time or price shards that do not exist)."""
from __future__ import annotations

from costmodels.catalog import CatalogError, ModelShape, get_model


def model_arg(name: str, arg: str = "--model") -> ModelShape:
    """The model `name` names; CatalogError in one line naming `arg` if none."""
    try:
        return get_model(name)
    except CatalogError as e:
        text = str(e)
        raise CatalogError(text if text.startswith(str(name)) else f"{arg} {name}: {text}") from None


def tp_problem(model: ModelShape, tp: int) -> str | None:
    """Why `tp` GPUs cannot shard `model` as vLLM does, or None. vLLM's QKVParallelLinear splits the query
    heads evenly and the KV heads evenly or replicated (tp a multiple of them); its column-parallel MLP
    splits the intermediate width evenly (vllm/model_executor/layers/linear.py)."""
    if model.num_heads % tp:
        return f"does not divide {model.name}'s {model.num_heads} attention heads"
    kv = model.num_kv_heads
    if not model.is_mla and (kv % tp if kv >= tp else tp % kv):
        return f"neither divides nor is a multiple of {model.name}'s {kv} KV heads"
    if model.num_dense_layers and model.intermediate_size % tp:
        return f"does not divide {model.name}'s MLP width {model.intermediate_size}"
    return None


def check_tp(model: ModelShape, tp: int, arg: str = "--tp") -> None:
    why = tp_problem(model, tp)
    if why:
        raise CatalogError(f"{arg} {tp}: {why}")

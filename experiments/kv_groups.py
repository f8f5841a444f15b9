"""Which KV cache groups a point's engine runs with: vLLM's hybrid KV cache manager (simcore/hybridkv.py)
for a model with sliding-window layers served by vLLM V1, SGLang's two pools (simcore/sglang_swa.py) for one
with both full and sliding layers served by SGLang, or one group of every layer.

vLLM turns the hybrid manager on by itself for such a model (vllm/config/vllm.py) unless told
`--disable-hybrid-kv-cache-manager` (engine.disable_hybrid_kv_cache_manager: true here), or before vLLM 0.22
when a KV connector runs (engine.kv_offload, under an engine.vllm_version that old); a model whose
layers are all sliding keeps its window either way (one uniform group). Engines other than vLLM V1
(TRT-LLM, TGI, vLLM V0, static batching) keep their own allocators, counted whole here; SGLang's
`--disable-hybrid-swa-memory` is the same flag here. Prefix
caching runs with it (simcore/hybridprefix.py). Where the hybrid manager runs in vLLM but is not modelled here
(pipeline stages, disaggregation, swap preemption, and with prefix caching the host offload tier and EAGLE/MTP's
dropped hit block) the point is refused in one line rather than counted whole without saying so.
"""
from __future__ import annotations

from costmodels import deployment
from costmodels.deployment import Deployment
from policies.vllm_versions import rules_of
from simcore.errors import SimulationError
from simcore.hybridkv import KVCacheGroups, kv_cache_groups
from simcore.limits import HYBRID_KV_POLICIES
from simcore.sglang_swa import DEFAULT_SWA_FULL_TOKENS_RATIO as DEFAULT_SWA_RATIO, SwaPools

FLAG = "engine.disable_hybrid_kv_cache_manager"


def point_kv_groups(cfg) -> KVCacheGroups | SwaPools | None:
    """The KV cache groups of one resolved point (experiments.config.PointConfig): vLLM's hybrid groups,
    SGLang's two pools, or None for one group of every layer, each holding the whole sequence."""
    m = cfg.model
    if not m.sliding_window or not m.num_sliding_layers:
        return None
    if m.sliding_window >= m.max_model_len:   # no sequence outgrows the window: every layer holds every token,
        return None                           # as full attention does (Mistral-7B-v0.1 at max_model_len 4,096)
    num_full = m.num_layers - m.num_sliding_layers
    if cfg.policy.name in SwaPools.policies:
        return sglang_swa_pools(cfg, num_full)
    if cfg.policy.name not in HYBRID_KV_POLICIES:
        return None
    rules = rules_of(cfg.policy)
    if num_full and (cfg.engine.disable_hybrid_kv_cache_manager or (
            cfg.engine.disable_hybrid_kv_cache_manager is None and cfg.engine.kv_offload is not None
            and not rules.hybrid_kv_with_connector)):   # before vLLM 0.22 a KV connector turned it off
        return None   # vLLM promotes the sliding layers to full attention for KV management
    d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
    why = ("pipeline_parallel_size > 1" if d.pipeline_parallel_size > 1 else
           "disaggregation" if cfg.disaggregation is not None else
           "engine.kv_offload" if cfg.engine.kv_offload is not None else
           "prefix caching and engine.speculative's method " + cfg.engine.speculative.method
           if cfg.engine.enable_prefix_caching and _drops_hit_block(cfg.engine.speculative) else
           "engine.preemption_mode: swap" if cfg.engine.preemption_mode != "recompute" else None)
    if why:
        fix = f"; set {FLAG}: true to count every layer whole" if num_full else ""
        raise SimulationError(f"{FLAG}: {m.name} has sliding-window layers, and vLLM's hybrid KV cache manager "
                              f"is not modelled with {why}{fix}")
    budget = getattr(cfg.policy, "max_num_batched_tokens", m.max_model_len)
    return kv_cache_groups(num_full, m.num_sliding_layers, m.sliding_window, block_size=cfg.engine.block_size,
                           max_num_batched_tokens=budget, max_model_len=m.max_model_len)


def sglang_swa_pools(cfg, num_full: int) -> SwaPools | None:
    """SGLang's hybrid SWA memory for a model with full and sliding layers (on by default there; a model
    whose layers all slide, or `--disable-hybrid-swa-memory`, is counted whole here)."""
    if not num_full or cfg.engine.disable_hybrid_kv_cache_manager:
        return None
    d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
    why = ("pipeline_parallel_size > 1" if d.pipeline_parallel_size > 1 else
           "disaggregation" if cfg.disaggregation is not None else
           "engine.speculative" if cfg.engine.speculative is not None else None)
    if why:
        raise SimulationError(f"{FLAG}: {cfg.model.name} has sliding-window layers, and SGLang's hybrid SWA memory "
                              f"is not modelled with {why}; set {FLAG}: true to count every layer whole")
    ratio = cfg.engine.swa_full_tokens_ratio
    return SwaPools(num_full, cfg.model.num_sliding_layers, cfg.model.sliding_window, cfg.engine.block_size,
                    DEFAULT_SWA_RATIO if ratio is None else ratio)


def _drops_hit_block(speculative) -> bool:
    """Whether a speculative method gives back a prefix hit's last block (EAGLE, MTP): vLLM's sliding
    groups then need one more contiguous block, not modelled."""
    return speculative is not None and speculative.method in ("eagle", "eagle3", "mtp")


def bytes_per_block(cfg, groups: KVCacheGroups) -> int:
    """One block of the shared pool: `group_size` layers' KV for `block_size` tokens on one GPU (every
    layer has the same page here: same KV heads and head size, as vLLM's page-size rule needs)."""
    d = cfg.deployment or Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
    per_layer = cfg.model.kv_width(d.tp) * deployment.KV_BYTES[d.kv_format()]
    if isinstance(groups, SwaPools):   # a full-pool page with its share of the sliding pool
        return groups.bytes_per_block(per_layer)
    return int(groups.group_size * per_layer * groups.block_size)

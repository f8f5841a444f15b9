"""Engine limits: the engine-level settings that are not a policy's knobs (KV pool, model length,
preemption mode, prefix caching), and the rules about which combinations an engine can run. The one home
of this concept: both engines read an `EngineLimits`, and a sweep file's `engine:` section is checked with
`engine_settings_error` before any point runs."""
from __future__ import annotations

from dataclasses import dataclass

from simcore.kvcache import DEFAULT_BLOCK_SIZE

PREEMPTION_MODES = ("recompute", "swap")
# Policies whose engine is vLLM V1, the one with the hybrid KV cache manager (simcore/hybridkv.py).
HYBRID_KV_POLICIES = ("chunked_prefill",)


@dataclass(frozen=True)
class EngineLimits:
    """Engine-level settings that are not a policy's knobs."""
    num_gpu_blocks: int                  # as vLLM: the pool, its null block included (simcore.kvcache)
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int = 8192
    preemption_mode: str = "recompute"   # or "swap" (vLLM V0 only; V1 always recomputes)
    kv_bytes_per_token: int = 0          # for swap transfer times
    host_link_bytes_per_s: float = 25e9  # GPU<->host copy bandwidth (PCIe)
    num_swap_blocks: int = 0             # host swap space, in blocks
    check_invariants: bool = True
    enable_prefix_caching: bool = False  # vLLM V1 automatic prefix caching (PrefixCachingBlockPool)
    # Prefill instance of a disaggregated deployment (simcore/disagg.py): a request that sampled its first
    # token leaves `running` holding its KV (for the transfer) until `release`; it is never decoded here.
    handoff_after_first_token: bool = False
    gateway: object = None               # simcore.gateway.GatewayLimits: admission control ahead (simcore/gateway.py)
    speculative: object = None           # simcore.speculative.Speculation: speculative decoding, or None
    # vLLM's hybrid KV cache manager (simcore.hybridkv.KVCacheGroups: sliding-window layers hold only their
    # window); None: one group of every layer, each holding the whole sequence.
    kv_groups: object = None
    kv_offload: object = None            # simcore.kvoffload.OffloadLimits: host tier for prefix blocks (vLLM's
                                         # CPU offloading connector; needs prefix caching)
    # vLLM V1's async scheduling (simcore/async_scheduling.py): a request arriving during a step is
    # scheduled one decision later than by a synchronous engine.
    async_scheduling: bool = False
    # The prefix-caching pool's free-queue order (simcore.kvcache.PrefixCachingBlockPool): blocks without a
    # hash reused first, as vLLM since 0.24; False: every freed block to the tail, as before (the release
    # engine.vllm_version names, policies/vllm_versions.py)
    hashless_blocks_first: bool = True


def engine_settings_error(policy, preemption_mode: str, enable_prefix_caching: bool, kv_groups=None) -> str | None:
    """Why an engine cannot run `policy` with these settings (one line naming the key), or None. The one
    statement of these rules: both engines refuse with it at the start of a run, and the sweep loader
    (experiments/engine_config.py) with it before any point runs."""
    if preemption_mode not in PREEMPTION_MODES:
        return f"engine.preemption_mode: expected recompute or swap, got {preemption_mode!r}"
    if kv_groups is not None:
        if preemption_mode != "recompute":
            return "engine.preemption_mode: swap is vLLM V0's; the hybrid KV cache manager (vLLM V1) recomputes"
        allowed = getattr(kv_groups, "policies", HYBRID_KV_POLICIES)   # SGLang's pools: simcore/sglang_swa.py
        if policy is not None and policy.name not in allowed:
            return (f"engine.policy: these sliding-window KV pools are modelled for {', '.join(allowed)}, "
                    f"not {policy.name}; set engine.disable_hybrid_kv_cache_manager: true")
    if enable_prefix_caching:
        if not getattr(policy, "supports_prefix_caching", False):
            return f"engine.enable_prefix_caching: policy {policy.name} has no prefix caching"
        if preemption_mode != "recompute":
            return "engine.enable_prefix_caching: needs engine.preemption_mode recompute (as vLLM V1)"
    return None

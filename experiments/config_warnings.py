"""Settings that run but may not mean what the sweep's author thinks: one warning line each, printed by
experiments.run before anything runs (a refusal would break sweeps that mean it).

- `data_parallel_size` > 1 without `cluster:` simulates one DP rank (one engine); the others are only in
  the GPU count and the expert-parallel layout.
- A measured profile used on another device than it was measured on: its kernel timings are that
  device's (a CPU-measured profile under `hardware: l4` prices the L4 with CPU kernels).
- A shipped measured profile exists for the model's architecture on this GPU, but this point is priced by
  a weaker model (the deployment differs from the profile's, e.g. fp8 KV cache).
- Prefix caching under vLLM's hybrid KV cache manager with an `engine.vllm_version` before 0.24: its pool
  frees and retains sliding-window blocks as vLLM 0.32 does, not as that release did.
"""
from __future__ import annotations

from costmodels.basis import basis_line
from costmodels.deployment import Deployment
from costmodels.selection import shipped_profile_path
from experiments.kv_groups import point_kv_groups
from policies.vllm_versions import rules_of
from simcore.errors import SimulationError
from simcore.hybridkv import KVCacheGroups


def point_warnings(cfg, described: dict) -> list[str]:
    """Warnings for one resolved point (`cfg`: experiments.config.PointConfig) whose cost model's
    `describe()` is `described`."""
    out = []
    d = cfg.deployment
    dp = d.data_parallel_size if d is not None else 1
    if dp > 1 and cfg.cluster is None and cfg.disaggregation is None:
        out.append(f"data_parallel_size: {dp} ranks, but one engine is simulated (no cluster:); add "
                   f"cluster: {{num_replicas: {dp}}} to simulate every rank behind a router")
    measured_on = described.get("measured_on")
    if described.get("kind") == "profile" and measured_on and measured_on != cfg.gpu.name:
        out.append(f"profile: measured on {measured_on}, simulating hardware {cfg.gpu.name}: its kernel "
                   f"timings are {measured_on}'s, not {cfg.gpu.name}'s")
    if cfg.profile is None and described.get("kind") in ("roofline", "aic"):
        path = shipped_profile_path(cfg.model, cfg.gpu.name, cfg.tensor_parallel_size, cfg.dtype)
        plain = Deployment(dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size)
        if path is not None and d is not None and d != plain:
            out.append(f"a measured profile ({path.stem}) exists for {cfg.model.name} on {cfg.gpu.name}, but this "
                       f"deployment differs from it, so the {basis_line(described).split(' (')[0]} prices it")
    rules = rules_of(cfg.policy)
    if cfg.engine.enable_prefix_caching and not rules.hashless_blocks_first and _hybrid(cfg):
        out.append(f"engine.vllm_version: {rules.version}'s free queue and sliding-window block retention are "
                   f"not modelled under the hybrid KV cache manager: {cfg.model.name}'s prefix cache frees and "
                   "keeps blocks as vLLM 0.32 does (policies/vllm_versions.py)")
    return out


def _hybrid(cfg) -> bool:
    """Whether the point runs vLLM's hybrid KV cache manager (a refused combination is reported elsewhere)."""
    try:
        return isinstance(point_kv_groups(cfg), KVCacheGroups)
    except SimulationError:
        return False

"""The sweep file's `engine:` section: engine-level settings (KV pool, preemption mode, prefix caching) and
the scheduling policy with its knobs.

The rule for knobs: a knob given directly under `engine:` belongs to `engine.policy`, and a knob of
another policy is an error. Knobs for a policy that only some grid points select go in that policy's own
section, `engine.<policy>: {knob: value}`, used when (and only when) that policy runs:

    engine:
      policy: chunked_prefill
      static: {max_num_seqs: 64}
      chunked_prefill: {max_num_batched_tokens: 512}
    grid:
      engine.policy: [static, chunked_prefill]

Unset knobs come from the policy itself, `POLICIES[name].for_gpu(gpu, max_model_len, **knobs)`
(policies/defaults.py: the engines' per-GPU defaults), which Python callers use too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from costmodels.frontend import FrontendLatency, parse_frontend
from experiments.configcheck import ConfigError, check_type
from experiments.speculative_config import SpeculativeSettings, parse_speculative, speculative_policy_knobs
from experiments.offload_config import OffloadSettings, parse_offload
from policies import POLICIES
from simcore.limits import PREEMPTION_MODES, EngineLimits, engine_settings_error

DEFAULT_POLICY = "chunked_prefill"
FAST_PATH_MODES = ("auto", "on", "off")


_LIMITS = {f.name: f.default for f in dataclasses.fields(EngineLimits)}   # the engine's own defaults


@dataclass(frozen=True)
class EngineSettings:
    """A sweep file's `engine:` settings (not a policy's knobs). Those that are engine limits take the
    engine's defaults (simcore/limits.py); the rest say how the pool is sized and how the run is made.
    experiments.simulate.engine_limits turns them into the engine's `EngineLimits`."""
    block_size: int = _LIMITS["block_size"]
    gpu_memory_utilization: float = 0.9   # vLLM default
    num_gpu_blocks: int | None = None     # overrides the derived block count
    max_model_len: int | None = None      # overrides the model's limit
    preemption_mode: str = _LIMITS["preemption_mode"]
    swap_space_gb: float = 4.0            # vLLM V0 swap_space per GPU (GiB)
    check_invariants: bool = _LIMITS["check_invariants"]
    enable_prefix_caching: bool = _LIMITS["enable_prefix_caching"]   # on by default in vLLM V1; off here
    # vLLM's --disable-hybrid-kv-cache-manager: None (vLLM's default: on where it applies), True: sliding-window
    # layers hold the whole sequence as full-attention ones (experiments/kv_groups.py)
    disable_hybrid_kv_cache_manager: bool | None = None
    # SGLang's --swa-full-tokens-ratio: its sliding-window pool's tokens over its full pool's (simcore/sglang_swa.py);
    # None: SGLang's default, 0.8
    swa_full_tokens_ratio: float | None = None
    fast_path: str = "auto"               # auto | on | off: the exact fast engine (experiments/fast.py)
    frontend: FrontendLatency | None = None   # the serving front end's time per request (costmodels/frontend.py);
                                              # None: the cost model's own
    speculative: SpeculativeSettings | None = None   # speculative decoding (experiments/speculative_config.py)
    kv_offload: OffloadSettings | None = None  # host tier for prefix blocks (experiments/offload_config.py)
    # vLLM V1's async scheduling (simcore/async_scheduling.py): an arrival during a step waits one step
    # more. None: the cost model's own (the prior, [aic] and kernel profiles: on, as vLLM >= 0.14 on CUDA)
    async_scheduling: bool | None = None

    def __post_init__(self):
        if self.block_size < 1:
            raise ValueError("engine.block_size: must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"engine.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.preemption_mode not in PREEMPTION_MODES:   # the rest of the engine's rules: check_engine_rules
            raise ValueError(engine_settings_error(None, self.preemption_mode, False))
        if self.fast_path not in FAST_PATH_MODES:
            raise ValueError(f"engine.fast_path: expected auto, on or off, got {self.fast_path!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("engine.max_model_len: must be at least 2")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError("engine.num_gpu_blocks: must be at least 1")
        flag = self.disable_hybrid_kv_cache_manager
        if flag is not None and not isinstance(flag, bool):
            raise ValueError(f"engine.disable_hybrid_kv_cache_manager: expected true or false, got {flag!r}")
        ratio = self.swa_full_tokens_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1):
            raise ValueError(f"engine.swa_full_tokens_ratio: expected a number in (0, 1], got {ratio!r}")


ENGINE_KEYS = {f.name for f in dataclasses.fields(EngineSettings)}
KNOBS = {name: {f.name: f for f in dataclasses.fields(cls)} for name, cls in POLICIES.items()}


def parse_engine_settings(engine: dict) -> EngineSettings:
    """The engine-level keys of an `engine:` mapping, typed and checked."""
    values = {k: check_type(f"engine.{k}", engine[k], f.default, allow_none=f.default is None)
              for k, f in ((f.name, f) for f in dataclasses.fields(EngineSettings))
              if k in engine and k not in ("frontend", "speculative", "kv_offload")}
    try:
        if engine.get("frontend") is not None:
            values["frontend"] = parse_frontend(engine["frontend"], "engine.frontend")
        values["speculative"] = parse_speculative(engine.get("speculative"))
        if engine.get("kv_offload") is not None:
            values["kv_offload"] = parse_offload(engine["kv_offload"])
        return EngineSettings(**values)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def policy_name(engine: dict) -> str:
    name = engine.get("policy", DEFAULT_POLICY)
    if not isinstance(name, str) or name not in POLICIES:
        raise ConfigError(f"engine.policy: unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return name


def _owners(knob: str) -> list[str]:
    return [p for p, fields in KNOBS.items() if knob in fields]


def policy_knobs(engine: dict, name: str) -> dict:
    """The knobs of policy `name` in an `engine:` mapping (flat keys and `engine.<name>:`), typed. Every key
    is checked, including the sections of policies this point does not run."""
    flat = {}
    for k, v in engine.items():
        if k == "policy" or k in ENGINE_KEYS:
            continue
        if k in POLICIES:
            _check_section(k, v)
        elif k in KNOBS[name]:
            flat[k] = v
        elif _owners(k):
            raise ConfigError(
                f"engine.{k}: not a knob of policy {name} (its knobs: {', '.join(sorted(KNOBS[name]))}); "
                f"it belongs to {', '.join(_owners(k))}: put it under engine.{_owners(k)[0]} so that it applies "
                "to the points that run that policy")
        else:
            raise ConfigError(f"engine.{k}: unknown key; engine keys are policy, {', '.join(sorted(ENGINE_KEYS))}, "
                              f"the knobs of policy {name} ({', '.join(sorted(KNOBS[name]))}) and one section per "
                              f"policy ({', '.join(POLICIES)})")
    section = engine.get(name) or {}
    for k in section:
        if k in flat:
            raise ConfigError(f"engine.{k}: given both directly and under engine.{name}; keep one")
    merged = {**flat, **section}
    where = {k: f"engine.{k}" if k in flat else f"engine.{name}.{k}" for k in merged}
    return {k: check_type(where[k], v, KNOBS[name][k].default) for k, v in merged.items()}


def _check_section(name: str, section) -> None:
    if section is None:
        return
    if not isinstance(section, dict):
        raise ConfigError(f"engine.{name}: expected a mapping of policy {name}'s knobs, got {section!r}")
    for k, v in section.items():
        if k not in KNOBS[name]:
            raise ConfigError(f"engine.{name}.{k}: not a knob of policy {name}; its knobs: "
                              f"{', '.join(sorted(KNOBS[name]))}")
        check_type(f"engine.{name}.{k}", v, KNOBS[name][k].default)


def resolve_policy(engine: dict, gpu, max_model_len: int):
    """The policy value a point runs: `POLICIES[name].for_gpu(gpu, max_model_len, **knobs)`."""
    name = policy_name(engine)
    try:
        knobs = {**speculative_policy_knobs(name, engine), **policy_knobs(engine, name)}
        return POLICIES[name].for_gpu(gpu, max_model_len, **knobs)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_engine_rules(settings: EngineSettings, policy) -> None:
    """Up front, before any point runs, what simcore.engine.Engine would refuse at the start of a run (the
    same rule, simcore.engine.engine_settings_error)."""
    error = engine_settings_error(policy, settings.preemption_mode, settings.enable_prefix_caching)
    if error:
        raise ConfigError(error)

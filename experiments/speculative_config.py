"""The sweep file's `engine.speculative:` section (vLLM's `--speculative-config` names):

    engine:
      speculative:
        method: eagle3              # eagle | eagle3 | mtp | ngram | draft_model
        num_speculative_tokens: 3   # k drafts per step (mtp: 1 unless given, as vLLM)
        acceptance: 0.74            # optional: one rate (geometric decay) or k per-position rates
        draft_model: llama-3.2-1b   # method draft_model only: the draft's config (catalog name or path)

Checked strictly: each error is one line naming the key (exit 2 through ConfigError). Which policies run
it, and what else it cannot be combined with, is `speculative_error`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodels.catalog import CatalogError, get_model
from costmodels.speculative_proposer import proposer_cost
from experiments.configcheck import ConfigError, number
from simcore.speculative import METHODS, Speculation, SpecCounters, default_acceptance, geometric

KEYS = ("method", "num_speculative_tokens", "acceptance", "draft_model", "model")
# Policies whose engine speculates and whose scheduling of it is modelled: vLLM V1's scheduler (chunked
# prefill, and `continuous` as V1 without chunking), SGLang's, TensorRT-LLM's and TGI's. The others, in one line each.
POLICY_REFUSALS = {
    "static": "static batching (HF generate-style) has no speculative decoding here",
}
# Methods an engine does not run, in one line each. SGLang runs all five (EAGLE, EAGLE3, NEXTN = MTP through
# the EAGLE path, STANDALONE = a draft model, NGRAM: server_args.py --speculative-algorithm); TensorRT-LLM's
# PyTorch backend runs MTP, Eagle3, DraftTarget and NGram (llmapi/llm_args.py decoding configs).
# TGI speculates with n-gram lookup (`--speculate N` on a model without heads) or with Medusa / MLP-speculator
# heads shipped with the model (docs/source/conceptual/speculation.md); those heads are not among our methods,
# and TGI runs no EAGLE, MTP or separate draft model.
_TGI_METHODS = ("TGI speculates with n-gram lookup (method ngram) or Medusa/MLP-speculator heads (not modelled); "
                "it runs no EAGLE, MTP or draft model")
METHOD_REFUSALS = {
    ("trtllm", "eagle"): "TensorRT-LLM's PyTorch backend runs EAGLE-3 (method eagle3), not EAGLE-1 heads",
    **{("tgi", m): _TGI_METHODS for m in ("eagle", "eagle3", "mtp", "draft_model")},
}
# SGLang's server caps the running requests at 48 when speculating unless --max-running-requests is given
# (server_args.py `_handle_speculative_decoding`: "Max running requests is reset to 48 for speculative decoding").
SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS = 48
# Whose counting of drafts each policy follows (simcore/speculative.py `Speculation.engine`).
ENGINE_OF_POLICY = {"sglang": "sglang", "trtllm": "trtllm", "tgi": "tgi"}


@dataclass(frozen=True)
class SpeculativeSettings:
    """`engine.speculative`, checked: per-position acceptance rates r_1..r_k (simcore/speculative.py)."""
    method: str
    num_speculative_tokens: int
    acceptance: tuple[float, ...]
    draft_model: str | None = None


def parse_speculative(value) -> SpeculativeSettings | None:
    if value is None:
        return None
    key = "engine.speculative"
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping (method, num_speculative_tokens, acceptance), got {value!r}")
    for k in value:
        if k not in KEYS:
            raise ConfigError(f"{key}.{k}: unknown key; expected {', '.join(KEYS[:4])}")
    method = value.get("method")
    if method not in METHODS:
        raise ConfigError(f"{key}.method: unknown method {method!r}; expected one of {', '.join(METHODS)}")
    k = value.get("num_speculative_tokens", 1 if method == "mtp" else None)
    if k is None:
        raise ConfigError(f"{key}.num_speculative_tokens: required for method {method}")
    k = number(f"{key}.num_speculative_tokens", k, integer=True)
    if k < 1:
        raise ConfigError(f"{key}.num_speculative_tokens: must be at least 1, got {k}")
    draft = value.get("draft_model", value.get("model"))
    if "draft_model" in value and "model" in value:
        raise ConfigError(f"{key}.model: give the draft model once (draft_model or model)")
    if method == "draft_model":
        if not isinstance(draft, str):
            raise ConfigError(f"{key}.draft_model: method draft_model needs the draft model's config "
                              f"(a catalog name or a config.json path), got {draft!r}")
        try:
            get_model(draft)
        except CatalogError as e:
            raise ConfigError(f"{key}.draft_model: {e}") from None
    elif draft is not None:
        raise ConfigError(f"{key}.draft_model: only for method draft_model, not {method} (its head or MTP "
                          "module is priced from the target's own shapes)")
    return SpeculativeSettings(method, k, _acceptance(value.get("acceptance"), method, k, key + ".acceptance"),
                               draft if method == "draft_model" else None)


def _acceptance(value, method: str, k: int, key: str) -> tuple[float, ...]:
    if value is None:
        rates = default_acceptance(method, k)
        if rates is None:
            raise ConfigError(f"{key}: method {method} has no published default (it depends on the pair of "
                              "models and the text); give one rate or a list of per-position rates")
        return rates
    if isinstance(value, (list, tuple)):
        if len(value) != k:
            raise ConfigError(f"{key}: {len(value)} per-position rates for num_speculative_tokens {k}; "
                              f"give exactly {k} (or one rate, decaying geometrically)")
        rates = tuple(_rate(key, v) for v in value)
        for i in range(1, k):
            if rates[i] > rates[i - 1]:
                raise ConfigError(f"{key}: per-position rates must be non-increasing (position {i + 1}: "
                                  f"{rates[i]} > {rates[i - 1]}); each is the share of drafts whose token at "
                                  "that position was accepted, as vLLM reports them")
        return rates
    return geometric(_rate(key, value), k)


def _rate(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not 0 <= value <= 1:
        raise ConfigError(f"{key}: acceptance rates must be numbers in [0, 1], got {value!r}")
    return float(value)


def speculative_error(spec: SpeculativeSettings | None, policy, settings, disaggregated: bool,
                      pipeline_parallel_size: int) -> str | None:
    """Why a point cannot run `spec` (one line naming the key), or None."""
    if spec is None:
        return None
    name = getattr(policy, "name", "?")
    if name in POLICY_REFUSALS:
        return f"engine.speculative: not with engine.policy {name}: {POLICY_REFUSALS[name]}"
    if (name, spec.method) in METHOD_REFUSALS:
        return f"engine.speculative.method: {spec.method} not with engine.policy {name}: " \
               f"{METHOD_REFUSALS[name, spec.method]}"
    if name == "sglang" and getattr(policy, "enable_mixed_chunk", False):
        return ("engine.enable_mixed_chunk: SGLang turns mixed chunked prefill off with speculative decoding "
                "(server_args.py); leave it unset")
    if settings.preemption_mode != "recompute":
        return "engine.speculative: needs engine.preemption_mode recompute (vLLM V1 has no swap)"
    if disaggregated:
        return "engine.speculative: not modelled with disaggregation"
    if pipeline_parallel_size > 1:
        return "engine.speculative: not modelled with pipeline parallelism (vLLM refuses it too)"
    return None


def check_speculative(spec, policy, settings, disaggregated: bool, pipeline_parallel_size: int) -> None:
    error = speculative_error(spec, policy, settings, disaggregated, pipeline_parallel_size)
    if error:
        raise ConfigError(error)


def speculation_for(cfg, cost_model, seed: int):
    """The engines' `Speculation` for a resolved point (None without `engine.speculative`): its acceptance,
    the run's seed for the draws, the drafter priced on the point's GPU and layout (none under the
    constant-cost stub), and fresh counters for the results."""
    s = cfg.engine.speculative
    if s is None:
        return None
    proposer = None
    if cost_model.describe().get("kind") != "constant":
        draft = get_model(s.draft_model) if s.draft_model is not None else None
        proposer = proposer_cost(s.method, s.num_speculative_tokens, cfg.model, cfg.gpu, cfg.deployment, draft)
    return Speculation(s.method, s.num_speculative_tokens, s.acceptance, seed, proposer, SpecCounters(),
                       ENGINE_OF_POLICY.get(cfg.policy.name, "vllm"))


def speculative_policy_knobs(name: str, engine: dict) -> dict:
    """Policy knobs the engine's server sets itself when it speculates (unset by the user): SGLang's 48
    running requests."""
    if name == "sglang" and engine.get("speculative") is not None:
        return {"max_running_requests": SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS}
    return {}

"""Scheduling policies: each a frozen dataclass of its knobs, registered by the name a sweep uses.

`POLICIES[name].for_gpu(gpu, max_model_len, **knobs)` builds a policy as the sweep file's
`engine: {policy: name, ...}` does, with the engine's own per-GPU defaults for unset knobs
(policies/defaults.py); the plain constructor keeps the field defaults."""
from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import Continuous
from policies.sglang import Sglang
from policies.static import Static
from policies.tgi import Tgi
from policies.trtllm import TrtLlm
from policies.vllm_versions import MODELLED, release

POLICIES = {p.name: p for p in (Static, Continuous, ChunkedPrefill, Tgi, TrtLlm, Sglang)}


def imitated(names, vllm_versions=()) -> str:
    """Which engine, at which version, each named policy imitates: 'sglang: SGLang 0.5.10's scheduler; ...',
    one clause per distinct policy in the order given (what every answer says its schedules rest on).
    `vllm_versions`: the releases the chunked_prefill points ran as (engine.vllm_version; anything not a
    string is skipped), else the newest modelled."""
    distinct = dict.fromkeys(str(n) for n in names if str(n) in POLICIES)
    versions = sorted({v for v in vllm_versions if isinstance(v, str)}, key=release) or [MODELLED]
    text = ", ".join(versions[:-1]) + (" and " if len(versions) > 1 else "") + versions[-1]
    return "; ".join(f"{n}: {POLICIES[n].imitates.format(vllm_version=text)}" for n in distinct)


__all__ = ["POLICIES", "Static", "Continuous", "ChunkedPrefill", "Tgi", "TrtLlm", "Sglang", "imitated"]

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

POLICIES = {p.name: p for p in (Static, Continuous, ChunkedPrefill, Tgi, TrtLlm, Sglang)}


def imitated(names) -> str:
    """Which engine, at which version, each named policy imitates: 'sglang: SGLang 0.5.10's scheduler; ...',
    one clause per distinct policy in the order given (what every answer says its schedules rest on)."""
    distinct = dict.fromkeys(str(n) for n in names if str(n) in POLICIES)
    return "; ".join(f"{n}: {POLICIES[n].imitates}" for n in distinct)


__all__ = ["POLICIES", "Static", "Continuous", "ChunkedPrefill", "Tgi", "TrtLlm", "Sglang", "imitated"]

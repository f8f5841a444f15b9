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

__all__ = ["POLICIES", "Static", "Continuous", "ChunkedPrefill", "Tgi", "TrtLlm", "Sglang"]

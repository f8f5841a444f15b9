"""Scheduling policies: each a frozen dataclass of its knobs, registered by the name a sweep uses."""
from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import Continuous
from policies.sglang import Sglang
from policies.static import Static
from policies.tgi import Tgi
from policies.trtllm import TrtLlm

POLICIES = {p.name: p for p in (Static, Continuous, ChunkedPrefill, Tgi, TrtLlm, Sglang)}

__all__ = ["POLICIES", "Static", "Continuous", "ChunkedPrefill", "Tgi", "TrtLlm", "Sglang"]

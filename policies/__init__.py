"""Scheduling policies: each a frozen dataclass of its knobs, registered by the name a sweep uses."""
from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import Continuous
from policies.static import Static

POLICIES = {p.name: p for p in (Static, Continuous, ChunkedPrefill)}

__all__ = ["POLICIES", "Static", "Continuous", "ChunkedPrefill"]

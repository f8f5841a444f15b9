"""What an answer rests on besides its cost model (costmodels/basis.py): which engine, at which version, each
scheduling policy imitates, and how many draws of the traffic (seeds) each figure comes from. The console
and every summary.md say both beside the cost model."""
from __future__ import annotations

from policies import imitated


def schedules_line(policies) -> str:
    """'schedules as chunked_prefill: vLLM V1's scheduler, ...': which engine and version each policy of
    the answers imitates (policies.imitated)."""
    return f"schedules as {imitated(policies)}"


def seeds_line(num_seeds: int) -> str:
    """How many draws of the traffic each answer rests on, and what that leaves unmeasured."""
    if num_seeds <= 1:
        return "one seed per point (one draw of the traffic: its spread is not measured; `seeds: [0, 1, 2]` is)"
    return f"{num_seeds} seeds per point (what combines them takes their mean)"

"""Choose the cost model for a simulation: a measured profile when one is named, else the roofline prior."""
from __future__ import annotations

from costmodels.catalog import GPU, ModelShape
from costmodels.roofline import RooflineCostModel


def load_cost_model(profile: str | None, model: ModelShape, gpu: GPU, tp: int = 1, dtype: str = "bf16"):
    """`profile`: None or "roofline" for the datasheet prior. (Measured profiles: see calibration.)"""
    if profile in (None, "roofline"):
        return RooflineCostModel(model, gpu, tp, dtype)
    raise ValueError(f"profile: unknown profile {profile!r}")

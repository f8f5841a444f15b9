"""The table guard: a kernel-table family priced several times off the roofline (or needed far past its
rows) falls back to the prior, and the cost model says so."""
from __future__ import annotations

import pytest

from costmodels import aic
from costmodels.catalog import get_gpu, get_model
from costmodels.deployment import Deployment
from costmodels.roofline import RooflineCostModel
from costmodels.tablegrid import GUARD_SLOWER

pytestmark = pytest.mark.skipif(aic.tables_root() is None, reason="the [aic] extra is not installed")


def test_a_thin_fp8_table_falls_back_to_the_prior():
    model = get_model("Qwen/Qwen3-30B-A3B-FP8")
    cm = aic.aic_cost_model("aic", model, get_gpu("h100-sxm"), Deployment())
    d = cm.describe()
    assert "gemm_weights" in cm.guard and "x the roofline" in cm.guard["gemm_weights"]
    assert d["family_sources"]["gemm_weights"].startswith("roofline prior (table guard:")
    assert d["table_guard"] == cm.guard
    # the dropped family is priced by the prior: equal to the roofline's own GEMM
    prior = RooflineCostModel(model, get_gpu("h100-sxm"))
    n, k = cm.mlp_gemms[0] if cm.mlp_gemms[0][0] else cm.attn_gemms[0]
    assert cm._gemm_s(1, n, k) == pytest.approx(prior._gemm_s(1, n, k))


def test_tables_within_bounds_are_kept():
    cm = aic.aic_cost_model("aic", get_model("llama-3.1-8b"), get_gpu("h100-sxm"), Deployment())
    assert cm.guard == {} and cm.describe()["table_guard"] == "every table family within its bounds"
    prior = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))
    for n, k in cm.layer_gemms:   # what the guard checked: every kept cell within GUARD_SLOWER of the prior
        assert cm._gemm_s(64, n, k) / prior._gemm_s(64, n, k) < GUARD_SLOWER

"""Measured profiles: LogGrid interpolation and extrapolation, monotone step times, profile selection and
one-line errors for missing or malformed profile files."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from costmodels import CatalogError, get_gpu, get_model, load_cost_model
from costmodels.profile import LogGrid, ProfileCostModel, prefill_coords
from costmodels.selection import PROFILES_DIR, shipped_profiles
from costmodels.roofline import RooflineCostModel

LLAMA = get_model("llama-3-8b")
H100 = get_gpu("h100-sxm")


def grid_1d(knots, latency_s, slope=1.0):
    return LogGrid.from_dict({"axes": ["m"], "knots": [knots], "latency_s": latency_s, "slopes": [slope]})


def test_loggrid_is_exact_at_knots_and_log_linear_between():
    g = grid_1d([1, 4, 16], [1e-5, 2e-5, 8e-5])
    assert g(4) == pytest.approx(2e-5)
    assert g(2) == pytest.approx(math.sqrt(1e-5 * 2e-5))  # halfway in log m is the geometric mean
    assert g(0.5) == pytest.approx(1e-5)                   # launch-bound floor below the grid


def test_loggrid_extrapolates_with_the_physical_exponent_never_constant():
    g = grid_1d([1, 16], [1e-5, 1e-4], slope=1.0)
    assert g(32) == pytest.approx(2e-4)
    assert g(64) == pytest.approx(4e-4)
    g2 = LogGrid.from_dict({"axes": ["sequences", "length"], "knots": [[1, 2], [16, 64]],
                            "latency_s": [[1e-5, 2e-5], [2e-5, 4e-5]], "slopes": [1.0, 2.0]})
    assert g2(2, 128) == pytest.approx(4e-5 * 4)  # prefill: length^2
    assert g2(4, 64) == pytest.approx(8e-5)       # linear in sequences


def test_loggrid_round_trips_through_json():
    g = grid_1d([1, 4, 16], [1e-5, 2e-5, 8e-5])
    again = LogGrid.from_dict(json.loads(json.dumps(g.to_dict())))
    assert [again(x) for x in (1, 3, 16, 40)] == pytest.approx([g(x) for x in (1, 3, 16, 40)])


def test_prefill_coords_equal_length_batch_maps_to_itself():
    assert prefill_coords([512] * 4, [0] * 4) == pytest.approx((4.0, 512.0))
    b, length = prefill_coords([100], [1000])  # cached tokens add work: longer than 100
    assert b == 1 and length > 100


def test_shipped_profiles_for_llama_3_8b_on_h100_and_h200():
    assert {"llama-3-8b__h100-sxm__tp1__bf16", "llama-3-8b__h200-sxm__tp1__bf16"} <= set(shipped_profiles())


@pytest.fixture(scope="module")
def h100():
    return load_cost_model(None, LLAMA, H100)


def test_quickstart_setup_auto_selects_the_measured_h100_profile(h100):
    d = h100.describe()
    assert isinstance(h100, ProfileCostModel)
    assert d["kind"] == "profile" and d["measured_on"] == "h100-sxm"
    assert d["provenance"]["source"] == "aiconfigurator"
    assert set(d["overheads"]) == {"per_step_s", "per_request_s", "per_layer_s", "source"}


def test_a_profile_without_its_own_request_latency_takes_the_priors(h100):
    """The front end's fixed time per request is an engine cost no kernel timing measures: a profile
    that lacks it must not price requests as reaching the scheduler exactly at a step boundary."""
    assert h100.frontend == RooflineCostModel(LLAMA, H100).frontend and h100.frontend.latency_s(1000) > 0


def test_the_shipped_profile_is_chosen_by_architecture_not_by_name():
    """Llama-3.1-8B has Llama-3-8B's layers (only the context length differs): same profile, same prices."""
    from costmodels.catalog import get_model
    llama31 = load_cost_model(None, get_model("llama-3.1-8b"), get_gpu("h200-sxm"))
    llama3 = load_cost_model(None, LLAMA, get_gpu("h200-sxm"))
    assert isinstance(llama31, ProfileCostModel)
    assert llama31.describe()["source"] == llama3.describe()["source"]
    step = {"prefill": [(757, 0)], "decode": [1000] * 64}
    assert llama31.step_time_s(**step) == llama3.step_time_s(**step)


def test_no_profile_falls_back_to_roofline_and_says_so(monkeypatch):
    from costmodels import aic
    monkeypatch.setattr(aic, "tables_root", lambda: None)   # as without the [aic] extra
    cost = load_cost_model(None, LLAMA, get_gpu("a100-80gb"))
    assert isinstance(cost, RooflineCostModel)
    assert cost.describe()["kind"] == "roofline" and "no measured profile" in cost.describe()["source"]
    assert isinstance(load_cost_model("roofline", LLAMA, H100), RooflineCostModel)


def test_profile_by_name_and_by_path_are_the_same(h100):
    name = "llama-3-8b__h200-sxm__tp1__bf16"
    by_name = load_cost_model(name, LLAMA, get_gpu("h200-sxm"))
    by_path = load_cost_model(str(PROFILES_DIR / f"{name}.json"), LLAMA, get_gpu("h200-sxm"))
    shape = dict(prefill=[(300, 0)], decode=[1000] * 20)
    assert by_name.step_time_s(**shape) == by_path.step_time_s(**shape) != h100.step_time_s(**shape)


def test_step_time_monotone_in_tokens_context_and_batch(h100):
    prefill = [h100.step_time_s(prefill=[(n, 0)]) for n in [1, 7, 64, 500, 2048, 8192, 40000]]
    cached = [h100.step_time_s(prefill=[(256, c)]) for c in [0, 100, 1000, 8000, 100000]]
    context = [h100.step_time_s(decode=[c] * 16) for c in [1, 50, 1000, 8000, 64000, 500000]]
    batch = [h100.step_time_s(decode=[1000] * b) for b in [1, 2, 8, 64, 256, 1024, 4096]]
    for series in (prefill, cached, context, batch):
        assert all(b >= a for a, b in zip(series, series[1:])), series
        assert series[-1] > series[0]
    assert h100.step_time_s() == 0.0


def test_step_time_grows_beyond_the_measured_grid(h100):
    big, bigger = h100.step_time_s(prefill=[(65536, 0)]), h100.step_time_s(prefill=[(131072, 0)])
    assert bigger > 1.9 * big  # GEMMs linear, attention quadratic: never flat


def test_step_time_overheads_are_explicit(h100):
    o = h100.overheads
    one = h100.step_time_s(decode=[100])
    two = h100.step_time_s(decode=[100, 100])
    assert o.per_step_s > 0 and o.per_request_s > 0
    assert two - one > o.per_request_s


@pytest.mark.parametrize("content, expect", [
    (None, "no such profile file"),
    ("{not json", "not a valid profile JSON"),
    ('{"format": "something-else"}', "not a batchsim profile"),
    ('{"format": "batchsim-profile/1", "model": "llama-3-8b"}', "lacks required key 'gpu'"),
])
def test_missing_or_malformed_profile_is_a_one_line_catalog_error(tmp_path, content, expect):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CatalogError) as err:
        load_cost_model(str(path), LLAMA, H100)
    message = str(err.value)
    assert str(path) in message and expect in message and "\n" not in message


def test_profile_with_broken_family_is_a_one_line_catalog_error(tmp_path):
    profile = json.loads((PROFILES_DIR / "llama-3-8b__h100-sxm__tp1__bf16.json").read_text())
    profile["families"]["decode_attn"]["latency_s"] = [1.0, 2.0]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(CatalogError, match="broken.json: malformed profile"):
        load_cost_model(str(path), LLAMA, H100)


def test_profile_for_another_model_is_refused(tmp_path):
    with pytest.raises(CatalogError, match="fitted for llama-3-8b GEMM shapes"):
        load_cost_model("llama-3-8b__h100-sxm__tp1__bf16", get_model("qwen2.5-7b"), H100)
    with pytest.raises(CatalogError, match="profile is for tp=1"):
        load_cost_model("llama-3-8b__h100-sxm__tp1__bf16", LLAMA, H100, tp=2)


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(CatalogError, match="no such profile file or shipped profile.*llama-3-8b__h100"):
        load_cost_model("llama-3-8b__b200", LLAMA, H100)


def test_shipped_profile_predicts_public_magnitudes(h100):
    """Decode of one sequence streams ~16 GB of weights at ~3 TB/s: 5-8 ms per token on an H100."""
    assert 5e-3 < h100.step_time_s(decode=[512]) < 8e-3
    # 2048-token prefill: ~33 TFLOP at 600-800 TFLOP/s
    assert 0.04 < h100.step_time_s(prefill=[(2048, 0)]) < 0.06
    assert np.isfinite(h100.step_time_s(prefill=[(1, 0)], decode=[10**6]))

"""The published A100/H100 points of benchmarks/public_gpu_checks.py: every row is well formed (a source, a
vLLM V1 version, a catalog GPU, positive measured figures, what was assumed), and one small point replays."""
from __future__ import annotations

import math

import pytest

from benchmarks import public_gpu_checks as pgc
from costmodels.catalog import get_gpu, get_model


@pytest.fixture(scope="module")
def points():
    return pgc.table()


def test_rows_are_well_formed(points):
    assert points["id"].is_unique and len(points) >= 4
    for _, r in points.iterrows():
        assert r["source"].startswith("https://"), r["id"]
        major, minor = (int(x) for x in r["vllm"].split(".")[:2])
        assert (major, minor) >= (0, 8), r["id"]   # the V1 engine
        get_gpu(r["gpu"])                           # a catalog GPU
        assert r["gpu"] in pgc.SERVE_DEFAULTS, r["id"]
        get_model(r["model"])                       # resolves without the [aic] extra (shipped configs)
        assert r["tp"] >= 1 and r["num_requests"] >= 1 and r["max_model_len"] > 0, r["id"]
        assert r["load"] == "burst" or r["load"].startswith("closed:"), r["id"]
        for spec in (r["prompt"], r["output"]):
            kind, _, n = spec.partition(":")
            assert kind in ("fixed", "lognormal") and int(n) > 0, r["id"]
        measured = [r[f"real_{k}"] for k in pgc.METRICS if k != "output_tok_s" and not math.isnan(r[f"real_{k}"])]
        assert measured and all(v > 0 for v in measured), r["id"]
        assert r["real_output_tokens"] > 0 and r["assumed"].strip(), r["id"]


def test_both_gpus_of_the_brief_are_represented_or_said_missing(points):
    assert (points["gpu"] == "a100-80gb").sum() >= 4
    assert (points["gpu"] == "h100-sxm").any()   # the same source's H100, to tell setup from GPU


def test_one_point_replays(points):
    row = points.set_index("id", drop=False).loc["a100-40-llama8-c1"]
    r = pgc.replay(row, "roofline", None, "roofline")
    assert r["sim_finished"] == r["sim_requests"] == 20
    assert r["sim_output_tokens"] == 20 * 128
    # one client at a time: the decode step of an 8B model on an A100 is bandwidth-bound, 16 GB / 1.5 TB/s
    assert 8 < r["sim_tpot_mean_ms"] < 25
    assert r["err_tpot_mean_ms"] == pytest.approx(r["sim_tpot_mean_ms"] / (1000 / 75) - 1)
    assert math.isnan(r["err_duration_s"]) and math.isnan(r["err_output_tok_s"])   # the source gives no duration


def test_the_fa2_variant_only_on_fa2_gpus(points):
    by_id = points.set_index("id", drop=False)
    names = [v[0] for v in pgc.variants(by_id.loc["a100-q14-2k"], ["roofline", "default"])]
    assert names == ["roofline", "default", pgc.NO_FA2_MIX]
    assert [v[0] for v in pgc.variants(by_id.loc["h100-q14-2k"], ["roofline"])] == ["roofline"]

"""The fit: recovers known shapes and coefficients from synthetic measurements, keeps held-out points
aside, produces a loadable profile whose predictions are monotone."""
from __future__ import annotations

import json

import numpy as np
import pytest

from calibration import fit, measurements
from calibration.holdout import bad_fits, holdout_limits
from calibration.loggrid_fit import choose_knots, fit_loggrid, monotone, split, split_interior
from calibration.overheads import fit_overheads
from costmodels import get_gpu, get_model, load_cost_model
from costmodels.profile import attention_heads, gemm_shapes, profile_cost_model

TINY = get_model("tiny")
# The synthetic device: an H100 whose kernels reach 70% of peak FLOP/s and 80% of HBM bandwidth, with a
# 4 us fixed cost per kernel (the fit divides out a datasheet roofline, so this is a known efficiency).
FLOPS_S, BYTES_S, FIXED_S = 0.7 * 989e12, 0.8 * 3.35e12, 4e-6


def gemm_s(m, n, k):
    return max(2 * m * n * k / FLOPS_S, 2 * (m * k + n * k + m * n) / BYTES_S) + FIXED_S


def prefill_s(b, new, cached, heads=4, head_dim=64):
    return 4 * head_dim * heads * b * new * (cached + (new + 1) / 2) / (0.5 * FLOPS_S) + 2 * FIXED_S


def decode_s(contexts, kv_heads=2, head_dim=64):
    return 2 * 2 * kv_heads * head_dim * sum(contexts) / BYTES_S + 3 * FIXED_S


def elementwise_s(m):
    return 4 * 256 * m / BYTES_S + FIXED_S


def synthetic_rows():
    """A grid like calibration.capture's, timed by the formulas above (tiny model shapes, tp=1)."""
    rows = []
    for op, (n, k) in gemm_shapes(TINY).items():
        for m in [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]:
            rows.append({"family": "gemm", "op": op, "m": m, "n": n, "k": k, "latency_s": gemm_s(m, n, k)})
    heads, kv_heads, head_dim = attention_heads(TINY)
    attn = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}
    for b in [1, 2, 4, 8]:
        for new in [16, 32, 64, 128, 256, 512, 1024]:
            rows.append({"family": "prefill_attn", "batch_size": b, "new_tokens": new, "cached_tokens": 0,
                         "latency_s": prefill_s(b, new, 0), **attn})
        for ctx in [16, 64, 256, 1024, 4096]:
            rows.append({"family": "decode_attn", "batch_size": b, "context_len": ctx,
                         "latency_s": decode_s([ctx] * b), **attn})
    for op in ["embedding", "residual_add", "rmsnorm", "rotary", "silu_mul"]:
        for m in [1, 16, 256, 4096]:
            rows.append({"family": "elementwise", "op": op, "m": m, "latency_s": elementwise_s(m),
                         "bytes": 4.0 * 256 * m})
    for m in [1, 4, 16, 64]:
        rows.append({"family": "sampling", "m": m, "latency_s": 1e-5 * m + FIXED_S, "bytes": 1e7 * m})
    return [dict(r, status="ok", repeats=10) for r in rows]


def test_loggrid_fit_recovers_a_power_law_and_its_exponent():
    m = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    latency = 3e-6 * m ** 1.5
    g = fit_loggrid(("m",), m[:, None], latency, [m], (1.5,), smoothing=0.1)
    assert [g(x) for x in m] == pytest.approx(latency, rel=1e-6)
    assert g(128) == pytest.approx(3e-6 * 128 ** 1.5, rel=1e-6)
    assert g(5.0) == pytest.approx(3e-6 * 5.0 ** 1.5, rel=1e-6)   # exact between knots of a power law


def test_loggrid_fit_fills_knots_without_data_along_the_baseline():
    m = np.array([1, 4, 16, 64, 256, 1024, 4096], dtype=float)
    latency = np.array([gemm_s(x, 512, 256) for x in m])
    base = lambda p: np.array([gemm_s(x, 512, 256) for x in p[:, 0]])  # noqa: E731
    keep = np.arange(len(m)) != 4   # m=256 is never seen
    g = fit_loggrid(("m",), m[keep, None], latency[keep], [m], (1.0,), smoothing=0.3, spaced=True, baseline=base)
    assert g(256) == pytest.approx(latency[4], rel=1e-6)


def test_monotone_leaves_monotone_data_alone_and_repairs_a_dip():
    assert monotone(np.array([1.0, 2.0, 3.0]), 0) == pytest.approx([1.0, 2.0, 3.0])
    fixed = monotone(np.array([1.0, 3.0, 2.0, 4.0]), 0)
    assert np.all(np.diff(fixed) >= 0) and fixed[[0, 3]] == pytest.approx([1.0, 4.0])


def test_choose_knots_keeps_tile_boundaries_and_merges_near_duplicates():
    assert choose_knots(np.array([16, 17, 32, 33, 32.01])).tolist() == [16, 17, 32, 33]


def test_split_is_seeded_and_keeps_a_fifth_aside():
    train, held = split(100, 0.2, seed=0)
    assert held.sum() == 20 and not (train & held).any()
    assert np.array_equal(held, split(100, 0.2, seed=0)[1])


@pytest.fixture(scope="module")
def synthetic_profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    measurements.write(d, synthetic_rows(), {"source": "synthetic", "model": "tiny", "gpu": "h100-sxm", "tp": 1,
                                             "dtype": "bf16"})
    out = d / "profile.json"
    assert fit.main([str(d), "--out", str(out)]) == 0
    return d, json.loads(out.read_text())


def test_fit_on_synthetic_measurements_predicts_held_out_points(synthetic_profile):
    folder, profile = synthetic_profile
    for family in ("gemm", "prefill_attn", "decode_attn"):
        r = profile["fit_report"][family]
        assert r["num_held_out"] == round(0.2 * r["num_points"])
        assert r["held_out_median_ape"] < 3.0 and r["held_out_p90_ape"] < 10.0, (family, r)
    assert (folder / "fit.png").stat().st_size > 0
    assert json.loads((folder / "fit_report.json").read_text())["gemm"] == profile["fit_report"]["gemm"]


def test_fit_recovers_the_synthetic_kernel_times(synthetic_profile):
    _, profile = synthetic_profile
    cost = load_cost_model(str(synthetic_profile[0] / "profile.json"), TINY, get_gpu("h100-sxm"))
    assert cost.gemm["gate_up"](300) == pytest.approx(gemm_s(300, 1024, 256), rel=0.03)
    assert cost.prefill_attn(3, 300) == pytest.approx(prefill_s(3, 300, 0), rel=0.05)
    # Beyond the grid time scales as size^exponent from the edge (the fixed cost scales too, so it
    # lies between the true affine curve and proportional growth of the last measured time).
    assert gemm_s(8192, 256, 512) <= cost.gemm["down"](8192) <= 2.0 * gemm_s(4096, 256, 512) * 1.01
    assert decode_s([8192] * 8) <= cost.decode_attn(8, 8192) <= 2.0 * decode_s([4096] * 8) * 1.01
    assert cost.prefill_attn(8, 2048) == pytest.approx(4 * cost.prefill_attn(8, 1024), rel=1e-3)
    assert profile["family_sources"]["elementwise_rmsnorm"] == "measured"


def test_overheads_recover_known_per_step_and_per_request_costs(synthetic_profile):
    _, profile = synthetic_profile
    cost = load_cost_model(str(synthetic_profile[0] / "profile.json"), TINY, get_gpu("h100-sxm"))
    shapes = [([], [64] * 4), ([(64, 0)], [32] * 2), ([(32, 16)], []), ([], [100] * 30), ([(200, 0)] * 3, [50] * 9)]
    zero = dict(profile["overheads"], per_step_s=0.0, per_request_s=0.0, per_layer_s=0.0)
    kernels = profile_cost_model(dict(profile, overheads=zero), TINY)
    rows = [{"family": "iteration", "batch": json.dumps({"prefill": p, "decode": d}),
             "latency_s": kernels.step_time_s(p, d) + 3e-4 + 2e-5 * (len(p) + len(d))} for p, d in shapes]
    overheads, report = fit_overheads(profile, measurements.to_frame(rows), TINY)
    assert overheads["per_step_s"] == pytest.approx(3e-4, rel=1e-6)
    assert overheads["per_request_s"] == pytest.approx(2e-5, rel=1e-6)
    assert max(abs(e) for e in report["iteration_with_overheads_error_pct"]) < 0.1
    assert cost.overheads.source.startswith("roofline prior")  # the synthetic folder had no iterations


def test_fit_of_an_empty_folder_is_a_one_line_error(tmp_path, capsys):
    assert fit.main([str(tmp_path), "--out", str(tmp_path / "p.json")]) == 2
    assert "measurements.csv: missing" in capsys.readouterr().err


def noisy(rows, family, sigma=0.8, seed=0):
    """The rows with one family's timings scattered by a log-normal factor (a machine with other load)."""
    rng = np.random.default_rng(seed)
    return [dict(r, latency_s=r["latency_s"] * float(np.exp(sigma * rng.standard_normal())))
            if r["family"] == family else r for r in rows]


def test_a_family_above_the_held_out_bar_refuses_the_profile_loudly(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fit, "plot", lambda plots, path: None)   # seconds of matplotlib per fit
    measurements.write(tmp_path, noisy(synthetic_rows(), "prefill_attn"),
                       {"source": "synthetic", "model": "tiny", "gpu": "h100-sxm", "tp": 1, "dtype": "bf16"})
    out = tmp_path / "profile.json"
    out.write_text("{}")   # an earlier fit's profile must not pass for a fit of these measurements
    assert fit.main([str(tmp_path), "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert "BAD FIT: 1 kernel family" in err and "prefill_attn" in err and "> 25%" in err
    assert "gemm " not in err and "--keep-bad-fit" in err and "NOT written" in err
    assert not out.exists()
    quality = json.loads((tmp_path / "fit_report.json").read_text())["fit_quality"]
    assert set(quality["bad_families"]) == {"prefill_attn"} and not quality["kept_despite_bad_fit"]
    assert quality["bad_families"]["prefill_attn"]["held_out_median_ape"] > 25

    assert fit.main([str(tmp_path), "--out", str(out), "--keep-bad-fit"]) == 0   # told to keep it
    assert "BAD FIT" in capsys.readouterr().err
    profile = json.loads(out.read_text())
    assert profile["fit_quality"]["kept_despite_bad_fit"] and set(profile["fit_quality"]["bad_families"]) == {
        "prefill_attn"}
    load_cost_model(str(out), TINY, get_gpu("h100-sxm"))    # still a profile the simulator loads

    assert fit.main([str(tmp_path), "--out", str(out), "--max-holdout-error-pct", "prefill_attn=1000"]) == 0
    assert json.loads(out.read_text())["fit_quality"]["bad_families"] == {}
    assert fit.main([str(tmp_path), "--out", str(out), "--max-holdout-error-pct", "0.001"]) == 3   # every family


def test_held_out_limits_parse_a_default_and_per_family_values():
    assert holdout_limits(None) == {"*": 25.0}
    assert holdout_limits(["10", "gemm=30", "elementwise=50"]) == {"*": 10.0, "gemm": 30.0, "elementwise": 50.0}
    report = {"elementwise_rmsnorm": {"held_out_median_ape": 40.0, "held_out_p90_ape": 60.0, "num_held_out": 3},
              "sampling": {"held_out_median_ape": 40.0, "held_out_p90_ape": 40.0, "num_held_out": 1},  # not judged
              "gemm": {"held_out_median_ape": 20.0, "held_out_p90_ape": 20.0, "num_held_out": 11}}
    assert set(bad_fits(report, holdout_limits(["10"]))) == {"elementwise_rmsnorm", "gemm"}
    assert set(bad_fits(report, holdout_limits(["10", "elementwise=50", "gemm=25"]))) == set()
    for bad in (["gemmm=3"], ["x"], ["-1"], ["gemm=nan"]):
        with pytest.raises(ValueError, match="max-holdout-error-pct"):
            holdout_limits(bad)


def test_a_bad_held_out_bar_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        fit.main([str(tmp_path), "--out", str(tmp_path / "p.json"), "--max-holdout-error-pct", "gemmm=3"])
    assert e.value.code == 2 and "unknown family 'gemmm'" in capsys.readouterr().err


def test_held_out_points_are_interior_with_fitted_neighbours():
    m = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    points = np.array([[x, n] for n in (8, 16, 32) for x in m], dtype=float)
    for seed in range(5):
        train, held = split_interior(points, 0.2, seed)
        assert held.sum() == round(0.2 * len(points)) and np.array_equal(train, ~held)
        grid = held.reshape(3, len(m))
        assert not grid[:, [0, -1]].any()                      # every row's edges are fitted
        assert not (grid[:, 1:] & grid[:, :-1]).any()          # no two neighbours held out
    assert np.array_equal(split_interior(points, 0.2, 3)[1], split_interior(points, 0.2, 3)[1])
    assert not split_interior(points[:4], 0.5)[1].any()        # too few points to hold any out


def test_a_cpu_fit_follows_its_own_roofline_not_a_datasheet():
    """A device 1000x slower than an H100 with no datasheet: the baseline uses the peaks the fitted points
    achieved, so the overhead-to-compute kink is the roofline's, not left to the curvature penalty (an
    H100 roofline is a constant here)."""
    def cpu_gemm_s(m, n, k):
        return max(2 * m * n * k / 1e11, 4 * (n * k + m * k + m * n) / 2e10) + 1e-5
    rows = [{"family": "gemm", "op": op, "m": m, "n": n, "k": k, "latency_s": cpu_gemm_s(m, n, k), "status": "ok"}
            for op, (n, k) in gemm_shapes(TINY).items() for m in [2 ** i for i in range(11)]]
    family = fit.family_points(measurements.to_frame(rows), TINY, 1, "fp32")["gemm"]
    own = fit.fit_family(family, fit.datasheet_peaks("cpu"))[1]
    assert fit.datasheet_peaks("cpu") is None
    assert own["held_out_median_ape"] < 1.0 and own["train_median_ape"] < 1.0, own

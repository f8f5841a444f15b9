"""fidelity.fit_engine and calibration.compare against runs made by a known engine (tests/fake_runs.py)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from fidelity import compare, fit_engine
from fidelity.realruns import RealRunError, read_runs, replay, replay_config
from costmodels.stepmodel import TERMS, read_stepfit
from experiments.simulate import simulate
from tests.fake_runs import (LATENCY_IN_S, LATENCY_OUT_S, TINY_POINT, TRUE, as_vllm_bench_json,
                             make_calibration_set, make_run, point, true_model)


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    return make_calibration_set(tmp_path_factory.mktemp("calib"))


def test_reads_vllm_run_folder_with_steps_and_config(calib):
    runs = read_runs(calib)
    assert sorted(r.point for r in runs) == [f"{calib.name}/{p}" for p in ("closed1", "closed4", "rate10", "sat")]
    sat = next(r for r in runs if r.point.endswith("/sat"))
    assert sat.steps is not None and len(sat.steps) > 10
    assert sat.config["engine"]["max_num_batched_tokens"] == 256
    assert (sat.requests["status"] == "finished").all()


def test_fit_recovers_the_known_engine_and_its_latency(calib, tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert fit_engine.main([str(calib), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    model = read_stepfit(out)
    assert model.request_latency_s == pytest.approx(LATENCY_IN_S + LATENCY_OUT_S, abs=2e-4)
    held = data["held_out"]
    assert held["scheme"] == "leave-one-point-out" and held["runs"] == 4
    assert held["step_median_ape_pct"] < 5  # 3% lognormal timing noise
    assert held["metric_median_abs_err_pct"] < 5
    assert data["provenance"]["fitted_on"] and data["model_shape"]["num_layers"] == 4
    # the fitted step time of representative shapes is the known engine's, within the noise
    truth = true_model()
    for pf, dc in (([(256, 0)], []), ([], [300] * 8), ([(100, 200)], [150] * 4)):
        assert model.step_time_s(pf, dc) == pytest.approx(truth.step_time_s(pf, dc), rel=0.06)
    assert (tmp_path / "profile.md").exists()


def test_fitted_profile_is_accepted_by_experiments_run(calib, tmp_path):
    out = tmp_path / "profile.json"
    assert fit_engine.main([str(calib), "--out", str(out)]) == 0
    raw = point({"process": "poisson", "rate_per_s": 10})
    raw["profile"] = str(out)
    res = simulate(raw, seed=4)
    assert res.summary["cost_model"] == "stepfit"
    # The fixed latency lands in TTFT and E2E, not in TPOT: same run without it.
    no_lat = simulate(raw, seed=4, cost_model=read_stepfit(out).__class__(read_stepfit(out).coefficients))
    assert res.summary["ttft_p50_ms"] - no_lat.summary["ttft_p50_ms"] == pytest.approx(
        read_stepfit(out).request_latency_s * 1e3, rel=1e-6)
    assert res.summary["tpot_p50_ms"] == pytest.approx(no_lat.summary["tpot_p50_ms"])


def test_explicit_holdout_fits_on_the_rest(calib, tmp_path):
    out = tmp_path / "p.json"
    assert fit_engine.main([str(calib), "--out", str(out), "--holdout", "rate10"]) == 0
    data = json.loads(out.read_text())
    assert data["held_out"]["runs"] == 1
    assert not any("rate10" in r for r in data["provenance"]["fitted_on"])


def test_bad_fit_is_refused_loudly(calib, tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = fit_engine.main([str(calib), "--out", str(out), "--max-step-error-pct", "0.01"])
    assert rc == 3 and not out.exists() and (tmp_path / "p.refused.json").exists()
    assert "FIT REFUSED" in capsys.readouterr().err
    assert fit_engine.main([str(calib), "--out", str(out), "--max-step-error-pct", "0.01", "--keep-bad-fit"]) == 0
    assert out.exists()


def test_fit_by_replay_from_client_side_times_only(calib, tmp_path):
    """vllm bench serve JSON carries no engine steps: the fit replays the requests instead."""
    files = []
    for d in sorted((calib / "runs").iterdir()):
        files.append(str(as_vllm_bench_json(d, tmp_path / f"{d.name}.json")))
    cfg = tmp_path / "point.yaml"
    cfg.write_text(yaml.safe_dump(TINY_POINT))
    out = tmp_path / "p.json"
    rc = fit_engine.main([*files, "--config", str(cfg), "--out", str(out), "--holdout", "rate10",
                          "--replay-iterations", "80"])
    data = json.loads((out if out.exists() else tmp_path / "p.refused.json").read_text())
    assert data["provenance"]["request_latency"] == {"method": "replay fit"}
    assert data["held_out"]["metric_median_abs_err_pct"] < 15
    assert rc == 0


def test_compare_reports_range_and_step_error(tmp_path, capsys):
    base = tmp_path / "val"
    for k in range(3):
        make_run(base, "rate10", point({"process": "poisson", "rate_per_s": 10}), seed=7, repeat=k)
    known = tmp_path / "known.json"
    known.write_text(json.dumps(dict(true_model().to_json(), request_latency_s=LATENCY_IN_S + LATENCY_OUT_S)))
    assert compare.main([str(base), "--profile", str(known), "--out", str(tmp_path / "cmp")]) == 0
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert set(df["metric"]) >= {"ttft_p50_ms", "tpot_p99_ms", "e2e_p99_ms", "throughput_rps"}
    assert (df["repeats"] == 3).all() and np.isfinite(df["err_to_median_pct"]).all()
    # same requests, the true model: the simulation sits within the noise of the real runs
    assert df["err_to_median_pct"].abs().median() < 5
    steps = pd.read_csv(tmp_path / "cmp" / "compare_steps.csv")
    assert steps["median_ape_pct"].iloc[0] < 5
    assert "inside the real range" in capsys.readouterr().out


def test_compare_two_profiles_still_works(capsys):
    from calibration import compare as profile_compare   # two cost models: calibration's command
    assert profile_compare.main(["roofline", "llama-3-8b__h100-sxm__tp1__bf16"]) == 0
    assert "B/A" in capsys.readouterr().out


@pytest.mark.parametrize("content, suffix, message", [
    ('{"foo": 1}', ".json", "unknown run format"),
    ('{"ttfts": [0.1], "input_lens": [5], "output_lens": [3]}', ".json", "rerun it with --save-detailed"),
    ('{"ttfts": [0.1], "itls": [[0.1]], "input_lens": [5], "output_lens": [3]}', ".json", "lack send times"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,3\n", ".csv", "lack token timestamps"),
    ("prompt_tokens,output_tokens,ttft_s,e2e_s\n5,3,0.1,0.2\n", ".csv", "no arrival_s column"),
    ("not json", ".json", "not valid JSON"),
    ("x", ".txt", "unknown run format"),
])
def test_bad_run_files_are_one_line_errors(tmp_path, capsys, content, suffix, message):
    f = tmp_path / f"run{suffix}"
    f.write_text(content)
    with pytest.raises(RealRunError, match=message):
        read_runs(f)
    assert fit_engine.main([str(f), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(f) in err and "Traceback" not in err


def test_generic_csv_and_missing_config(tmp_path, capsys):
    f = tmp_path / "r.csv"
    f.write_text("send_s,input_tokens,output_tokens,ttft_ms,e2e_ms\n100.0,64,8,20,90\n100.5,32,4,15,40\n")
    (run,) = read_runs(f)
    assert run.requests["arrival_s"].tolist() == [0.0, 0.5]
    assert run.requests["ttft_s"].tolist() == pytest.approx([0.02, 0.015])
    assert fit_engine.main([str(f), "--out", str(tmp_path / "p.json")]) == 2
    assert "give --config POINT.yaml" in capsys.readouterr().err


def test_replay_uses_the_runs_send_times(calib):
    run = next(r for r in read_runs(calib) if r.point.endswith("/closed1"))
    res = replay(run, replay_config(run, None), cost_model=true_model())
    assert res.requests["arrival_s"].tolist() == pytest.approx(sorted(run.requests["arrival_s"]))


def test_stepfit_terms_are_validated(tmp_path):
    from costmodels.catalog import CatalogError, get_gpu, get_model
    from costmodels.selection import load_cost_model
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "batchsim-stepfit/1", "terms": {"per_step_s": -1}}))
    with pytest.raises(CatalogError, match="per_step_s must be a non-negative number"):
        load_cost_model(str(bad), get_model("tiny"), get_gpu("h100-sxm"), 1, "fp32")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(true_model().to_json(), model_shape={"num_layers": 8})))
    with pytest.raises(CatalogError, match="another model shape"):
        load_cost_model(str(other), get_model("tiny"), get_gpu("h100-sxm"), 1, "fp32")
    assert set(TRUE) <= set(TERMS)


def test_step_time_matches_the_feature_vector():
    from costmodels.stepmodel import StepFitCostModel, step_features
    rng = np.random.default_rng(0)
    coef = tuple(rng.random(len(TERMS)))
    m = StepFitCostModel(coef)
    for _ in range(50):
        pf = [(int(rng.integers(1, 300)), int(rng.integers(0, 500))) for _ in range(rng.integers(0, 3))]
        dc = [int(x) for x in rng.integers(1, 900, rng.integers(0 if pf else 1, 6))]
        nl = None if rng.random() < 0.5 else int(rng.integers(0, 5))
        assert m.step_time_s(pf, dc, nl) == pytest.approx(float(np.dot(coef, step_features(pf, dc, nl))), rel=1e-12)


MOE = (4, 8, 2)  # MoE layers, experts, top-k: the benchmark's tiny-moe


def _moe_steps(rng, n: int):
    """Random step shapes, decodes of 1-40 sequences and prefill chunks, as a vLLM run has them."""
    args = []
    for _ in range(n):
        pf = [(int(rng.integers(16, 256)), int(rng.integers(0, 300)))] if rng.random() < 0.2 else []
        dc = [int(x) for x in rng.integers(20, 600, rng.integers(0 if pf else 1, 41))]
        args.append({"prefill": pf, "decode": dc, "num_logits": len(pf) + len(dc)})
    return args


def test_moe_term_counts_the_experts_a_step_reaches():
    from costmodels.stepmodel import MoeTerm
    t = MoeTerm(*MOE)
    assert t.active_experts(1) == pytest.approx(4 * 2)             # one token: its top-2 in every layer
    assert t.active_experts(2) == pytest.approx(4 * 8 * (1 - 0.75 ** 2))
    assert t.active_experts(200) == pytest.approx(4 * 8)           # every expert, no more
    steps = [t.active_experts(n) for n in range(1, 64)]
    assert steps == sorted(steps) and np.all(np.diff(steps, 2) <= 1e-12)  # concave in the tokens


def test_moe_fit_recovers_the_expert_term_that_the_dense_terms_cannot_follow():
    """A known MoE engine (dense terms + 0.2 ms per expert pass) with 3% noise: the fit with the MoE term
    recovers it; the dense terms alone miss the small decode batches by more."""
    from costmodels.stepmodel import MoeTerm, StepFitCostModel
    truth = StepFitCostModel(tuple(TRUE.get(t, 0.0) for t in TERMS), moe=MoeTerm(*MOE, 2e-4))
    rng = np.random.default_rng(1)
    args = _moe_steps(rng, 3000)
    y = np.array([truth.step_time_s(**a) for a in args]) * np.exp(rng.normal(0, 0.03, len(args)))
    moe = fit_engine.fit_moe_step_model(args, y, MoeTerm(*MOE), "test", "fp32")
    assert moe.moe.per_active_expert_s == pytest.approx(2e-4, rel=0.1)
    assert moe.held_out["median_ape_pct"] < 3
    dense = fit_engine.fit_step_model(args, y, holdout=0.2, seed=0)
    small = [a for a in args if not a["prefill"] and len(a["decode"]) <= 4]
    err = {name: np.median([abs(m.step_time_s(**a) / truth.step_time_s(**a) - 1) for a in small])
           for name, m in (("moe", moe), ("dense", dense))}
    assert err["moe"] < 0.01 and err["dense"] > 2 * err["moe"]


def test_moe_step_model_round_trips_and_bad_moe_is_one_error(tmp_path):
    from costmodels.catalog import CatalogError, get_gpu, get_model
    from costmodels.selection import load_cost_model
    from costmodels.stepmodel import MoeTerm, StepFitCostModel, stepfit_from_json
    m = StepFitCostModel(tuple(TRUE.get(t, 0.0) for t in TERMS), dtype="fp32", moe=MoeTerm(*MOE, 3e-4))
    back = stepfit_from_json(json.loads(json.dumps(m.to_json())))
    assert back.moe == m.moe and back.step_time_s([], [100] * 5) == m.step_time_s([], [100] * 5)
    assert m.step_time_s([], [100]) - StepFitCostModel(m.coefficients).step_time_s([], [100]) == pytest.approx(
        4 * 2 * 3e-4)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(m.to_json(), moe={"num_moe_layers": 4, "num_experts": 2, "experts_per_token": 8,
                                                     "per_active_expert_s": 1e-4})))
    with pytest.raises(CatalogError, match="moe must have 1 <= experts_per_token <= num_experts"):
        load_cost_model(str(bad), get_model("tiny"), get_gpu("h100-sxm"), 1, "fp32")

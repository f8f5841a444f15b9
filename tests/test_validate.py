"""fidelity.validate end to end on a reduced workload (report produced, errors finite), and the fits
it relies on (step model and overhead refit recover known coefficients)."""
import json
import re

import numpy as np
import pandas as pd
import pytest

from fidelity.stepfit import TERMS, StepFitCostModel, fit_overheads, fit_step_model, read_stepfit
from simcore.costmodel import ConstantCost

SMALL = ["--model", "tiny", "--device", "cpu", "--num-requests", "4", "--prompt-median", "16", "--prompt-max", "32",
         "--output-median", "4", "--output-max", "8", "--kv-tokens", "2048", "--max-num-seqs", "4",
         "--chunk-tokens", "32", "--repeats", "1", "--loads", "0.5", "--no-reexec", "--quiet",
         "--reference-every-s", "0.05"]


def _shapes(rng, n):
    out = []
    for _ in range(n):
        prefill = [(int(rng.integers(2, 300)), int(rng.integers(0, 200))) for _ in range(rng.integers(0, 3))]
        if rng.random() < 0.3:  # a padded static batch: rows of one shape share one attention call
            prefill = [(int(rng.integers(2, 300)), 0)] * int(rng.integers(2, 8))
        if rng.random() < 0.2:  # a lone decode: the one-token step
            out.append({"prefill": [], "decode": [int(rng.integers(2, 500))]})
            continue
        decode = [int(c) for c in rng.integers(2, 500, size=rng.integers(0 if prefill else 1, 20))]
        num_logits = len(decode) + int(rng.integers(0, len(prefill) + 1))  # partial chunks do not sample
        out.append({"prefill": prefill, "decode": decode, "num_logits": num_logits})
    return out


def test_step_fit_recovers_known_coefficients():
    truth = StepFitCostModel((1e-3, 2e-4, 5e-5, 2e-5, 1e-8, 3e-7, 4e-6, 3e-4, 1e-4, 2e-7, 4e-4))
    assert len(truth.coefficients) == len(TERMS)
    args = _shapes(np.random.default_rng(0), 200)
    fitted = fit_step_model(args, [truth.step_time_s(**a) for a in args])
    np.testing.assert_allclose(fitted.coefficients, truth.coefficients, rtol=1e-6, atol=1e-12)


def test_step_fit_is_unbiased_in_total_under_multiplicative_noise():
    # timing noise is multiplicative; a fit on y-scaled rows would come out about 2 var = 3% low here
    truth = StepFitCostModel((1e-3, 2e-4, 5e-5, 2e-5, 1e-8, 3e-7, 4e-6, 3e-4, 1e-4, 2e-7, 4e-4))
    args = _shapes(np.random.default_rng(0), 3000)
    exact = np.array([truth.step_time_s(**a) for a in args])
    measured = exact * np.random.default_rng(1).lognormal(0.0, 0.12, len(exact))
    fitted = fit_step_model(args, measured, holdout=0.2)
    predicted = np.array([fitted.step_time_s(**a) for a in args])
    assert predicted.sum() / measured.sum() == pytest.approx(1.0, abs=0.005)
    assert fitted.held_out["steps"] > 400 and 5 < fitted.held_out["median_ape_pct"] < 12


def test_step_fit_round_trips_through_json(tmp_path):
    model = StepFitCostModel(tuple(float(i + 1) * 1e-4 for i in range(len(TERMS))), "test", 0.003)
    path = tmp_path / "stepfit.json"
    path.write_text(json.dumps(model.to_json()))
    assert read_stepfit(path) == model
    (tmp_path / "other.json").write_text('{"format": "batchsim-profile/1"}')
    assert read_stepfit(tmp_path / "other.json") is None


def test_old_step_model_files_load_with_new_terms_at_zero(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "batchsim-stepfit/1", "terms": {t: 1e-4 for t in TERMS[:7]}}))
    model = read_stepfit(path)
    assert model.coefficients == (1e-4,) * 7 + (0.0,) * (len(TERMS) - 7)


def test_overhead_fit_recovers_per_step_and_per_request_terms():
    kernels = ConstantCost(per_step_s=0.0, per_token_s=1e-5)
    args = _shapes(np.random.default_rng(1), 100)
    measured = [kernels.step_time_s(**a) + 2e-3 + 5e-5 * (len(a["prefill"]) + len(a["decode"])) for a in args]
    per_step_s, per_request_s = fit_overheads(kernels, args, measured)
    assert per_step_s == pytest.approx(2e-3, rel=1e-6)
    assert per_request_s == pytest.approx(5e-5, rel=1e-6)


def test_reduced_validation_writes_a_finite_report(tmp_path):
    pytest.importorskip("torch")
    from fidelity.validate import main

    out = tmp_path / "fid"
    assert main([*SMALL, "--policies", "static,chunked_prefill", "--out", str(out), "--fit-overhead"]) == 0
    for name in ("report.md", "iterations.csv", "step_errors.csv", "metrics.csv", "step_time.png"):
        assert (out / name).exists(), name
    steps = pd.read_csv(out / "step_errors.csv")
    assert set(steps["policy"]) == {"static", "chunked_prefill"}
    assert np.isfinite(steps[["median_abs_err_pct", "p90_abs_err_pct", "median_abs_err_norm_pct"]]).all().all()
    metrics = pd.read_csv(out / "metrics.csv")
    assert set(metrics["load"].astype(str)) == {"saturated", "0.5"}
    assert np.isfinite(metrics[["real_median", "sim", "rel_err_pct"]]).all().all()
    it = pd.read_csv(out / "iterations.csv")
    assert (it["measured_s"] > 0).all() and np.isfinite(it["sim_s"]).all()
    report = (out / "report.md").read_text()
    assert "Overhead refit" in report and "Below saturation, " in report
    assert np.isfinite(steps[["bias_norm_pct", "total_time_err_norm_pct"]]).all().all()


def test_default_stepfit_validation_saves_its_model_and_spreads_repeats(tmp_path, capsys):
    pytest.importorskip("torch")
    from fidelity.validate import main

    out = tmp_path / "fid"
    assert main([*(a for a in SMALL if a != "--quiet"), "--policies", "continuous,static", "--repeats", "2",
                 "--loads", "0.5,0.8", "--out", str(out)]) == 0
    progress = re.findall(r"^\[(\d+)/12\] (\S+) (saturated|load \S+).* run (\d):", capsys.readouterr().err, re.M)
    # round robin: saturated runs first (capacity), then every point's first repeat before any second one
    assert [" ".join(p[1:]) for p in progress] == [
        "continuous saturated 0", "static saturated 0", "continuous saturated 1", "static saturated 1",
        "continuous load 0.5 0", "continuous load 0.8 0", "static load 0.5 0", "static load 0.8 0",
        "continuous load 0.5 1", "continuous load 0.8 1", "static load 0.5 1", "static load 0.8 1"]
    model = read_stepfit(out / "stepfit.json")  # the step model under test, reusable as --profile
    assert model is not None and model.held_out["steps"] > 0
    assert (pd.read_csv(out / "stepfit_steps.csv")["normalised_s"] > 0).all()
    it = pd.read_csv(out / "iterations.csv")
    it["load"] = it["load"].astype(str)
    # round robin: each point's second repeat starts only after every point's first one has run
    order = it.drop_duplicates(["policy", "load", "repeat"]).reset_index(drop=True)
    assert list(order[["policy", "load"]].drop_duplicates().itertuples(index=False)) == [
        ("continuous", "saturated"), ("continuous", "0.5"), ("continuous", "0.8"),
        ("static", "saturated"), ("static", "0.5"), ("static", "0.8")]  # the report keeps the order
    metrics = pd.read_csv(out / "metrics.csv")
    assert (metrics["num_real_runs"] == 2).all()


def test_speed_normalised_wall_clock_run_keeps_scheduling_time_small(tmp_path):
    pytest.importorskip("torch")
    from fidelity.validate import main

    out = tmp_path / "fid"
    assert main([*SMALL, "--policies", "continuous", "--out", str(out), "--speed-normalise",
                 "--step-repeats", "3"]) == 0
    it = pd.read_csv(out / "iterations.csv")
    # the repeats and probes are hidden from the real-time clock, so the lateness before each step
    # (sched_s) does not accumulate them: about 0.1 ms against 2 ms forward passes (12 ms if it did)
    assert it["sched_s"].median() < it["forward_s"].median()
    assert (it["normalised_s"] > 0).all()


YAML = """
model: tiny
engine: {block_size: 8, max_model_len: 64, max_num_seqs: 4}
workload:
  num_requests: 4
  arrival: {process: poisson, rate_per_s: 1}
  prompt_tokens: {dist: uniform, min: 8, max: 24}
  output_tokens: {dist: fixed, value: 4}
grid:
  engine.policy: [continuous]
"""


def test_validation_of_a_yaml_with_a_given_profile_and_cpu_clock(tmp_path):
    pytest.importorskip("torch")
    from fidelity.validate import main

    model = StepFitCostModel((1e-3, 1e-4, 1e-4, 1e-5, 0.0, 0.0, 0.0), "hand-made")
    profile = tmp_path / "stepfit.json"
    profile.write_text(json.dumps(model.to_json()))
    config = tmp_path / "point.yaml"
    config.write_text(YAML)
    out = tmp_path / "fid"
    assert main(["--config", str(config), "--profile", str(profile), "--clock", "cpu", "--repeats", "1",
                 "--loads", "0.5", "--kv-tokens", "1024", "--no-reexec", "--quiet", "--out", str(out)]) == 0
    assert "hand-made" in (out / "report.md").read_text()
    assert set(pd.read_csv(out / "metrics.csv")["policy"]) == {"continuous"}
    config.write_text(YAML.replace("engine.policy: [continuous]", "workload.num_requests: [4, 8]"))
    assert main(["--config", str(config), "--no-reexec", "--quiet", "--out", str(out)]) == 2


def test_unknown_profile_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("torch")
    from fidelity.validate import main

    assert main([*SMALL, "--policies", "static", "--profile", str(tmp_path / "nope.json"),
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --profile") and "nope.json" in err and "\n" not in err


def test_overhead_refit_replaces_a_profiles_own_overheads():
    from types import SimpleNamespace

    class WithOverheads:
        """A kernel sum of 1e-5 s per token plus explicit overheads, like ProfileCostModel."""
        model = SimpleNamespace(num_layers=4)
        overheads = SimpleNamespace(per_step_s=0.5, per_request_s=0.1, per_layer_s=0.01)

        def step_time_s(self, prefill=(), decode=(), num_logits=None):
            seqs = len(prefill) + len(decode)
            o = self.overheads
            return (1e-5 * (sum(n for n, _ in prefill) + len(decode)) + o.per_step_s + o.per_request_s * seqs
                    + o.per_layer_s * 4)

    args = _shapes(np.random.default_rng(2), 50)
    measured = [1e-5 * (sum(n for n, _ in a["prefill"]) + len(a["decode"])) + 3e-3
                + 1e-4 * (len(a["prefill"]) + len(a["decode"])) for a in args]
    per_step_s, per_request_s = fit_overheads(WithOverheads(), args, measured)
    assert per_step_s == pytest.approx(3e-3, rel=1e-6)
    assert per_request_s == pytest.approx(1e-4, rel=1e-6)


def test_interrupted_validation_reports_the_runs_that_finished(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from fidelity import validate

    real_runs, original = [], validate.run_engine

    def run_engine(cfg, seed, cost_model, backend=None):
        if backend is not None:
            if len(real_runs) == 3:
                raise KeyboardInterrupt  # Ctrl-C during the fourth and last real run
            real_runs.append(cfg.policy.name)
        return original(cfg, seed, cost_model, backend)

    monkeypatch.setattr(validate, "run_engine", run_engine)
    out = tmp_path / "fid"
    assert validate.main([*SMALL, "--policies", "continuous", "--profile", "roofline", "--repeats", "2",
                          "--out", str(out)]) == 130
    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics.groupby(metrics["load"].astype(str))["num_real_runs"].first().to_dict() == {
        "saturated": 2, "0.5": 1}
    assert "**Interrupted**: 3 of 4 real runs finished" in (out / "report.md").read_text()

"""The closed-form fit from per-request times (fidelity/request_fit.py) and fidelity.fit_engine on
LLMServingSim's run format, against a run made by a known engine: our simulator with a known step model,
written as LLMServingSim writes vLLM's runs (the fixture is made here, nothing copied from a real run)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from costmodels.stepmodel import read_stepfit
from experiments.simulate import point_cost_model, simulate
from fidelity import fit_engine
from fidelity.llmservingsim import read_run
from fidelity.realruns import replay, replay_config
from costmodels.scaled import ScaledCostModel
from fidelity.request_fit import fit_prior_scale, fit_step_terms
from tests.fake_runs import true_model

POINT = {"model": "tiny", "hardware": "h100-sxm", "dtype": "bf16",
         "engine": {"policy": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 256,
                    "enable_prefix_caching": True, "gpu_memory_utilization": 0.9},
         "workload": {"num_requests": 150, "arrival": {"process": "poisson", "rate_per_s": 12},
                      "prompt_tokens": {"dist": "lognormal", "median": 128, "sigma": 0.8, "max": 512},
                      "output_tokens": {"dist": "lognormal", "median": 40, "sigma": 0.6, "max": 160}}}


def write_lss_run(d, point=POINT, seed=3):
    """A run of the known engine in LLMServingSim's format: engine-clock times (queued, scheduled,
    first and last token) and vLLM's engine arguments."""
    res = simulate(json.loads(json.dumps(point)), seed, cost_model=true_model())
    d.mkdir(parents=True, exist_ok=True)
    e = point["engine"]
    meta = {"model": "tiny", "vllm_version": "known-engine",
            "engine_kwargs": {"model": "tiny", "tensor_parallel_size": 1, "data_parallel_size": 1,
                              "max_num_seqs": e["max_num_seqs"], "max_num_batched_tokens": e["max_num_batched_tokens"],
                              "dtype": "bfloat16", "kv_cache_dtype": "auto"},
            "hardware": {"device_name": "NVIDIA H100 80GB HBM3"}}
    (d / "vllm_meta.json").write_text(json.dumps(meta))
    t0 = 7000.0   # the engine's monotonic clock
    lines = [json.dumps({"request_id": f"r{int(r.request_id)}", "input_toks": int(r.prompt_tokens),
                         "output_toks": int(r.output_tokens), "arrival_time": 1.7e9 + r.arrival_s,
                         "queued_ts": t0 + r.arrival_s, "scheduled_ts": t0 + r.admitted_s,
                         "first_token_ts": t0 + r.first_token_s, "last_token_ts": t0 + r.finish_s})
             for r in res.requests.itertuples()]
    (d / "vllm_requests.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture(scope="module")
def lss_run(tmp_path_factory):
    return write_lss_run(tmp_path_factory.mktemp("lss") / "H100_tiny")


def test_reader_keeps_when_prefill_began(lss_run):
    r = read_run(lss_run).requests
    assert "scheduled_s" in r and (r["scheduled_s"] >= r["arrival_s"] - 1e-9).all()
    assert (r["scheduled_s"] <= r["first_token_s"] + 1e-9).all()


def test_step_terms_price_the_known_engine(lss_run):
    run = read_run(lss_run)
    model = fit_step_terms([run], [256], [1], "test")
    truth = true_model()
    for prefill, decode in (([], [200] * 8), ([], [400] * 16), ([(200, 0)], [150] * 6)):
        assert model.step_time_s(prefill, decode) == pytest.approx(truth.step_time_s(prefill, decode), rel=0.15)
    assert model.held_out["median_ape_pct"] < 5


def test_fit_engine_reads_the_format_end_to_end(lss_run, tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert fit_engine.main([str(lss_run), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["held_out"]["within_fit"]["of"] == "decode intervals"
    assert data["provenance"]["formats"] == ["llmservingsim"]
    assert data["request_latency_s"] == 0.0   # the run's times are the engine's own
    # the profile replays the run it was fitted on: TPOT and E2E within a few percent
    run = read_run(lss_run)
    sim = replay(run, replay_config(run, run.config), str(out)).summary
    real = run.summary
    for k in ("tpot_mean_ms", "e2e_p50_ms"):
        assert sim[k] == pytest.approx(real[k], rel=0.06), k
    assert read_stepfit(out) is not None
    assert "Within the fit" in capsys.readouterr().out


def test_fit_engine_is_strict_on_bad_runs(lss_run, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "vllm_meta.json").write_text((lss_run / "vllm_meta.json").read_text())
    first = json.loads((lss_run / "vllm_requests.jsonl").read_text().splitlines()[0])
    del first["last_token_ts"]
    (bad / "vllm_requests.jsonl").write_text(json.dumps(first) + "\n")
    assert fit_engine.main([str(bad), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "last_token_ts" in err and "Traceback" not in err
    (bad / "vllm_meta.json").write_text("{not json")
    assert fit_engine.main([str(bad), "--out", str(tmp_path / "p.json")]) == 2
    assert "vllm_meta.json" in capsys.readouterr().err


def test_prior_scale_recovers_a_scaled_prior(lss_run, tmp_path):
    """A run made by the prior x 1.3 + 2 ms a step is fitted back to the same step prices."""
    run0 = read_run(lss_run)
    prior = point_cost_model(replay_config(run0, dict(run0.config, profile="roofline")))
    known = ScaledCostModel(prior, 1.3, 2e-3)
    res = simulate(json.loads(json.dumps(POINT)), 5, cost_model=known)
    d = tmp_path / "scaled"
    d.mkdir()
    (d / "vllm_meta.json").write_text((lss_run / "vllm_meta.json").read_text())
    (d / "vllm_requests.jsonl").write_text("\n".join(json.dumps(
        {"request_id": f"r{int(r.request_id)}", "input_toks": int(r.prompt_tokens), "output_toks": int(r.output_tokens),
         "arrival_time": r.arrival_s, "queued_ts": r.arrival_s, "scheduled_ts": r.admitted_s,
         "first_token_ts": r.first_token_s, "last_token_ts": r.finish_s}) for r in res.requests.itertuples()) + "\n")
    scale, per_step, held = fit_prior_scale(read_run(d), prior, 256)
    fitted = ScaledCostModel(prior, scale, per_step)
    # scale and per-step time trade off where the prior's price barely varies; the steps' prices do not
    for prefill, decode in (([], [200] * 8), ([], [400] * 16), ([(200, 0)], [150] * 6)):
        assert fitted.step_time_s(prefill, decode) == pytest.approx(known.step_time_s(prefill, decode), rel=0.1)
    assert held["median_ape_pct"] < 5


def test_scaled_model_prices_alike_by_every_entry_point(lss_run):
    run = read_run(lss_run)
    prior = point_cost_model(replay_config(run, dict(run.config, profile="roofline")))
    m = ScaledCostModel(prior, 1.25, 1e-3)
    pf, dc = [(100, 20)], [300, 500, 700]
    assert m.step_time_s(pf, dc) == m.step_time_sums_s(pf, 3, 1500) == 1.25 * prior.step_time_s(pf, dc) + 1e-3
    sums = np.array([900, 1500, 3000])
    assert list(m.decode_steps_time_s(3, sums, 3)) == [m.decode_step_time_fn(3, 3)(int(s)) for s in sums]
    assert m.step_time_s() == 0.0 and m.describe()["kind"] == "scaled-prior"


def test_cross_fit_table_over_runs(tmp_path, capsys, monkeypatch):
    """benchmarks.gpu_cross_fit fits each run and replays every run with each fit (and the plain prior);
    without the shared folder it skips, exit 0; a named one without real-runs/ is refused in one line."""
    from benchmarks import gpu_cross_fit, shared_data
    monkeypatch.setattr(shared_data, "SHARED_CANDIDATES", (tmp_path / "none",))
    assert gpu_cross_fit.main(["--out", str(tmp_path / "o0")]) == 0
    assert "skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        gpu_cross_fit.main(["--shared", str(tmp_path / "none"), "--out", str(tmp_path / "o0")])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    lss = tmp_path / "shared" / "real-runs" / "llmservingsim"
    write_lss_run(lss / "H100_tiny", seed=3)
    small = json.loads(json.dumps(POINT))
    small["workload"]["num_requests"] = 60
    write_lss_run(lss / "H100_tiny-b", small, seed=4)
    assert gpu_cross_fit.main(["--shared", str(tmp_path / "shared"), "--out", str(tmp_path / "o")]) == 0
    import pandas as pd
    cross = pd.read_csv(tmp_path / "o" / "cross_fit.csv")
    assert len(cross) == 2 * 2 * 2 + 2
    assert set(cross["relation"]) == {"itself", "same GPU, other model", "no fit"}
    own = cross[(cross["relation"] == "itself") & (cross["method"] == "step terms")]
    assert (own["err_tpot_mean_ms"].abs() < 0.06).all()
    assert (tmp_path / "o" / "cross_fit.md").exists()


def test_fit_timestamps_on_client_side_runs(tmp_path):
    """`--fit timestamps` fits client-side runs (vllm bench serve JSON) in closed form too: no replay."""
    import yaml
    from tests.fake_runs import TINY_POINT, as_vllm_bench_json, make_run, point
    run_dir = make_run(tmp_path / "calib", "rate10", point({"process": "poisson", "rate_per_s": 10}, 120), seed=4)
    bench = as_vllm_bench_json(run_dir, tmp_path / "bench.json")
    cfg = tmp_path / "point.yaml"
    cfg.write_text(yaml.safe_dump(TINY_POINT))
    out = tmp_path / "p.json"
    assert fit_engine.main([str(bench), "--config", str(cfg), "--out", str(out), "--fit", "timestamps"]) == 0
    data = json.loads(out.read_text())
    assert data["held_out"]["within_fit"]["of"] == "decode intervals"
    truth = true_model()
    assert read_stepfit(out).step_time_s([], [300] * 8) == pytest.approx(truth.step_time_s([], [300] * 8), rel=0.2)


def test_prior_prices_the_prefill_in_the_steps_that_carry_it():
    """One 1-s bin of 30 steps, 100 decodes each, 8,600 prefill tokens from 10 requests: with a 2,048-token
    budget the prefill rides in max(10 requests, 8,600 / 1,948) = 10 steps of 860 tokens, the other 20
    decode only. A prior with 10 ms a step, 5 ms more for a step with a chunk and 10 us a prefill token:
    20 x 10 + 10 x (10 + 5 + 8.6) = 436 ms; spread evenly (no budget), 30 steps of 287 tokens: 536.1 ms."""
    import numpy as np
    from fidelity.request_fit import Rebuilt, prior_seconds

    class Prior:
        def step_time_sums_s(self, prefill, num_decode, context_sum):
            return 0.010 + (0.005 + 1e-5 * sum(n for n, _ in prefill) if prefill else 0.0)

    one = lambda v: np.array([float(v)])   # noqa: E731
    rb = Rebuilt(one(0), 1.0, one(30), one(8600), one(3000), one(3000 * 500), one(10))
    assert prior_seconds(rb, Prior(), 2048)[0] == pytest.approx(0.436)
    assert prior_seconds(rb, Prior())[0] == pytest.approx(30 * (0.015 + 287e-5))

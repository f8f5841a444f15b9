"""Pipeline parallelism through `python -m experiments.run`: each layout the pipelined engine does not model
is one line naming the key, exit 2 (the pattern of tests/test_bad_inputs.py); a good one runs the pipelined
engine and never the fast path; PP=1 is the plain engine as before."""
import math

import pytest

from experiments.config import resolve_point
from experiments.run import main
from experiments.simulate import simulate
from tests.test_bad_inputs import BASE, run_case

DISAGG = {"num_prefill_replicas": 1, "num_decode_replicas": 1, "link_bandwidth_gb_per_s": 50}

CASES = [
    ("pp-beyond-layers", {"pipeline_parallel_size": 33}, "pipeline_parallel_size: 33 exceeds llama-3-8b's 32 layers"),
    ("pp-zero", {"pipeline_parallel_size": 0}, "pipeline_parallel_size: expected a positive integer"),
    ("pp-string", {"pipeline_parallel_size": "two"}, "pipeline_parallel_size: expected a positive integer"),
    ("pp-tgi", {"pipeline_parallel_size": 2, "engine.policy": "tgi"}, "pipeline_parallel_size: 2 is modelled for"),
    ("pp-static", {"pipeline_parallel_size": 2, "engine.policy": "static"}, "not static"),
    ("pp-fast-path-on", {"pipeline_parallel_size": 2, "engine.fast_path": "on"}, "engine.fast_path: on, but pipeline"),
    ("pp-prefix-caching", {"pipeline_parallel_size": 2, "engine.enable_prefix_caching": True},
     "pipeline_parallel_size: 2 is modelled with recompute preemption and no prefix caching"),
    ("pp-swap", {"pipeline_parallel_size": 2, "engine.preemption_mode": "swap"}, "recompute preemption"),
    ("pp-constant-cost", {"pipeline_parallel_size": 2, "profile": "constant:per_step_s=0.01"},
     "pipeline_parallel_size: 2 needs per-stage prices"),
    ("pp-disaggregation", {"pipeline_parallel_size": 2, "disaggregation": DISAGG},
     "pipeline_parallel_size: 2 is not modelled with disaggregation"),
]


@pytest.mark.parametrize("spec, expected", [pytest.param(s, e, id=i) for i, s, e in CASES])
def test_bad_pipeline_input_is_one_line_naming_it(spec, expected, tmp_path, capsys):
    argv, _ = run_case(spec, tmp_path)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stderr: {err!r}"
    assert err.count("\n") == 1 and err.startswith("error: "), f"not one error line: {err!r}"
    assert expected in err, f"{expected!r} not named in {err!r}"
    assert "Traceback" not in err and not out


def test_pipelined_point_runs_the_pipelined_engine_not_the_fast_path():
    # experiments/fast.py's own checks do not look at the deployment: simulate keeps the fast path off
    res = simulate(resolve_point({**BASE, "pipeline_parallel_size": 2, "engine": {"policy": "chunked_prefill",
                                                                                   "fast_path": "auto"}}))
    assert res.summary["pipeline_parallel_size"] == 2
    assert {"pipeline_enter_s", "bubble_s", "num_batches_in_flight"} <= set(res.iterations.columns)
    assert res.summary["num_finished"] == 4


def test_pp1_is_the_plain_engine_as_before():
    for raw in (BASE, {**BASE, "pipeline_parallel_size": 1}):
        res = simulate(resolve_point(raw))
        assert "pipeline_parallel_size" not in res.summary and "bubble_s" not in res.iterations.columns
    a = simulate(resolve_point(BASE)).summary
    b = simulate(resolve_point({**BASE, "pipeline_parallel_size": 1})).summary
    assert {k: v for k, v in a.items() if not (isinstance(v, float) and math.isnan(v))} == \
        {k: v for k, v in b.items() if not (isinstance(v, float) and math.isnan(v))}


def test_a_cluster_of_pipelined_replicas():
    raw = {**BASE, "pipeline_parallel_size": 2, "cluster": {"num_replicas": 2, "router": "round_robin"},
           "workload": {**BASE["workload"], "num_requests": 20, "arrival": {"process": "poisson", "rate_per_s": 50}}}
    res = simulate(resolve_point(raw))
    assert res.summary["num_finished"] == 20 and res.summary["num_gpus"] == 4
    assert res.iterations.groupby("replica_id")["bubble_s"].count().tolist() == \
        res.iterations.groupby("replica_id").size().tolist()   # every row of both replicas has its columns
    busy = res.replicas["busy_fraction"]
    assert (busy > 0).all() and (busy <= 1).all()
    assert res.summary["busy_fraction"] == pytest.approx(busy.mean())


def test_the_pp_example_runs_end_to_end_with_its_report(tmp_path):
    import importlib.util
    from pathlib import Path

    import pandas as pd
    import yaml
    if importlib.util.find_spec("aiconfigurator_core") is None:
        pytest.skip("the example names a Hugging Face id whose config.json the [aic] extra ships")
    sweep = yaml.safe_load((Path(__file__).parent.parent / "examples" / "llama70b_pp2_h200.yaml").read_text())
    sweep["workload"]["num_requests"] = 8
    sweep["grid"] = {"workload.arrival.concurrency": [1, 4]}
    f = tmp_path / "pp.yaml"
    f.write_text(yaml.safe_dump(sweep))
    assert main([str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert (results["pipeline_parallel_size"] == 2).all()
    low, high = results.sort_values("workload.arrival.concurrency")["pipeline_bubble_fraction"]
    assert low == pytest.approx(0.5, abs=0.01) and high < low   # one user: one stage of two works at a time
    assert (tmp_path / "out" / "summary.md").exists() and any((tmp_path / "out" / "plots").glob("*.png"))

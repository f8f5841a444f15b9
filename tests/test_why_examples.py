"""The capacity-planning examples (examples/binding.yaml, diurnal.yaml, gateway.yaml, autoscaling.yaml,
autoscaling_day.yaml, autoscaling_day_70b.yaml, capacity_over_a_day.yaml) run end to end at reduced size through `python -m experiments.run`
and write what they promise."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.test_examples import EXAMPLES, assert_plots, run


def reduced(name: str, tmp_path: Path, **workload) -> Path:
    sweep = yaml.safe_load((EXAMPLES / name).read_text())
    sweep["workload"].update(workload)
    f = tmp_path / name
    f.write_text(yaml.safe_dump(sweep))
    return f


def test_binding_example(tmp_path):
    f = reduced("binding.yaml", tmp_path, num_requests=150)
    sweep = yaml.safe_load(f.read_text())
    sweep["grid"]["workload.arrival.rate_per_s"] = [2, float("inf")]
    f.write_text(yaml.safe_dump(sweep))
    md = run(f, tmp_path / "out")
    assert_plots(tmp_path / "out", {"binding_vs_load.png"})
    r = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(r["binding"]) == ["demand", "kv"]   # the squeezed KV cache binds at saturation
    assert "## What binds" in md and "KV capacity binds" in md


def test_diurnal_example(tmp_path):
    f = reduced("diurnal.yaml", tmp_path, num_requests=300)
    md = run(f, tmp_path / "out")
    assert_plots(tmp_path / "out", {"load_over_time.png"})
    assert "## Offered vs achieved load over time" in md
    resolved = yaml.safe_load((tmp_path / "out" / "points" / "p000-seed0" / "config.yaml").read_text())
    assert resolved["workload"]["arrival"]["rate_per_s"] == {"diurnal": {"mean": 8, "peak_to_trough": 4,
                                                                         "period_s": 3600}}
    assert resolved["workload"]["arrival"]["peak_rate_per_s"] > 12.7


def test_gateway_example(tmp_path):
    f = reduced("gateway.yaml", tmp_path, num_requests=300)
    md = run(f, tmp_path / "out")
    r = pd.read_csv(tmp_path / "out" / "results.csv")
    assert r["num_gateway_refused"].iloc[0] == 0 and r["num_gateway_refused"].is_monotonic_increasing
    assert "## Admission control" in md and "refused with a 429" in md


@pytest.mark.filterwarnings("error::UserWarning")   # matplotlib's "Tight layout not applied": a legend too wide
def test_autoscaling_example(tmp_path):
    f = reduced("autoscaling.yaml", tmp_path, num_requests=400)
    md = run(f, tmp_path / "out")
    r = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(r["replicas_peak"])[1:] == [4, 2] and (r["gpu_hours"] > 0).all()
    assert "## Autoscaling" in md and "GPU-hours" in md
    # the autoscalers are swept whole: each is labelled by what differs (not its eight settings), and since
    # two share max_replicas the setting axis is one category per configuration
    assert "| chunked_prefill, max_replicas=4, min_replicas=1 |" in md and "gpu_price_per_hour=" not in md
    assert "![throughput_by_setting](plots/throughput_by_setting.png)" in md


def test_autoscaling_day_example(tmp_path):
    f = reduced("autoscaling_day.yaml", tmp_path, num_requests=400)   # the first 13 s of the day
    run(f, tmp_path / "out")
    r = pd.read_csv(tmp_path / "out" / "results.csv").iloc[0]
    assert r["replica_timeline"].startswith("0:2") and r["gpu_hours"] > 0 and r["num_finished"] == 400


def test_autoscaling_day_70b_example(tmp_path):
    pytest.importorskip("aiconfigurator_core", reason="names a Hugging Face id whose config.json the [aic] extra ships")
    f = reduced("autoscaling_day_70b.yaml", tmp_path, num_requests=400)   # the first 13 s of the day
    run(f, tmp_path / "out")
    r = pd.read_csv(tmp_path / "out" / "results.csv").iloc[0]
    assert r["replica_timeline"].startswith("0:4") and r["gpu_hours"] > 0 and r["num_finished"] == 400
    point = next((tmp_path / "out" / "points").iterdir())   # the cluster's tables, streamed as it ran
    assert {"iterations.parquet", "replicas.parquet", "requests.parquet"} <= {p.name for p in point.iterdir()}


def test_capacity_over_a_day_example(tmp_path):
    f = reduced("capacity_over_a_day.yaml", tmp_path, num_requests=300)
    sweep = yaml.safe_load(f.read_text())
    sweep["capacity"]["target_rps"]["diurnal"]["period_s"] = 60   # a day in a minute: 1,800 requests a fleet
    sweep["search"]["rel_tolerance"] = 0.25
    f.write_text(yaml.safe_dump(sweep))
    md = run(f, tmp_path / "out")
    cap = pd.read_csv(tmp_path / "out" / "capacity.csv").iloc[0]
    assert cap["replicas"] >= cap["replicas_at_mean"] >= cap["replicas_at_trough"] >= 1
    assert {"check_autoscaled_gpu_hours", "check_peak_slo_attainment", "check_mean_slo_attainment_by_hour"} <= set(cap.index)
    assert "Check over one span of the target" in md

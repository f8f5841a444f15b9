"""A capacity plan for a time-varying `capacity.target_rps` (experiments/capacity_over_time.py): the need over
time and the three fleets' GPU-hours on a hand-worked shape, strict keys, and a search-and-plan run whose
check simulates the autoscaled, peak and mean fleets over the shape."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from experiments import run
from experiments.capacity_over_time import profile_columns
from experiments.capacity_plan import parse_capacity, replicas_needed
from experiments.config import ConfigError

TWO_HOURS = {"stages": [{"duration_s": 3600, "rate_per_s": 10}, {"duration_s": 3600, "rate_per_s": 30}]}


def test_the_need_over_time_and_three_fleets_on_a_hand_worked_shape():
    spec = parse_capacity({"target_rps": TWO_HOURS, "gpu_price_per_hour": 1.0, "headroom": 0.0})
    assert spec.target_rps == 30   # the plan's replicas are the peak's
    # 10 rps per replica: 1 replica for the first hour, 3 for the second; the mean (20 rps) needs 2.
    cols = profile_columns(spec.target_profile, lambda r: replicas_needed(r, 10.0, 0.0), 2, 1.0)
    assert cols["replicas_over_time"] == "0:1 3600:3"
    assert (cols["replicas_at_trough"], cols["replicas_at_mean"]) == (1, 2)
    # 2 GPUs a replica over 2 hours: the peak fleet 3 x 2 x 2 = 12, the mean 8, following the need (1 + 3) x 2 = 8
    assert (cols["gpu_hours_peak"], cols["gpu_hours_mean"], cols["gpu_hours_following"]) == (12.0, 8.0, 8.0)
    assert cols["cost_peak"] == 12.0


@pytest.mark.parametrize("block, key", [
    ({"target_rps": {"diurnal": {"mean": 30, "peak": 3}}}, "capacity.target_rps.diurnal.peak"),
    ({"target_rps": {"sine": {}}}, "capacity.target_rps"),
    ({"target_rps": 5, "autoscaling": {"signal": "kv_usage"}}, "capacity.autoscaling"),
    ({"target_rps": TWO_HOURS, "autoscaling": {"min_replicas": 2}}, "capacity.autoscaling.min_replicas"),
    ({"target_rps": TWO_HOURS, "autoscaling": {"signal": "cpu", "scale_up_above": 1, "scale_down_below": 0}},
     "capacity.autoscaling.signal"),
    ({"target_rps": TWO_HOURS, "autoscaling": {"signal": "kv_usage"}}, "capacity.autoscaling.scale_up_above"),
])
def test_bad_time_varying_targets_name_the_key(block, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_capacity(block)


def test_a_plan_over_a_ramp_checks_three_fleets(tmp_path):
    sweep = {"name": "over_time", "seeds": [0], "model": "llama-3-8b", "hardware": "h100-sxm",
             "profile": "constant:per_step_s=0.02,per_token_s=1e-4", "engine": {"policy": "chunked_prefill"},
             "workload": {"num_requests": 200, "arrival": {"process": "poisson", "rate_per_s": 1},
                          "prompt_tokens": {"dist": "fixed", "value": 200},
                          "output_tokens": {"dist": "fixed", "value": 20}},
             "search": {"over": "workload.arrival.rate_per_s", "slo": {"ttft_p99_ms": 500}, "range": [1, 64],
                        "rel_tolerance": 0.25},
             "capacity": {"target_rps": {"stages": [{"duration_s": 60, "rate_per_s": [5, 60]},
                                                    {"duration_s": 60, "rate_per_s": [60, 5]}]},
                          "gpu_price_per_hour": 2.0, "headroom": 0.2,
                          "autoscaling": {"signal": "waiting_per_replica", "scale_up_above": 2,
                                          "scale_down_below": 0.5, "interval_s": 2, "cooldown_s": 4,
                                          "startup_s": 5}}}
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump(sweep))
    assert run.main([str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    cap = pd.read_csv(tmp_path / "out" / "capacity.csv").iloc[0]
    assert cap["target_rps"] == 60 and cap["target_rps_mean"] == pytest.approx(32.5)
    assert cap["replicas"] > cap["replicas_at_mean"] >= cap["replicas_at_trough"] >= 1
    assert cap["gpu_hours_following"] < cap["gpu_hours_mean"] < cap["gpu_hours_peak"]
    # the simulated check: fixed fleets hold their GPUs for the whole span; the autoscaled one less than the peak
    assert cap["check_peak_replicas_mean"] == cap["replicas"]
    assert cap["check_autoscaled_gpu_hours"] < cap["check_peak_gpu_hours"]
    assert cap["check_autoscaled_cost"] == pytest.approx(cap["check_autoscaled_gpu_hours"] * 2.0)
    assert str(cap["check_peak_slo_attainment_by_hour"]).startswith("0:")
    assert cap["check_peak_slo_attainment"] >= cap["check_mean_slo_attainment"]

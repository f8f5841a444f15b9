"""Arrival rates that change over time: exact cumulative rates and their inverse, the shapes' numbers
worked by hand, arrivals that follow the rate, strict one-line errors naming the key."""
from __future__ import annotations

import numpy as np
import pytest

from workloads.errors import WorkloadError
from workloads.rates import RateProfile, arrival_times_s, parse_rate_profile, trace_profile
from workloads.synthetic import generate, parse_workload


def test_stages_step_and_ramp_and_then_hold():
    p = parse_rate_profile({"stages": [{"duration_s": 100, "rate_per_s": 5},
                                       {"duration_s": 100, "rate_per_s": [5, 25]},
                                       {"duration_s": 100, "rate_per_s": 2}]}, "r")
    # 500 in the first stage, (5 + 25) / 2 x 100 = 1500 in the ramp, 200 in the last; then 2/s on
    assert [p.expected_arrivals(t) for t in (100, 200, 300, 400)] == [500, 2000, 2200, 2400]
    assert p.mean_rate_per_s == pytest.approx(2200 / 300) and p.peak_rate_per_s == 25
    # evenly spaced in expected count (process constant): the 500th arrival starts the ramp at t = 100;
    # within it r(t) = 5 + 0.2 (t - 100), so 5 x + 0.1 x^2 = 1 more arrival at x = 0.19920...
    t = arrival_times_s(p, 2401, "constant", None)
    assert t[500] == pytest.approx(100.0) and t[501] == pytest.approx(100 + (-5 + np.sqrt(25 + 0.4)) / 0.2)
    assert t[2200] == pytest.approx(300.0) and t[2400] == pytest.approx(400.0)


def test_the_inverse_undoes_the_cumulative_rate_on_every_shape():
    shapes = [{"ramp": {"from": 0, "to": 10, "duration_s": 50}},
              {"spike": {"base": 1, "peak": 30, "start_s": 0, "duration_s": 5}},
              {"diurnal": {"mean": 3, "peak_to_trough": 5, "period_s": 600}},
              {"stages": [{"duration_s": 10, "rate_per_s": 0}, {"duration_s": 10, "rate_per_s": 4}]}]
    for spec in shapes:
        p = parse_rate_profile(spec, "r")
        counts = np.linspace(0.5, 3 * p.expected_arrivals(p.span_s), 37)
        back = [p.expected_arrivals(t) for t in p.invert(counts)]
        assert back == pytest.approx(counts, rel=1e-9), spec


def test_diurnal_mean_and_peak_to_trough():
    p = parse_rate_profile({"diurnal": {"mean": 20, "peak_to_trough": 4, "period_s": 86400}}, "r")
    assert p.mean_rate_per_s == pytest.approx(20)
    # mean 20 and peak / trough = 4: 32 at the peak (noon by default), 8 at the trough (t = 0)
    assert p.rate_at(43200) == pytest.approx(32, abs=0.01) and p.rate_at(0) == pytest.approx(8, abs=0.01)
    assert p.rate_at(86400 + 43200) == pytest.approx(p.rate_at(43200))   # it repeats


def test_poisson_arrivals_follow_the_rate():
    p = parse_rate_profile({"spike": {"base": 10, "peak": 100, "start_s": 100, "duration_s": 20}}, "r")
    t = arrival_times_s(p, 4000, "poisson", np.random.default_rng(1))
    n_base, n_spike = np.histogram(t, bins=[0, 100, 120])[0]
    # 1000 and 2000 expected: within 4 standard deviations (sqrt(n))
    assert abs(n_base - 1000) < 4 * np.sqrt(1000) and abs(n_spike - 2000) < 4 * np.sqrt(2000)


def test_a_trace_profile_is_scaled_to_its_peak():
    # 3 arrivals in the first minute, 1 in the second, 6 in the third: rates 15, 5, 30 at a peak of 30
    arrivals = np.r_[[0, 10, 20], [70], [130, 140, 150, 160, 170, 179]]
    p = trace_profile(arrivals, 60, 30.0)
    assert [p.rate_at(t) for t in (30, 90, 150)] == [15, 5, 30] and p.periodic


def test_a_workload_with_a_diurnal_rate_generates_and_describes_itself():
    w = parse_workload({"num_requests": 200, "arrival": {"process": "poisson",
                                                         "rate_per_s": {"diurnal": {"mean": 2, "period_s": 100}}},
                        "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 5}})
    assert w.arrival.rate_per_s == pytest.approx(2)
    specs = generate(w, 0, 8192).specs
    assert len(specs) == 200 and 50 < specs.column("arrival_s")[-1] < 150


@pytest.mark.parametrize("rate, key", [
    ({"weekly": {}}, "workload.arrival.rate_per_s: expected a number or a mapping"),
    ({"diurnal": {"mean": 0}}, "workload.arrival.rate_per_s.diurnal.mean"),
    ({"diurnal": {"mean": 5, "peak_to_trough": 0.5}}, "rate_per_s.diurnal.peak_to_trough"),
    ({"diurnal": {"mean": 5, "amplitude": 2}}, "rate_per_s.diurnal.amplitude"),
    ({"ramp": {"from": 5, "to": 0, "duration_s": 10}}, "rate_per_s.ramp: ends at 0"),
    ({"ramp": {"from": 5, "duration_s": 10}}, "rate_per_s.ramp.to: required"),
    ({"stages": []}, "rate_per_s.stages: expected a list"),
    ({"stages": [{"duration_s": -1, "rate_per_s": 2}]}, "rate_per_s.stages[0].duration_s"),
    ({"stages": [{"duration_s": 5, "rate_per_s": "fast"}]}, "rate_per_s.stages[0].rate_per_s"),
    ({"spike": {"base": 1, "peak": 5, "start_s": 0}}, "rate_per_s.spike.duration_s: required"),
    ({"trace": {"path": "x.csv", "format": "pdf", "peak_rate_per_s": 5}}, "rate_per_s.trace.format"),
])
def test_bad_rates_name_the_key(rate, key):
    with pytest.raises(WorkloadError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        parse_workload({"num_requests": 10, "arrival": {"process": "poisson", "rate_per_s": rate},
                        "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 5}})


def test_a_changing_rate_needs_a_poisson_or_constant_process():
    with pytest.raises(WorkloadError, match=r"workload\.arrival\.rate_per_s: a rate that changes over time needs"):
        parse_workload({"num_requests": 10, "arrival": {"process": "gamma", "cv": 2,
                                                        "rate_per_s": {"ramp": {"from": 1, "to": 2, "duration_s": 5}}},
                        "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 5}})


def test_profiles_compare_by_shape_only():
    assert RateProfile((0.0, 1.0), (1.0, 1.0), False, {"a": 1}) == RateProfile((0.0, 1.0), (1.0, 1.0), False)

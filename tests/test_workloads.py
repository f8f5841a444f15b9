"""Length distributions, arrival processes and seeding."""
import numpy as np
import pytest

from workloads import WorkloadError, generate, parse_length_dist, parse_workload


def wl(**over):
    d = {"num_requests": 2000, "arrival": {"process": "poisson", "rate_per_s": 10},
         "prompt_tokens": {"dist": "lognormal", "median": 512, "sigma": 1.0, "max": 4096},
         "output_tokens": {"dist": "exponential", "mean": 128, "max": 1536}}
    d.update(over)
    return parse_workload(d)


def test_max_truncates_by_resampling_not_clamping():
    x = parse_length_dist({"dist": "exponential", "mean": 128, "max": 32}, "o").sample(np.random.default_rng(0), 20000)
    assert x.max() <= 32 and x.min() >= 1
    assert (x == 32).mean() < 0.05  # a clamp would pile ~78% of the mass at 32


@pytest.mark.parametrize("spec, mean", [({"dist": "fixed", "value": 7}, 7), ({"dist": "uniform", "min": 10, "max": 20}, 15),
                                        ({"dist": "lognormal", "median": 100, "sigma": 0.5}, 100 * np.exp(0.125)),
                                        ({"dist": "pareto", "alpha": 3, "min": 10}, 15)])
def test_distribution_means(spec, mean):
    x = parse_length_dist(spec, "k").sample(np.random.default_rng(1), 40000)
    assert x.mean() == pytest.approx(mean, rel=0.03)


def test_poisson_and_gamma_rates_and_burstiness():
    for cv in (1.0, 3.0):
        g = generate(wl(arrival={"process": "gamma", "rate_per_s": 4, "cv": cv}, num_requests=20000), 0, 8192)
        t = np.array([s.arrival_s for s in g.specs])
        gaps = np.diff(t)
        assert 1 / gaps.mean() == pytest.approx(4, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_streams_are_independent():
    a = generate(wl(), 0, 8192)
    b = generate(wl(output_tokens={"dist": "fixed", "value": 5}), 0, 8192)
    assert [s.arrival_s for s in a.specs] == [s.arrival_s for s in b.specs]
    assert [s.num_prompt_tokens for s in a.specs] == [s.num_prompt_tokens for s in b.specs]


def test_clipping_to_model_limits_is_counted():
    g = generate(wl(prompt_tokens={"dist": "fixed", "value": 3000}, output_tokens={"dist": "fixed", "value": 2000}), 0, 4096)
    assert g.num_clipped_prompts == 0 and g.num_clipped_outputs == 2000
    assert all(s.num_prompt_tokens + s.num_output_tokens == 4096 for s in g.specs)


def test_bad_distribution_keys():
    with pytest.raises(WorkloadError, match=r"workload.prompt_tokens.mean: unknown key for dist lognormal"):
        parse_length_dist({"dist": "lognormal", "median": 5, "sigma": 1, "mean": 3}, "workload.prompt_tokens")
    with pytest.raises(WorkloadError, match=r"k.sigma: expected a number > 0"):
        parse_length_dist({"dist": "lognormal", "median": 5, "sigma": -1}, "k")


def test_workload_modules_import_one_way():
    """synthetic.py imports traces.py and never the reverse: the pieces both need (Arrival,
    GeneratedRequests, clip_to_model, parse_long_prompts) live in workloads/requests.py. No module below
    synthetic.py names it, not even in a function-level import (which is how the cycle used to hide)."""
    from pathlib import Path

    import workloads.requests as shared
    import workloads.synthetic as synthetic
    import workloads.traces as traces
    root = Path(__file__).resolve().parents[1] / "workloads"
    for name in ("traces.py", "requests.py", "prefix.py", "distributions.py", "errors.py"):
        assert "workloads.synthetic" not in (root / name).read_text(), name
    for name in ("Arrival", "GeneratedRequests", "clip_to_model", "parse_long_prompts"):
        assert getattr(synthetic, name) is getattr(shared, name)  # old import paths keep working
    assert traces.Arrival is shared.Arrival


def test_compact_specs_read_back_as_the_request_specs():
    """generate's compact columns (simcore.request.RequestSpecs) give, spec by spec, what the RequestSpec
    objects would hold: plain Python ints and floats, None for an absent max_new_tokens."""
    from simcore.request import RequestSpec, RequestSpecs
    specs = RequestSpecs(np.array([0.5, 1.25, 2.0]), np.array([10, 20, 30]), np.array([3, 1, 7]),
                         np.ma.masked_array([5, 0, 9], mask=[False, True, False]), np.array([0, 2, 1]))
    expected = (RequestSpec(0, 0.5, 10, 3, 5, None, 0), RequestSpec(1, 1.25, 20, 1, None, None, 2),
                RequestSpec(2, 2.0, 30, 7, 9, None, 1))
    assert tuple(specs) == expected and specs == expected and len(specs) == 3
    assert specs[-1] == expected[-1] and specs[1:] == expected[1:] and specs + expected[:1] == expected + expected[:1]
    assert all(type(getattr(specs[1], f)) is type(getattr(expected[1], f))
               for f in ("request_id", "arrival_s", "num_prompt_tokens", "max_new_tokens", "priority"))
    with pytest.raises(IndexError):
        specs[3]
    assert specs.column("num_output_tokens").tolist() == [3, 1, 7] and specs.column("request_id").tolist() == [0, 1, 2]
    g = generate(wl(priority={"classes": [0, 1], "weights": [0.5, 0.5]}, long_prompts="clip"), 0, 2048).specs
    assert isinstance(g, RequestSpecs)
    assert all(s.max_new_tokens == max(s.num_output_tokens, min(1536, max(1, 2048 - s.num_prompt_tokens)))
               and s.request_id == k for k, s in enumerate(g))

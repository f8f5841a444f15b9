"""SLO search: an answer known by hand, the algorithm on synthetic responses (non-monotone, infeasible,
above range), the confidence rules, steady-state windows, resuming, and strict validation."""
from __future__ import annotations

import copy
import math

import pytest

import experiments.search_run as search_run
from experiments.config import ConfigError
from experiments.search import SearchSpec, bracket_then_bisect, parse_search
from experiments.search_run import run_search
from experiments.simulate import simulate

# Constant cost: every step costs 10 ms + 0.1 ms per token. Closed loop, N users, prompts of 100 tokens and
# outputs of 10, token budget large enough for all prompts in one step: the N users stay in lock-step, each
# round is one prefill step of N*100 tokens (10 ms + N*10 ms: every TTFT) then 9 decode steps of N tokens.
# So p99 TTFT = 10 + 10N ms: with an SLO of 205 ms, 19 users pass (200 ms) and 20 fail (210 ms).
BY_HAND = {
    "name": "by_hand", "seeds": [0, 1], "model": "llama-3-8b", "hardware": "h100-sxm",
    "profile": "constant:per_step_s=0.01,per_token_s=1e-4",
    "engine": {"policy": "continuous", "max_num_seqs": 256, "max_num_batched_tokens": 65536},
    "workload": {"num_requests": 40, "arrival": {"process": "closed", "concurrency": 1},
                 "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}},
    "search": {"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 205}, "range": [1, 64]},
}


def round_s(n: int) -> float:
    return (0.01 + n * 100 * 1e-4) + 9 * (0.01 + n * 1e-4)


def test_search_finds_the_answer_computed_by_hand(tmp_path):
    res = run_search(BY_HAND, tmp_path, jobs=1, progress=False)
    row = res.searches.iloc[0]
    assert (row["status"], row["max_value"], row["first_fail"]) == ("ok", 19, 20)
    assert row["ttft_p99_ms_at_max"] == pytest.approx(200.0)
    assert row["throughput_rps"] == pytest.approx(19 / round_s(19))          # steady-state window
    assert row["output_tok_per_s"] == pytest.approx(19 * 10 / round_s(19))
    # the neighbours really are on either side of the SLO, straight from the simulator
    for n, ok in ((19, True), (20, False)):
        cfg = search_run.load_config({k: v for k, v in BY_HAND.items() if k not in ("search", "seeds")},
                                     res.spec, n)
        assert (simulate(cfg, 0).summary["ttft_p99_ms"] <= 205) is ok
    pts = res.points
    assert set(pts.columns) >= {"concurrency", "seed", "meets_slo", "load_passes", "ttft_p99_ms", "throughput_rps"}
    assert len(pts) == 2 * pts["concurrency"].nunique()           # every load, every seed, kept
    assert pts[pts["concurrency"] == 20]["meets_slo"].eq(False).all()
    assert (tmp_path / "search.csv").exists() and (tmp_path / "search_points.csv").exists()


def test_infeasible_is_reported(tmp_path):
    sweep = copy.deepcopy(BY_HAND)
    sweep["search"]["slo"] = {"ttft_p99_ms": 15}   # one user already waits 20 ms
    res = run_search(sweep, tmp_path, jobs=1, progress=False)
    row = res.searches.iloc[0]
    assert row["status"] == "infeasible" and math.isnan(row["max_value"]) and row["first_fail"] == 1
    assert "even the lowest value misses" in row["note"]
    assert len(res.points) == 2  # only the lowest load, both seeds


def test_above_range_is_reported(tmp_path):
    sweep = copy.deepcopy(BY_HAND)
    sweep["search"]["range"] = [1, 8]
    row = run_search(sweep, tmp_path, jobs=1, progress=False).searches.iloc[0]
    assert (row["status"], row["max_value"]) == ("above_range", 8) and "above the range" in row["note"]


def drive(spec: SearchSpec, passes) -> tuple:
    gen, asked = bracket_then_bisect(spec), []
    v = next(gen)
    try:
        while True:
            asked.append(v)
            v = gen.send(passes(v))
    except StopIteration as stop:
        return stop.value, asked


def spec(**kw) -> SearchSpec:
    base = dict(over="workload.arrival.concurrency", slo_ms=(("ttft_p99_ms", 1.0),), lo=1, hi=64)
    return SearchSpec(**{**base, **kw})


def test_bisection_sequence_and_tolerance():
    out, asked = drive(spec(), lambda v: v <= 37)
    assert asked[:7] == [1, 2, 4, 8, 16, 32, 64]       # bracketing doubles until a failure
    assert (out.status, out.best, out.first_fail, out.non_monotone) == ("ok", 37, 38, ())
    assert asked[-1] == 57                               # probe above the failure (2x = 64 already known)
    out, _ = drive(spec(tolerance=4), lambda v: v <= 37)
    assert out.first_fail - out.best <= 4 and out.best <= 37 < out.first_fail
    rate = SearchSpec("workload.arrival.rate_per_s", (("ttft_p99_ms", 1.0),), 0.5, 100, tolerance=0.0,
                      rel_tolerance=0.02)
    out, _ = drive(rate, lambda v: v <= 7.3)
    assert out.best <= 7.3 < out.first_fail and out.first_fail - out.best <= 0.02 * out.best


def test_non_monotone_response_is_flagged_not_hidden():
    # passes at 1..10 and again at 20..25: bisection alone would report 10 and never look higher
    out, asked = drive(spec(), lambda v: v <= 10 or 20 <= v <= 25)
    assert (out.best, out.first_fail) == (10, 11)
    assert out.non_monotone == (22,) and "NON-MONOTONE" in out.message
    assert asked[-1] == 22  # the probe at 2x the first failure (1.5x = 16 was tried while bracketing)


def test_confidence_rules():
    assert spec().seeds_pass([True, True, True]) and not spec().seeds_pass([True, False, True])
    maj = spec(confidence="majority")
    assert maj.seeds_pass([True, False, True]) and not maj.seeds_pass([True, False])
    assert spec(confidence=0.5).seeds_pass([True, False]) and "50%" in spec(confidence=0.5).rule_text
    assert "every seed" in spec().rule_text


def test_missing_metric_fails_the_slo():
    s = spec(slo_ms=(("itl_p99_ms", 50.0),))
    assert not s.meets_slo({"itl_p99_ms": math.nan}) and s.meets_slo({"itl_p99_ms": 49.0})


def test_resume_reuses_every_saved_simulation(tmp_path, monkeypatch):
    first = run_search(BY_HAND, tmp_path, jobs=1, progress=False)

    def boom(*a, **k):
        raise AssertionError("a finished simulation was run again")
    monkeypatch.setattr(search_run, "evaluate_load", boom)
    monkeypatch.setattr(search_run, "run_detail", boom)
    again = run_search(BY_HAND, tmp_path, jobs=1, progress=False)
    assert again.num_reused == len(first.points)
    assert again.searches["max_value"].tolist() == first.searches["max_value"].tolist()


def test_resume_after_interruption_runs_only_what_is_missing(tmp_path, monkeypatch):
    first = run_search(BY_HAND, tmp_path, jobs=1, progress=False)
    saved = sorted((tmp_path / "search" / "g000").glob("*.json"))
    for f in saved[-3:]:
        f.unlink()   # as if killed before these finished
    calls = []
    real = search_run.evaluate_load
    monkeypatch.setattr(search_run, "evaluate_load", lambda *a: calls.append(a[2:]) or real(*a))
    again = run_search(BY_HAND, tmp_path, jobs=1, progress=False)
    assert len(calls) == 3 and again.num_reused == len(first.points) - 3
    assert again.searches["max_value"].iloc[0] == 19


@pytest.mark.parametrize("block, key", [
    ({"over": "workload.num_requests", "slo": {"ttft_p99_ms": 1}, "range": [1, 2]}, "search.over"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p98_ms": 1}, "range": [1, 2]}, "search.slo.ttft_p98_ms"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": -1}, "range": [1, 2]}, "search.slo.ttft_p99_ms"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 1}, "range": [1.5, 2]}, "search.range"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 1}, "range": [4, 2]}, "search.range"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 1}}, "search.range"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 1}, "range": [1, 2], "seed": 1}, "search.seed"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 1}, "range": [1, 2], "confidence": 2},
     "search.confidence"),
    ({"over": "workload.arrival.concurrency", "slo": {"ttft_p99_ms": 1}, "range": [1, 2], "tolerance": 0.5},
     "search.tolerance"),
])
def test_bad_search_blocks_name_the_key(block, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_search(block)


def test_search_over_must_match_the_arrival_process(tmp_path):
    sweep = copy.deepcopy(BY_HAND)
    sweep["search"]["over"] = "workload.arrival.rate_per_s"
    sweep["search"]["range"] = [1, 10]
    with pytest.raises(ConfigError, match="search.over"):
        run_search(sweep, tmp_path, jobs=1, progress=False)
    sweep = copy.deepcopy(BY_HAND)
    sweep["grid"] = {"workload.arrival.concurrency": [1, 2]}
    with pytest.raises(ConfigError, match="grid.workload.arrival.concurrency"):
        run_search(sweep, tmp_path, jobs=1, progress=False)

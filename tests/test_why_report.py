"""A sweep's report gains what binds (a sentence per point, the figure) and, for a rate that changes over
time, offered vs achieved load over time."""
from __future__ import annotations

import copy

from experiments.report_sweep import sweep_report
from experiments.sweep import run_sweep
from tests.test_binding import SATURATED


def test_summary_names_what_binds_and_draws_it(tmp_path):
    sweep = {**copy.deepcopy(SATURATED), "name": "b", "seeds": [0]}
    sweep["grid"] = {"workload.arrival.rate_per_s": [1, float("inf")]}
    res = run_sweep(sweep, tmp_path, jobs=1, progress=False)
    assert list(res.results["binding"]) == ["demand", "max_num_seqs"]
    made = sweep_report(sweep, tmp_path, res.results)
    text = (tmp_path / "summary.md").read_text()
    assert "## What binds" in text
    assert "rate_per_s inf** (`p001-seed0`): The sequence cap (max_num_seqs) binds" in text
    assert (tmp_path / "plots" / "binding_vs_load.png") in made


def test_a_changing_rate_gets_its_load_over_time(tmp_path):
    sweep = {**copy.deepcopy(SATURATED), "name": "d", "seeds": [0]}
    sweep["workload"]["arrival"]["rate_per_s"] = {"ramp": {"from": 1, "to": 20, "duration_s": 5}}
    res = run_sweep(sweep, tmp_path, jobs=1, progress=False)
    made = sweep_report(sweep, tmp_path, res.results)
    assert (tmp_path / "plots" / "load_over_time.png") in made
    assert "## Offered vs achieved load over time" in (tmp_path / "summary.md").read_text()


def test_the_gateway_trade_is_stated_per_point(tmp_path):
    sweep = {**copy.deepcopy(SATURATED), "name": "g", "seeds": [0], "slo": {"ttft_ms": 1000}}
    sweep["grid"] = {"gateway": [None, {"max_waiting": 10}]}
    res = run_sweep(sweep, tmp_path, jobs=1, progress=False)
    sweep_report(sweep, tmp_path, res.results)
    text = (tmp_path / "summary.md").read_text()
    # 40 requests at t = 0, 2 sequences at a time: with a queue of 10, 40 - 2... every arrival comes before
    # the first decision, so 10 queue and 30 are refused
    assert "No gateway: p99 TTFT" in text
    assert "The gateway ended 30 of 40 requests (75%: 30 refused with a 429, 0 dropped" in text

"""Capacity plan arithmetic and validation."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.capacity_plan import CapacitySpec, parse_capacity, plan, replicas_needed
from experiments.config import ConfigError


def test_replicas_keep_every_replica_under_its_headroom():
    assert replicas_needed(50, 10, 0.2) == 7        # 50 / (10 * 0.8) = 6.25 -> 7
    assert replicas_needed(48, 10, 0.4) == 8        # exactly 8 * 6 = 48 still fits
    assert replicas_needed(0.1, 10, 0.0) == 1
    assert replicas_needed(5, math.nan, 0.2) is None and replicas_needed(5, 0, 0.2) is None


def searches(over_rate: bool = True) -> pd.DataFrame:
    return pd.DataFrame([
        {"grid_point": "g000", "policy": "continuous", "status": "ok", "max_value": 10.0,
         "throughput_rps": 9.8, "output_tok_per_s": 9.8 * 200},
        {"grid_point": "g001", "policy": "static", "status": "infeasible", "max_value": math.nan,
         "throughput_rps": math.nan, "output_tok_per_s": math.nan},
    ])


def test_plan_table_counts_gpus_and_cost():
    cap = plan(searches(), "workload.arrival.rate_per_s", {"g000": 2, "g001": 2},
               CapacitySpec(target_rps=50, gpu_price_per_hour=2.5, headroom=0.2), [])
    ok = cap.iloc[0]
    assert (ok["replicas"], ok["gpus"], ok["cost_per_hour"]) == (7, 14, 35.0)
    # 50 req/s x 200 output tokens = 36 M tokens an hour for 35 an hour
    assert ok["cost_per_million_output_tokens"] == pytest.approx(35.0 / (50 * 200 * 3600) * 1e6)
    assert ok["utilization"] == pytest.approx(50 / 70)
    bad = cap.iloc[1]
    assert bad["replicas"] is None or pd.isna(bad["replicas"])
    assert "no load meets the SLO" in bad["note"]


def test_concurrency_search_falls_back_to_throughput_and_says_so():
    cap = plan(searches(), "workload.arrival.concurrency", {"g000": 1, "g001": 1}, CapacitySpec(target_rps=20), [])
    assert cap.iloc[0]["capacity_rps_per_replica"] == 9.8
    assert "closed-loop" in cap.iloc[0]["capacity_basis"] and "cost_per_hour" not in cap.columns


@pytest.mark.parametrize("block, key", [
    ({"gpu_price_per_hour": 2}, "capacity.target_rps"),
    ({"target_rps": 0}, "capacity.target_rps"),
    ({"target_rps": 5, "headroom": 1}, "capacity.headroom"),
    ({"target_rps": 5, "price": 1}, "capacity.price"),
    ({"target_rps": 5, "router": "magic"}, "capacity.router"),
    ({"target_rps": 5, "verify": "yes"}, "capacity.verify"),
])
def test_bad_capacity_blocks_name_the_key(block, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_capacity(block)


def test_plan_prices_both_sides_of_the_work():
    """Code completion: long prompts, short answers. The input side's figures must be there to read."""
    s = searches()
    s["input_tok_per_s"] = [9.8 * 1500, math.nan]
    s["cost_model_basis"] = ["measured profile X", "measured profile X"]
    cap = plan(s, "workload.arrival.rate_per_s", {"g000": 1, "g001": 1},
               CapacitySpec(target_rps=50, gpu_price_per_hour=2.5, headroom=0.2), [])
    ok = cap.iloc[0]
    per_hour = ok["cost_per_hour"]
    assert ok["input_tokens_per_request"] == pytest.approx(1500)
    assert ok["output_tokens_per_request"] == pytest.approx(200)
    assert ok["input_tok_per_s"] == pytest.approx(50 * 1500)
    assert ok["cost_per_million_input_tokens"] == pytest.approx(per_hour / (50 * 1500 * 3600) * 1e6)
    assert ok["cost_per_million_total_tokens"] == pytest.approx(per_hour / (50 * 1700 * 3600) * 1e6)
    assert list(cap["cost_model_basis"]) == ["measured profile X"] * 2

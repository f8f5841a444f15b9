"""`engine.vllm_version`: the rules that changed between vLLM releases (policies/vllm_versions.py), each
where it acts. That our scheduler then makes vLLM 0.15.1's and 0.19.0's own decisions step for step is
benchmarks.scheduler_equivalence's (those releases are not installed here; docs/how-it-works.md)."""
from __future__ import annotations

import pandas as pd
import pytest

from costmodels.catalog import get_gpu
from experiments.config import ConfigError, resolve_point
from experiments.kv_groups import point_kv_groups
from experiments.simulate import engine_limits, memory_plan, point_cost_model, simulate
from policies import ChunkedPrefill, imitated
from policies.vllm_versions import CHANGES, MODELLED, VllmRules, vllm_rules
from simcore.batch import Batch, Scheduled as S
from simcore.errors import SimulationError
from simcore.kvcache import PrefixCachingBlockPool
from simcore.request import Request, RequestSpec, Status
from tests.helpers import req, view
from tests.test_hybrid_kv import tiny_point


def point(**engine):
    return {"model": "llama-3-8b", "hardware": "h100-sxm", "profile": "roofline",
            "engine": {"policy": "chunked_prefill", **engine},
            "workload": {"num_requests": 20, "arrival": {"process": "poisson", "rate_per_s": 5},
                         "prompt_tokens": {"dist": "fixed", "value": 300},
                         "output_tokens": {"dist": "fixed", "value": 20}}}


def test_each_rule_turns_on_at_the_release_that_brought_it():
    for (major, minor), field, _ in CHANGES:
        before, at = vllm_rules(f"{major}.{minor - 1}.9"), vllm_rules(f"{major}.{minor}.0")
        assert not getattr(before, field) and getattr(at, field), field
    assert vllm_rules() == vllm_rules(MODELLED) and all(vars(vllm_rules(MODELLED)).values())
    assert vllm_rules("0.11.2.post2") == VllmRules("0.11.2.post2", **{f: False for _, f, _ in CHANGES})


def test_a_replay_runs_as_the_nearest_release_modelled():
    from policies.vllm_versions import nearest_modelled
    assert [nearest_modelled(v) for v in ("0.15.1", "v0.15.1", "0.15.1+cu128", "0.19.0rc1", "0.10.2", "0.40.0",
                                          "unknown", None)] == \
        ["0.15.1", "v0.15.1", "0.15.1+cu128", "0.19.0rc1", "0.11.0", MODELLED, None, None]
    assert vllm_rules("v0.18.1") == VllmRules("v0.18.1", **{f: since < (0, 19) for since, f, _ in CHANGES})


@pytest.mark.parametrize("value, words", [
    (0.19, "quoted string"), ("nineteen", "a release such as"), ("0.10.2", "outside the releases modelled"),
    ("0.33.0", "outside the releases modelled")])
def test_a_bad_release_is_one_line_naming_the_key(value, words):
    with pytest.raises(ConfigError, match="engine.vllm_version") as e:
        resolve_point(point(vllm_version=value))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_only_vllms_own_scheduler_takes_it():
    with pytest.raises(ConfigError, match="engine.vllm_version: not a knob of policy sglang"):
        resolve_point(point(policy="sglang", vllm_version="0.19.0"))


def test_admission_defaults_to_the_releases_rule_and_an_explicit_knob_wins():
    assert not ChunkedPrefill(vllm_version="0.18.1").scheduler_reserve_full_isl
    assert ChunkedPrefill(vllm_version="0.19.0").scheduler_reserve_full_isl
    assert ChunkedPrefill(vllm_version="0.18.1", scheduler_reserve_full_isl=True).scheduler_reserve_full_isl


def test_the_threshold_caps_a_lone_request_before_031():
    alone = view(waiting=[req(10, 1000)])
    for version, tokens in (("0.30.0", 200), ("0.31.0", 512)):
        policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=512, long_prefill_token_threshold=200,
                                vllm_version=version)
        assert policy.schedule(alone) == Batch((S(10, tokens),))


def test_the_adaptive_threshold_floors_the_cap_at_the_budgets_fair_share():
    two = view(waiting=[req(10, 1000), req(11, 1000)])
    for adaptive, tokens in ((False, 100), (True, 256)):   # 512 // 2 requests
        policy = ChunkedPrefill(max_num_seqs=8, max_num_batched_tokens=512, long_prefill_token_threshold=100,
                                long_prefill_token_threshold_adaptive=adaptive)
        assert policy.schedule(two) == Batch((S(10, tokens), S(11, tokens)))
    with pytest.raises(ConfigError, match="engine.long_prefill_token_threshold_adaptive: a knob of vLLM 0.31"):
        resolve_point(point(long_prefill_token_threshold_adaptive=True, vllm_version="0.30.0"))


def test_batch_defaults_of_a_b200_follow_the_release():
    b200 = get_gpu("b200")
    assert ChunkedPrefill.for_gpu(b200, 8192).max_num_batched_tokens == 16384
    assert ChunkedPrefill.for_gpu(b200, 8192, vllm_version="0.27.1").max_num_batched_tokens == 8192


def test_async_scheduling_is_off_by_default_before_014():
    for version, on in (("0.13.0", False), ("0.14.0", True)):
        cfg = resolve_point(point(vllm_version=version))
        assert engine_limits(cfg, memory_plan(cfg), point_cost_model(cfg)).async_scheduling is on
    cfg = resolve_point(point(vllm_version="0.13.0", async_scheduling=True))   # said explicitly: kept
    assert engine_limits(cfg, memory_plan(cfg), point_cost_model(cfg)).async_scheduling
    # a synchronous engine's CPU time per step adds to its GPU time: every step is longer
    sync, overlapped = (simulate(resolve_point(point(vllm_version=v))).summary for v in ("0.13.0", "0.14.0"))
    assert sync["tpot_mean_ms"] > overlapped["tpot_mean_ms"]


def freed_order(hashless_first: bool) -> list[int]:
    """Two requests' blocks freed in turn (one full block each, cached, and one partial one, not), then
    three new blocks allocated: the order they come back in (as the finished requests' ids)."""
    pool = PrefixCachingBlockPool(5, 4)   # 4 usable blocks
    pool.hashless_blocks_first = hashless_first
    owners, done = {}, []
    for rid in (0, 1):
        r = Request(RequestSpec(rid, 0.0, 6, 2, prefix_block_ids=(rid + 1,)))
        r.status = Status.RUNNING
        pool.grow(r, 6)
        r.num_computed_tokens = 6
        pool.cache_full_blocks(r)
        owners.update({id(b): (rid, b.block_hash is not None) for b in pool._held[rid]})
        done.append(r)
    for r in done:
        r.status = Status.FINISHED
        pool.free(r)
    new = Request(RequestSpec(9, 0.0, 12, 2))
    new.status = Status.RUNNING
    pool.grow(new, 12)
    return [owners[id(b)] for b in pool._held[9]]


def test_the_free_queue_reuses_uncached_blocks_first_since_024():
    # 0.24 on: the two uncached partial blocks first (the last freed at the head), then the oldest cached one
    assert freed_order(True) == [(1, False), (0, False), (0, True)]
    # before: every block at the tail in the order freed (each request's last block first)
    assert freed_order(False) == [(0, False), (0, True), (1, False)]


def test_a_release_before_024_frees_as_it_did_and_both_engines_agree():
    shared = {"num_requests": 80, "arrival": {"process": "poisson", "rate_per_s": 40},
              "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 0.6, "max": 3000},
              "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max": 300},
              "shared_prefix": {"num_groups": 4, "prefix_tokens": 400}}
    hits = {}
    for version in ("0.19.0", MODELLED):
        runs = [simulate(resolve_point({**point(vllm_version=version, enable_prefix_caching=True, num_gpu_blocks=200,
                                                fast_path=f), "workload": shared})) for f in ("on", "off")]
        assert runs[0].requests.equals(runs[1].requests)
        hits[version] = runs[0].summary["prefix_hit_rate"]
    assert hits["0.19.0"] != hits[MODELLED]


def test_a_kv_connector_turned_the_hybrid_manager_off_before_022(tmp_path):
    offload = {"enable_prefix_caching": True, "kv_offload": {"cpu_gb": 1}}
    cfg = resolve_point(tiny_point(tmp_path, vllm_version="0.21.0", **offload))
    assert point_kv_groups(cfg) is None   # sliding layers counted whole, as vLLM did
    with pytest.raises(SimulationError, match="not modelled with engine.kv_offload"):
        point_kv_groups(resolve_point(tiny_point(tmp_path, vllm_version="0.22.0", **offload)))


def test_the_hybrid_manager_with_prefix_caching_before_024_runs_as_032_and_says_so(tmp_path):
    from experiments.config_warnings import point_warnings
    old = resolve_point(tiny_point(tmp_path, vllm_version="0.19.0", enable_prefix_caching=True))
    assert point_kv_groups(old) is not None and simulate(old).summary["num_finished"] == 60
    (line,) = point_warnings(old, {})
    assert line.startswith("engine.vllm_version: 0.19.0's free queue") and "\n" not in line
    assert point_warnings(resolve_point(tiny_point(tmp_path, vllm_version="0.24.0", enable_prefix_caching=True)), {}) == []


def test_the_answer_says_which_release_it_schedules_as(tmp_path):
    from experiments.sweep import run_sweep
    sweep = {"name": "versions", **point(), "grid": {"engine.vllm_version": ["0.15.1", "0.32.0"]}}
    results = run_sweep(sweep, tmp_path, jobs=1, progress=False).results
    assert list(results["vllm_version"]) == ["0.15.1", "0.32.0"]
    words = imitated(results["policy"], results["vllm_version"])
    assert "step for step as vLLM 0.15.1 and 0.32.0's" in words
    assert "as vLLM 0.32.0's" in imitated(["chunked_prefill"])
    assert list(pd.read_csv(tmp_path / "results.csv")["vllm_version"]) == ["0.15.1", "0.32.0"]

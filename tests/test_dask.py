"""The same sweep and search run on a Dask distributed cluster (an in-process LocalCluster)."""
from __future__ import annotations

import copy

import pytest

from experiments.search_run import run_search
from experiments.sweep import run_sweep
from tests.test_search import BY_HAND

distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")

SWEEP = {
    "name": "dask", "seeds": [0, 1], "model": "llama-3-8b", "hardware": "h100-sxm",
    "engine": {"policy": "continuous"},
    "workload": {"num_requests": 20, "arrival": {"process": "poisson", "rate_per_s": 4},
                 "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
                 "output_tokens": {"dist": "uniform", "min": 8, "max": 32}},
    "grid": {"engine.policy": ["static", "chunked_prefill"]},
}


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as c:
        yield c.scheduler_address


def test_sweep_on_dask_matches_local(cluster, tmp_path):
    remote = run_sweep(SWEEP, tmp_path / "dask", progress=False, dask_address=cluster)
    local = run_sweep(SWEEP, tmp_path / "local", jobs=1, progress=False)
    cols = ["point", "ttft_p99_ms", "output_tok_per_s"]
    assert remote.results[cols].equals(local.results[cols])
    assert len(list((tmp_path / "dask" / "points").glob("*/summary.json"))) == 4


def test_search_on_dask_finds_the_same_answer(cluster, tmp_path):
    sweep = copy.deepcopy(BY_HAND)
    res = run_search(sweep, tmp_path, progress=False, dask_address=cluster)
    assert res.searches.iloc[0]["max_value"] == 19
    assert (tmp_path / "search" / "g000" / "detail-c19" / "requests.parquet").exists()


def test_command_line_dask_option(cluster, tmp_path):
    import yaml

    from experiments.run import main
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(SWEEP))
    assert main([str(f), "--out", str(tmp_path / "out"), "--dask", cluster, "--quiet", "--no-plots"]) == 0
    assert (tmp_path / "out" / "results.csv").exists()

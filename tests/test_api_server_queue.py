"""The API server as a queue (simcore/api_server.py): its waits on a timeline worked by hand, the same waits
whether the steps come whole or in frames (as a streamed run reads them back), and what a run reports."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.config import resolve_point
from experiments.simulate import simulate
from simcore.api_server import APIServerQueue


def _requests(rows, queued=None):
    """Requests scheduled as they arrive unless `queued` gives the engine's queue time of each."""
    df = pd.DataFrame(rows, columns=["replica_id", "arrival_s", "first_token_s", "finish_s", "status"])
    df["admitted_s"] = df["arrival_s"] + (0.0 if queued is None else np.asarray(queued))
    return df


def _steps(rows):
    return pd.DataFrame(rows, columns=["start_s", "duration_s", "decode_tokens", "replica_id"])


def test_waits_on_a_timeline_worked_by_hand():
    """1 ms to admit, 0.1 ms a chunk. A arrives at 0 and B at 0.5 ms: B waits for A's admission (0.5 ms).
    C arrives at 9.9 ms and is never scheduled: its admission runs to 10.9 ms, so the step ending at 10 ms
    (A's first token, one chunk) waits 0.9 ms. At 20 ms A decodes and B gets its first token: B's chunk
    comes after A's (0.1 ms). At 30 ms both finish: A's chunk first (admitted first), B's after it."""
    req = _requests([(0, 0.0, 0.010, 0.030, "finished"), (0, 0.0005, 0.020, 0.030, "finished"),
                     (0, 0.0099, np.nan, np.nan, "rejected")])
    steps = _steps([(0.0, 0.010, 0, 0), (0.010, 0.010, 1, 0), (0.020, 0.010, 2, 0)])
    q = APIServerQueue(req, 1e-3, 1e-4)
    q.add_steps(steps)
    first, last = q.waits()
    assert np.allclose(first, [0.0009, 0.0005 + 0.0001, 0.0], rtol=0, atol=1e-12)
    assert np.allclose(last, [0.0, 0.0005 + 0.0001, 0.0], rtol=0, atol=1e-12)


def test_an_engine_queue_longer_than_the_servers_hides_its_admission_wait():
    """B arrives at 0.5 ms, during the first 10 ms step, and waits 0.5 ms to be admitted. Under async
    scheduling its first chance is the step after next (20 ms): scheduled then, none of its wait was hidden;
    scheduled at 30 ms, the engine held it 10 ms past that chance anyway and the server hands requests over
    in order, so none of the 0.5 ms shows. Synchronous, its first chance is 10 ms: scheduled at 10.3 ms,
    0.3 ms is hidden and 0.2 ms shows. The chunk waits after the engine are never hidden."""
    rows = [(0, 0.0, 0.010, 0.040, "finished"), (0, 0.0005, 0.040, 0.040, "finished")]
    steps = _steps([(0.0, 0.010, 0, 0), (0.010, 0.010, 1, 0), (0.020, 0.010, 1, 0), (0.030, 0.010, 1, 0)])
    for lag, queued, shown in ((2, 0.0195, 0.0005), (2, 0.0295, 0.0), (1, 0.0098, 0.0002)):
        q = APIServerQueue(_requests(rows, [0.0, queued]), 1e-3, 1e-4, async_lag=lag)
        q.add_steps(steps)
        first, last = q.waits()
        assert first[1] == pytest.approx(shown + 0.0001, abs=1e-12)   # behind A's chunk
        assert last[1] == pytest.approx(shown + 0.0001, abs=1e-12)     # A was admitted first


def test_new_first_tokens_queue_after_the_decodes_and_by_arrival():
    """Three requests get their first token in one step beside 10 decoding ones: they come after the ten
    chunks, in arrival order; finishing in that step, each comes after those of them admitted before it.
    Two API servers halve every wait."""
    req = _requests([(0, 0.002, 0.05, 0.05, "finished"), (0, 0.001, 0.05, 0.05, "finished"),
                     (0, 0.003, 0.05, 0.05, "finished")])
    steps = _steps([(0.04, 0.01, 10, 0)])
    q = APIServerQueue(req, 0.0, 1e-4)
    q.add_steps(steps)
    first, last = q.waits()
    assert np.allclose(first, [11e-4, 10e-4, 12e-4], rtol=0, atol=1e-12)
    assert np.allclose(last, [1e-4, 0.0, 2e-4], rtol=0, atol=1e-12)
    two = APIServerQueue(req, 0.0, 1e-4, api_servers=2)
    two.add_steps(steps)
    assert np.allclose(two.waits()[0], first / 2, rtol=0, atol=1e-12)


def test_a_finishing_request_comes_after_those_admitted_before_it_still_running():
    """The running list keeps admission order: at a request's last step, the requests admitted before it
    and not yet finished are listed first (a request finishing at the same step and admitted earlier
    too); counted by a merge sort, checked here against the pairwise count."""
    from simcore.api_server import _admitted_before, _prior_greater
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 64, 257):
        keys = rng.permutation(n)
        assert np.array_equal(_prior_greater(keys), [(keys[:i] > keys[i]).sum() for i in range(n)])
    admitted = np.array([0.0, 1.0, 2.0, 3.0, np.nan])
    finish = np.array([10.0, 5.0, 10.0, 7.0, np.nan])
    assert np.array_equal(_admitted_before(admitted, admitted, finish), [0, 1, 1, 2, np.nan], equal_nan=True)


def test_speculative_steps_count_one_chunk_per_request():
    req = _requests([(0, 0.0, 0.05, 0.05, "finished")])
    q = APIServerQueue(req, 0.0, 1e-4, drafts_per_step=3)
    q.add_steps(_steps([(0.04, 0.01, 8, 0)]))   # two decoding requests verifying 1 + 3 tokens each
    assert q.waits()[0][0] == pytest.approx(2e-4)


def _point(rate=40.0, frontend=None, replicas=None, fast_path="auto"):
    raw = {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h100-sxm", "profile": "roofline",
           "engine": {"policy": "chunked_prefill", "max_num_seqs": 256, "fast_path": fast_path},
           "workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate_per_s": rate},
                        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max": 2000},
                        "output_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.6, "max": 600}}}
    if frontend is not None:
        raw["engine"]["frontend"] = frontend
    if replicas:
        raw["cluster"] = {"num_replicas": replicas}
    return resolve_point(raw)


def test_steps_in_frames_give_the_waits_of_the_whole_table():
    """A streamed run reads its iterations back in frames: the same waits, bit for bit."""
    res = simulate(_point(frontend="none"), 0)
    whole = APIServerQueue(res.requests, 1.2e-3, 60e-6)
    whole.add_steps(res.iterations)
    framed = APIServerQueue(res.requests, 1.2e-3, 60e-6)
    for lo in range(0, len(res.iterations), 7):
        framed.add_steps(res.iterations.iloc[lo:lo + 7])
    a, b = whole.waits(), framed.waits()
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.isnan(whole.first_wait[(res.requests["status"] == "finished").to_numpy()]).sum() == 0


@pytest.mark.parametrize("replicas", [None, 2])
def test_a_run_adds_the_waits_to_ttft_and_reports_them(replicas):
    """The http front end with and without its API-server CPU: TTFT grows by each request's wait (never
    shrinks), the mean of which the run reports; TPOT moves by under a percent; four servers wait less."""
    calm = simulate(_point(frontend={"kind": "http", "api_server_cpu_per_request_ms": 0,
                                     "api_server_cpu_per_chunk_us": 0}, replicas=replicas), 0)
    queued = simulate(_point(frontend="http", replicas=replicas), 0)
    fin = (queued.requests["status"] == "finished").to_numpy()
    added = (queued.requests["ttft_s"] - calm.requests["ttft_s"]).to_numpy()[fin]
    assert added.min() >= -1e-12 and added.mean() > 0   # float rounding of the two additions
    assert queued.summary["api_server_wait_mean_ms"] == pytest.approx(added.mean() * 1e3, rel=1e-9)
    assert "api_server_wait_mean_ms" not in calm.summary
    assert queued.summary["tpot_mean_ms"] == pytest.approx(calm.summary["tpot_mean_ms"], rel=0.01)
    four = simulate(_point(frontend={"kind": "http", "api_server_count": 4}, replicas=replicas), 0)
    assert four.summary["api_server_wait_mean_ms"] < queued.summary["api_server_wait_mean_ms"]


def test_both_engines_and_a_streamed_run_give_the_same_waits(tmp_path):
    fast = simulate(_point(), 0)
    simpy = simulate(_point(fast_path="off"), 0)
    streamed = simulate(_point(), 0, tables_dir=tmp_path)
    for k in ("ttft_mean_ms", "ttft_p99_ms", "e2e_mean_ms", "api_server_wait_mean_ms"):
        assert fast.summary[k] == simpy.summary[k] == streamed.summary[k]


@pytest.mark.parametrize("change", [
    {"engine": {"policy": "tgi"}},
    {"engine": {"policy": "sglang"}},
    {"engine": {"policy": "chunked_prefill", "speculative": {"method": "eagle3", "num_speculative_tokens": 3}}},
    {"engine": {"policy": "chunked_prefill", "fast_path": "off"}, "cluster": {"num_replicas": 2}},
    {"model": "llama-3.1-70b", "hardware": "h200-sxm", "pipeline_parallel_size": 2},
])
def test_every_first_and_last_token_belongs_to_a_logged_step(change):
    """The queue finds each finished request's first and last token among its replica's steps (the engines
    stamp both with the step's end) under other schedulers, speculation, a cluster and pipeline stages."""
    raw = {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "h100-sxm", "profile": "roofline",
           "engine": {"policy": "chunked_prefill", "frontend": "none"},
           "workload": {"num_requests": 150, "arrival": {"process": "poisson", "rate_per_s": 20.0},
                        "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max": 2000},
                        "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max": 300}}}
    for k, v in change.items():
        raw[k] = {**raw[k], **v, "frontend": "none"} if k == "engine" else v
    res = simulate(resolve_point(raw), 0)
    q = APIServerQueue(res.requests, 1.2e-3, 60e-6,
                       drafts_per_step=3 if "speculative" in raw["engine"] else 0)
    q.add_steps(res.iterations)
    q.waits()
    fin = (res.requests["status"] == "finished").to_numpy()
    assert fin.sum() == 150
    assert not np.isnan(q.first_wait[fin]).any() and not np.isnan(q.last_wait[fin]).any()

"""The binding analysis' per-replica lookup from numpy columns (experiments.binding.lookup_by_replica) holds
what a pandas groupby of the served frame gives: arrivals in stable arrival order per replica, admissions
made nondecreasing, prompts, and the KV blocks freed at each distinct finish time; ties in arrival and
in finish time included."""
from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.binding import _freed_at, lookup_by_replica, served_by_replica


def frame(n=400, seed=3):
    rng = np.random.default_rng(seed)
    arrival = np.round(rng.uniform(0, 20, n), 1)            # rounded: many equal arrivals
    admitted = arrival + np.round(rng.uniform(0, 3, n), 1)
    admitted[rng.uniform(size=n) < 0.1] = np.nan             # never admitted
    finish = admitted + np.round(rng.uniform(0.1, 2, n), 1)  # rounded: many equal finish times
    status = np.where(np.isnan(admitted), "unfinished", "finished").astype(object)
    status[rng.uniform(size=n) < 0.1] = "rejected"
    return pd.DataFrame({"replica_id": rng.integers(0, 5, n), "arrival_s": arrival, "admitted_s": admitted,
                         "finish_s": finish, "prompt_tokens": rng.integers(1, 200, n),
                         "output_tokens": rng.integers(1, 50, n), "status": status})


def reference(served: pd.DataFrame, block_size: int) -> list[tuple]:
    """The lookup as a pandas groupby builds it."""
    out = []
    for r, g in served.groupby("replica_id"):
        g = g.sort_values("arrival_s", kind="stable")
        admitted = np.fmax.accumulate(np.nan_to_num(g["admitted_s"].to_numpy(float), nan=np.inf))
        fin = g[g["status"] == "finished"]
        blocks = -(-(fin["prompt_tokens"] + fin["output_tokens"] - 1).to_numpy() // block_size)
        by_end = pd.Series(blocks).groupby(fin["finish_s"].to_numpy(float)).sum()
        out.append((r, g["arrival_s"].to_numpy(float), admitted, g["prompt_tokens"].to_numpy(), by_end))
    return out


def test_the_lookup_from_columns_equals_a_groupby_of_the_served_frame():
    requests = frame()
    keep = requests["status"] != "rejected"
    served = requests[keep]
    want = reference(served, 16)
    from_frame = served_by_replica(served, 16)
    from_columns = lookup_by_replica(*(requests[c].to_numpy() for c in ("replica_id", "arrival_s", "admitted_s",
                                                                          "finish_s", "prompt_tokens",
                                                                          "output_tokens")),
                                     (requests["status"] == "finished").to_numpy(), 16, np.flatnonzero(keep))
    for got in (from_frame, from_columns):
        assert len(got) == len(want)
        for (r, a, adm, p, (ends, freed)), (wr, wa, wadm, wp, wby_end) in zip(got, want):
            assert r == wr
            assert np.array_equal(a, wa) and np.array_equal(adm, wadm) and np.array_equal(p, wp)
            assert np.array_equal(ends, wby_end.index.to_numpy()) and np.array_equal(freed, wby_end.to_numpy())
            # read at step ends that do and do not match a finish time, as pandas' reindex reads them
            t = np.r_[ends, ends + 0.05, -1.0, 1e9]
            assert np.array_equal(_freed_at((ends, freed), t), wby_end.reindex(t).fillna(0).to_numpy(np.int64))


def test_no_finished_request_frees_nothing():
    assert list(_freed_at((np.zeros(0), np.zeros(0, dtype=np.int64)), np.array([0.0, 1.0]))) == [0, 0]

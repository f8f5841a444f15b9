"""The request table as vLLM's engine core stamps it (simcore.metrics.engine_core_view): its busy loop
queues new requests only between steps, so a request that came while a step ran is measured from that
step's end, on its own replica; one that came to an idle engine, from its arrival."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simcore.metrics import engine_core_view


def table(arrivals, replicas):
    n = len(arrivals)
    arrival = np.asarray(arrivals, dtype=float)
    df = pd.DataFrame({"request_id": np.arange(n), "replica_id": replicas, "arrival_s": arrival,
                       "prompt_tokens": 100, "output_tokens": 11, "admitted_s": arrival + 0.3,
                       "first_token_s": arrival + 0.5, "finish_s": arrival + 1.5, "status": "finished"})
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    return df


def test_a_request_that_came_mid_step_is_queued_at_the_steps_end():
    # replica 0 steps over [0, 0.1), [0.1, 0.4), then idles until 1.0, [1.0, 1.2); replica 1 over [0, 0.45)
    steps = pd.DataFrame({"start_s": [0.0, 0.1, 1.0, 0.0], "duration_s": [0.1, 0.3, 0.2, 0.45],
                          "replica_id": [0, 0, 0, 1]})
    requests = table([0.0, 0.25, 0.7, 1.0, 0.25], [0, 0, 0, 0, 1])
    got = engine_core_view(requests, steps)
    # at the first step's start (it began that step), mid-step (its end, 0.4), while idle (at once), at a
    # step that its own arrival began (at once); the same time on the other replica: that one's step end
    assert got["arrival_s"].to_numpy() == pytest.approx([0.0, 0.4, 0.7, 1.0, 0.45])
    assert got["ttft_s"].to_numpy() == pytest.approx(requests["first_token_s"] - got["arrival_s"])
    assert got["tpot_s"].to_numpy() == pytest.approx(1.0 / 10)   # token gaps do not move
    assert requests["arrival_s"].iloc[1] == 0.25                 # the input table is left as it was

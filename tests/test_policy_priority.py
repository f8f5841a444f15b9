"""vLLM V1 `--scheduling-policy priority` in chunked_prefill, workload priority classes, per-class metrics."""
import numpy as np
import pandas as pd
import pytest

from experiments.config import ConfigError, resolve_point
from policies.chunked_prefill import ChunkedPrefill
from simcore.batch import Batch, Scheduled
from simcore.metrics import per_priority_stats
from tests.engine_views import decoding, view, waiting
from workloads.errors import WorkloadError
from workloads.synthetic import generate, parse_workload

PRIORITY = ChunkedPrefill(max_num_batched_tokens=2048, scheduling_policy="priority")
FCFS = ChunkedPrefill(max_num_batched_tokens=2048)


def test_waiting_requests_are_admitted_lowest_priority_value_first():
    queue = [waiting(0, 1500, priority=1), waiting(1, 1500, priority=0), waiting(2, 1500, priority=0, arrival=0.5)]
    # (priority, arrival, id): 2 (0, 0.5) before 1 (0, 1.0); the budget fits one and a chunk
    assert PRIORITY.schedule(view(queue)) == Batch((Scheduled(2, 1500), Scheduled(1, 548)))
    assert FCFS.schedule(view(queue)) == Batch((Scheduled(0, 1500), Scheduled(1, 548)))  # queue order


def test_priority_preempts_the_lowest_priority_even_if_already_scheduled_this_step():
    running = [decoding(0, 96, 1, priority=1), decoding(1, 96, 1, priority=0)]  # each needs a new block
    # request 0 was scheduled first; request 1 outranks it, so 0 is preempted and its block handed over
    assert PRIORITY.schedule(view([waiting(2, 10)], running, free=1)) == Batch((Scheduled(1, 1),), preempt=(0,))
    # FCFS preempts the most recently admitted instead (here the request that needs the block)
    assert FCFS.schedule(view([waiting(2, 10)], running, free=1)) == Batch((Scheduled(0, 1),), preempt=(1,))


def test_priority_ties_preempt_the_latest_arrival():
    running = [decoding(0, 96, 1, arrival=2.0), decoding(1, 96, 1, arrival=1.0)]
    assert PRIORITY.schedule(view([], running, free=1)) == Batch((Scheduled(1, 1),), preempt=(0,))


def test_head_of_line_blocking_holds_in_priority_order():
    queue = [waiting(0, 100, priority=1), waiting(1, 1000, priority=0)]  # request 1 needs 63 blocks
    assert PRIORITY.schedule(view(queue, free=20)) == Batch()


def test_scheduling_policy_knob_is_checked_by_the_loader():
    base = {"engine": {"policy": "chunked_prefill", "scheduling_policy": "priority"},
            "workload": {"num_requests": 4, "arrival": {"process": "poisson", "rate_per_s": 1},
                         "prompt_tokens": {"dist": "fixed", "value": 10},
                         "output_tokens": {"dist": "fixed", "value": 5}}}
    assert resolve_point(base).policy.scheduling_policy == "priority"
    base["engine"]["scheduling_policy"] = "lifo"
    with pytest.raises(ConfigError, match="scheduling_policy"):
        resolve_point(base)


def workload(priority):
    spec = {"num_requests": 2000, "arrival": {"process": "poisson", "rate_per_s": 5},
            "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "uniform", "min": 1, "max": 9}}
    if priority is not None:
        spec["priority"] = priority
    return parse_workload(spec)


def test_priority_classes_are_drawn_from_their_own_stream():
    plain = generate(workload(None), 3, 4096).specs
    mixed = generate(workload({"classes": [0, 1], "weights": [0.2, 0.8]}), 3, 4096).specs
    assert {s.priority for s in plain} == {0}
    assert [(s.arrival_s, s.num_output_tokens) for s in plain] == [(s.arrival_s, s.num_output_tokens) for s in mixed]
    assert np.mean([s.priority == 0 for s in mixed]) == pytest.approx(0.2, abs=0.03)


@pytest.mark.parametrize("bad, key", [({"classes": []}, "classes"), ({"classes": [0, 0]}, "classes"),
                                      ({"classes": [0, 1], "weights": [1]}, "weights"),
                                      ({"classes": [0], "share": [1]}, "share")])
def test_bad_priority_mixes_name_the_key(bad, key):
    with pytest.raises(WorkloadError, match=f"workload.priority.{key}"):
        workload(bad)


def test_per_class_metrics_only_with_several_classes():
    df = pd.DataFrame({"priority": [0, 0, 1], "status": ["finished"] * 3, "num_preemptions": [0, 0, 2],
                       "ttft_s": [0.1, 0.3, 2.0], "tpot_s": [0.01, 0.01, 0.02], "e2e_s": [1.0, 1.0, 3.0],
                       "queue_s": [0.0, 0.1, 1.5]})
    stats = per_priority_stats(df)
    assert stats["num_requests_prio0"] == 2 and stats["num_preemptions_prio1"] == 2
    assert stats["ttft_p50_ms_prio0"] == pytest.approx(200.0) and stats["ttft_p99_ms_prio1"] == pytest.approx(2000.0)
    assert per_priority_stats(df[df["priority"] == 0]) == {}

"""The fast cluster's next replica event from a heap (simcore.fast.cluster.ReplicaEvents) is the one the scan
of every replica picks: the earliest (time, seq) among the replicas that are not idle, the lower index on a
tie, after any sequence of events, wake-ups and replicas going idle, re-read only where they changed."""
from __future__ import annotations

import random
from types import SimpleNamespace

from simcore.fast.cluster import ReplicaEvents
from simcore.fast.engine import COMPLETE, IDLE, RESUME


def scan(replicas):
    best = None
    for r in replicas:
        if r.state is not IDLE and (best is None or (r.due_s, r.due_seq) < (best.due_s, best.due_seq)):
            best = r
    return best


def test_the_heap_picks_what_the_scan_picks():
    rng = random.Random(7)
    replicas = [SimpleNamespace(replica_id=i, state=RESUME, due_s=0.0, due_seq=i - 9) for i in range(8)]
    due = ReplicaEvents(replicas)
    seq, now = 0, 0.0
    for _ in range(3000):
        first = due.first()
        assert first is scan(replicas)
        touched = []
        if first is not None and rng.random() < 0.7:   # its event: the next step, or it goes idle
            due.taken(first)
            now = first.due_s
            if rng.random() < 0.2:
                first.state = IDLE
            else:   # a step of a few equal lengths: equal times, told apart by seq
                first.state, first.due_s, first.due_seq = COMPLETE, now + rng.choice((0.5, 1.0)), seq
                seq += 1
            touched.append(first)
        other = rng.choice(replicas)   # an arrival routed to a replica: an idle one wakes now
        if other.state is IDLE:
            other.state, other.due_s, other.due_seq = RESUME, now, seq
            seq += 1
        touched.append(other)
        due.update(touched)
    assert scan(replicas) is due.first()

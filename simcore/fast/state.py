"""The fast engine's own state: what its pending event is (an `EngineState`), and the step it has in flight
(an `InFlightStep`)."""
from __future__ import annotations

from enum import Enum


class EngineState(Enum):
    """What the engine's pending event does when it is processed. The SimPy engine is one process; these
    are the points where that process waits (simcore/engine.py `Engine._loop`), so that the fast engine
    processes its events in the same order."""
    IDLE = "idle"            # nothing pending: waits for a wake-up (an arrival, a KV transfer ending)
    RESUME = "resume"        # the engine decides again at this event
    TIMED = "timed"          # a timed wait (Batch.wake_at_s): its timeout, unless a wake-up comes first
    WOKEN = "woken"          # a timed wait's wake-up; like the timeout, it ends the wait one event later
    SWAP_WAIT = "swap_wait"  # sleeping through a swap-out, then waiting for a transfer to end
    COMPLETE = "complete"    # the step in flight ends


class InFlightStep:
    """The step the engine has in flight: what it computes, as what it was priced. One engine has one step
    in flight at a time, so it keeps one record and overwrites its fields for each step it starts (cheaper
    than building a record per step, and steps are the engine's hottest path)."""
    __slots__ = ("explicit", "num_lazy", "num_preempted", "padded_shape", "start_s", "duration_s")

    def __init__(self):
        self.explicit: list = []         # (request, new tokens, reserved tokens) of each explicit request
        self.num_lazy = 0                # lazy decoders taking one token each (first in the batch)
        self.num_preempted = 0
        self.padded_shape: tuple | None = None   # a padded (static) batch's rows, else None
        self.start_s = 0.0
        self.duration_s = 0.0

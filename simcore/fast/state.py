"""The fast engine's own state: what its pending event is (an `EngineState`), and the step it has in flight
(an `InFlightStep`)."""
from __future__ import annotations

from enum import Enum
from functools import partial
from typing import NamedTuple


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


class InFlightStep(NamedTuple):
    """The step the engine has in flight: what it computes, as what it was priced."""
    explicit: list          # (request, new tokens, reserved tokens) of each explicit request, in batch order
    num_lazy: int           # lazy decoders that take one token each (they come first in the batch)
    num_preempted: int
    padded_shape: tuple | None   # a padded (static) batch's rows, else None
    start_s: float
    duration_s: float


# An InFlightStep from a 6-tuple, built by tuple.__new__ (C) rather than by the class's own constructor (a
# Python function): the engine builds one for every step it puts in flight.
in_flight_step = partial(tuple.__new__, InFlightStep)

"""The error every engine raises when a simulated engine reaches a state a real one cannot, and its most
common message, written once."""
from __future__ import annotations


class SimulationError(RuntimeError):
    """The simulated engine reached a state a real one cannot (a policy bug): fail loudly."""


def scheduled_nothing(policy_name: str, now_s: float, num_waiting: int, num_running: int | None,
                      num_free_blocks: int, num_blocks: int) -> SimulationError:
    """A policy answered an empty step with no reason to wait (nothing in flight, no wake-up time): the
    engine would stall forever. `num_running` None leaves the running count out (there is none to report)."""
    running = "" if num_running is None else f"{num_running} running, "
    return SimulationError(f"{policy_name} scheduled nothing at t={now_s:.6f}s with {num_waiting} waiting, "
                           f"{running}{num_free_blocks}/{num_blocks} blocks free")

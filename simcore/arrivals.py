"""Traffic sources as SimPy processes: open-loop replay of arrival times, and closed-loop users."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

import simpy

from simcore.request import Request, RequestSpec


def open_loop(env: simpy.Environment, specs: Iterable[RequestSpec], submit: Callable[[RequestSpec], None]):
    """Submit each spec at its `arrival_s` (specs sorted by arrival)."""
    for spec in specs:
        if spec.arrival_s > env.now:
            yield env.timeout(spec.arrival_s - env.now)
        submit(spec)


class ClosedLoopUsers:
    """`concurrency` users; each sends its next request `think_time_s` after its previous one finishes
    (or is rejected). Request lengths are taken in order from `specs`; arrival times are set when sent."""

    def __init__(self, env: simpy.Environment, specs: Iterable[RequestSpec], concurrency: int,
                 submit: Callable[[RequestSpec], None], think_time_s: float = 0.0):
        self.env, self.submit, self.think_time_s = env, submit, think_time_s
        specs = list(specs)
        self._pending = iter(specs)
        self.concurrency = concurrency
        self._num_specs = len(specs)

    def start(self) -> None:
        for user in range(min(self.concurrency, self._num_specs)):  # users beyond the requests never send
            self._send(user)

    def on_done(self, req: Request) -> None:
        user = req.spec.user_id
        if self.think_time_s > 0:
            self.env.process(self._after_think(user))
        else:
            self._send(user)

    def _after_think(self, user: int):
        yield self.env.timeout(self.think_time_s)
        self._send(user)

    def _send(self, user: int) -> None:
        spec = next(self._pending, None)
        if spec is not None:
            self.submit(replace(spec, arrival_s=self.env.now, user_id=user))

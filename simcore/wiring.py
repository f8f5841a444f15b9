"""Wiring and running one engine replica on the SimPy engine: the one place that connects arrivals (open
loop or closed-loop users) to an engine and runs the clock; used by experiments.simulate,
fidelity.validate, fidelity.vllm_scheduler and the tests. (The fast engines, simcore/fast/, have
their own event loop and traffic, simcore/fast/traffic.py.)"""
from __future__ import annotations

from typing import Callable

import simpy

from simcore.arrivals import ClosedLoopUsers, open_loop
from simcore.engine import Engine
from simcore.limits import EngineLimits
from simcore.log import EngineLog


def start_arrivals(env: simpy.Environment, specs, submit: Callable, connect: Callable,
                   closed: tuple[int, float] | None = None) -> ClosedLoopUsers | None:
    """Open-loop arrivals of `specs` (sorted by arrival) into `submit`, or `closed = (concurrency,
    think_time_s)` users who send the next spec when one of theirs ends. `connect(on_done)` hands the users'
    callback (None in open loop) to whatever ends requests, before the first one is sent (a rejection ends
    a request at once)."""
    if closed is None:
        connect(None)
        env.process(open_loop(env, specs, submit))
        return None
    users = ClosedLoopUsers(env, specs, closed[0], submit, closed[1])
    connect(users.on_done)
    users.start()
    return users


def on_done_of(engines) -> Callable:
    """`connect` for plain engines: each calls `on_done` when a request finishes or is rejected."""
    def connect(on_done):
        for engine in engines:
            engine.on_done = on_done
    return connect


def run_replica(policy, cost_model, limits: EngineLimits, specs, *, closed: tuple[int, float] | None = None,
                env: simpy.Environment | None = None, log: EngineLog | None = None, executor=None,
                on_step=None, before_run: Callable[[Engine], None] | None = None) -> Engine:
    """Run `specs` through one SimPy engine replica to the end; the engine (its `log`, its records).
    `before_run(engine)` is called once everything is wired, before the clock starts (a real clock's start;
    fidelity.vllm_scheduler's first submissions, whose later ones come from `on_step`)."""
    env = env if env is not None else simpy.Environment()
    engine = Engine(env, policy, cost_model, limits, log if log is not None else EngineLog(), executor=executor,
                    on_step=on_step)
    start_arrivals(env, specs, engine.submit, on_done_of([engine]), closed)
    if before_run is not None:
        before_run(engine)
    env.run()
    return engine

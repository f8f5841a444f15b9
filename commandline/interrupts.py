"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt raised in the main thread at its next bytecode. When that
bytecode belongs to a finalizer or a weak-reference callback (importlib's module-lock clean-up during a
lazy import, a generator being closed, a file object's `__del__`), the exception cannot propagate: Python
prints "Exception ignored in ..." and carries on, and a sweep interrupted at that moment runs to its end and
exits 0. `remember_interrupts()` makes the handler note the signal before raising, and the long loops call
`raise_if_interrupted()` between units of work, so a Ctrl-C swallowed that way is raised again there.
"""
from __future__ import annotations

import contextlib
import signal
import threading

_interrupted = False


def _on_sigint(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def remember_interrupts():
    """Within the block, every SIGINT is remembered as well as raised (main thread only; elsewhere, or where
    a program set its own SIGINT handler, nothing changes)."""
    global _interrupted
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if previous is not signal.default_int_handler:
        yield
        return
    _interrupted = False
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _interrupted = False   # handled by now: a later run_sweep in the same process starts clean


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C arrived (and was possibly swallowed) since the block began."""
    if _interrupted:
        raise KeyboardInterrupt

"""Where a sweep's simulations run: inline (one job), a local process pool (the default), or a Dask
distributed cluster given its scheduler address. All three hand back `concurrent.futures.Future`s, so the
sweep and search loops are the same whichever runs them.

Dask is an optional extra (`pip install batchsim[dask]`); it is imported only when asked for.
"""
from __future__ import annotations

import contextlib
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Iterator

from experiments.config import ConfigError


class InlineExecutor:
    """Runs each task at submit time in this process (jobs=1: no pickling, easy to debug)."""

    def submit(self, fn, *args, **kwargs) -> Future:
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to the caller through the future, as a pool would
            f.set_exception(e)
        return f


@contextlib.contextmanager
def open_executor(jobs: int | None = None, dask_address: str | None = None,
                  num_tasks: int | None = None) -> Iterator[tuple[object, int]]:
    """Yield `(executor, num_slots)`: `num_slots` is how many tasks run at once (for the progress bar)."""
    if dask_address:
        try:
            from distributed import Client
        except ImportError:
            raise ConfigError("--dask: the Dask extra is not installed (pip install 'batchsim[dask]')") from None
        try:
            client = Client(dask_address, timeout="10s")
        except (OSError, TimeoutError) as e:
            raise ConfigError(f"--dask: cannot reach the scheduler at {dask_address} ({e})") from None
        try:
            slots = max(1, sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values()))
            yield client.get_executor(pure=False), slots
        finally:
            client.close()
        return
    jobs = max(1, jobs or os.cpu_count() or 1)
    if num_tasks is not None:
        jobs = max(1, min(jobs, num_tasks))
    if jobs == 1:
        yield InlineExecutor(), 1
        return
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_ignore_sigint)
    try:
        yield pool, jobs
    except BaseException:  # Ctrl-C or an error: stop now, without waiting for the running tasks
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C (sent to the whole terminal process group) to the parent, which stops them; a
    worker that took it would only report the interrupt as its task's result and carry on with the next."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued tasks and kill the workers running the others, within a fraction of a second
    (`shutdown(wait=True)` would let every running and queued task finish first).

    Uses the pool's private parts (CPython 3.9-3.13 keep them stable): its worker processes, the parent's
    end of the result pipe and the manager thread. A worker killed while sending a result leaves half a
    message in that pipe, and the manager thread would wait for the rest forever (and the interpreter for
    it, at exit). Once every worker is dead, closing the parent's writer turns that wait into end-of-file,
    which the manager treats as a broken pool and exits."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)  # shutdown() drops these three
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        if w.is_alive():
            w.kill()
    for w in workers:
        w.join(timeout=1.0)
    if writer is not None and not any(w.is_alive() for w in workers):
        writer.close()
    if manager is not None:
        manager.join(timeout=1.0)

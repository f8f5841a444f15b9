"""The process settings a CPU timing run needs before torch allocates anything.

On CPU, torch frees and re-allocates large tensors every step; glibc's default thresholds hand that memory
back to the kernel and fault it in again, thousands of page faults per step, which shows up as time that
belongs to neither the model nor the engine. Raising the mmap and trim thresholds keeps it in the process.
The settings only take effect at process start, hence the re-execution. Used by calibration.capture and by
fidelity's runs on our own torch backend.
"""
from __future__ import annotations

import os
import sys

GLIBC_TUNABLES = ("glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:"
                  "glibc.malloc.top_pad=268435456")


def reexec_with_tunables(module: str, argv: list[str]) -> None:
    """Re-execute `python -m module argv` once with GLIBC_TUNABLES set. Returns when already set; does not
    return otherwise."""
    if os.environ.get("GLIBC_TUNABLES") != GLIBC_TUNABLES:
        env = dict(os.environ, GLIBC_TUNABLES=GLIBC_TUNABLES)
        os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)

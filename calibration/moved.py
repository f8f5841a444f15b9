"""Old command names that moved, kept answering for one release: say where the command went, then run it there.

The real-engine commands (vllm_run, fit_engine, validate, compare of real runs) moved to the `fidelity`
package, and kernel capture is `calibration.capture`. The old `python -m` names forward to the new ones in a
fresh interpreter, so calibration never imports fidelity.
"""
from __future__ import annotations

import os
import subprocess
import sys

RELEASE = "0.2"   # the release after which the old names stop answering


def notice(old: str, new: str) -> None:
    print(f"note: `python -m {old}` is now `python -m {new}`; the old name forwards there until release "
          f"{RELEASE}", file=sys.stderr)


def forward(old: str, new: str, argv: list[str]) -> None:
    """Replace this process with `python -m new argv` (does not return)."""
    notice(old, new)
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", new, *argv])


def run(new: str, argv: list[str]) -> int:
    """Run `python -m new argv` as a child and return its exit status."""
    return subprocess.call([sys.executable, "-m", new, *argv])

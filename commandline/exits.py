"""How a command ends: a user's mistake is one line and exit 2 (never a traceback), the disk's refusal
(full, unwritable, removed under us) one line naming the file, and Ctrl-C exit 130 with a line saying
what was kept. `run_main` is every command's `if __name__ == "__main__":`."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

from commandline.interrupts import remember_interrupts
from commandline.outputs import OutputError

BAD_INPUT_RC = 2
INTERRUPTED_RC = 130   # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def refuse(message) -> int:
    """Print `error: message` as one line on stderr; return the bad-input exit status."""
    text = " ".join(str(message).split()) or type(message).__name__
    print(f"error: {text}", file=sys.stderr, flush=True)
    return BAD_INPUT_RC


def guarded(main: Callable[[list[str] | None], int], argv: list[str] | None = None,
            user_errors: tuple[type[BaseException], ...] = (), kept: str = "nothing was lost") -> int:
    """`main(argv)`'s exit status, with `user_errors` (and OutputError) as one line and exit 2, an OSError
    as one line naming its file, and Ctrl-C as exit 130 saying `kept` (what finished and stays on disk)."""
    try:
        with remember_interrupts():   # the sweep and search loops raise a swallowed Ctrl-C again
            return main(argv)
    except (OutputError, *user_errors) as e:
        return refuse(e)
    except BrokenPipeError:   # the reader stopped early (`| head`): it got what it wanted, nothing failed
        return 0
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        return refuse(f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        print(f"\ninterrupted: {kept}", file=sys.stderr, flush=True)
        return INTERRUPTED_RC


def run_main(main: Callable[[list[str] | None], int], user_errors: tuple[type[BaseException], ...] = (),
             kept: str = "nothing was lost") -> None:
    """Run `main` as the process's command and exit with its status, skipping the interpreter's teardown
    (freeing every module torch, pandas and vLLM imported takes seconds after a Ctrl-C under load): every
    file main wrote is closed by then, so Ctrl-C ends the process within a second."""
    rc = guarded(main, None, user_errors, kept)
    with contextlib.suppress(BrokenPipeError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(rc if isinstance(rc, int) else 0)

"""Progress of a long command, shown the way its output is read: `--progress auto|bar|plain|none`.

A bar redraws one line with carriage returns: right on a terminal, but a log file or CI console keeps every
redraw (a search wrote about 130 of them on one line). `auto` therefore draws the bar on a terminal and
otherwise prints plain lines, one when another tenth of the work is done or `PLAIN_EVERY_S` has passed,
whichever comes first, and one at the end. `none` prints nothing (what `--quiet` asks for).
"""
from __future__ import annotations

import sys
import time

PROGRESS_MODES = ("auto", "bar", "plain", "none")
PLAIN_EVERY_S = 10.0       # a line at least this often while work finishes...
PLAIN_EVERY_FRACTION = 0.1  # ...and whenever another tenth is done


def resolve_mode(mode: str | bool | None, stream=None) -> str:
    """'bar', 'plain' or 'none' for `mode` (True: auto, False or None: none); auto looks at `stream`."""
    if mode is True:
        mode = "auto"
    if mode is False or mode is None:
        return "none"
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress: expected one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
    if mode == "auto":
        stream = sys.stderr if stream is None else stream
        return "bar" if getattr(stream, "isatty", lambda: False)() else "plain"
    return mode


class PlainProgress:
    """The part of tqdm's interface the commands use (update, set_postfix_str, close), as plain lines."""

    def __init__(self, total: int, desc: str, unit: str, initial: int = 0, stream=None,
                 clock=time.monotonic):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.postfix = ""
        self.start = self.last_time = clock()
        self.last_n = initial
        self.closed = False

    def line(self) -> str:
        pct = f" ({self.n / self.total:.0%})" if self.total else ""
        elapsed = self.clock() - self.start
        return (f"{self.desc}: {self.n} of {self.total} {self.unit} done{pct}, {elapsed:,.0f} s"
                + (f", {self.postfix}" if self.postfix else ""))

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.last_time, self.last_n = self.clock(), self.n

    def _maybe_print(self) -> None:
        step = max(1, int(self.total * PLAIN_EVERY_FRACTION)) if self.total else 1
        if self.n - self.last_n >= step or self.clock() - self.last_time >= PLAIN_EVERY_S:
            self._print()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._maybe_print()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text
        self._maybe_print()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._print()


def progress_bar(mode: str | bool | None, total: int, desc: str, unit: str, initial: int = 0, stream=None):
    """A tqdm bar, a PlainProgress, or None (nothing to show), per `resolve_mode(mode, stream)`."""
    kind = resolve_mode(mode, stream)
    if kind == "none":
        return None
    if kind == "plain":
        return PlainProgress(total, desc, unit, initial, stream)
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, dynamic_ncols=True, file=stream)

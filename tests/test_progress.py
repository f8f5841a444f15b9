"""--progress: a bar on a terminal, plain periodic lines in a log, nothing with none (or --quiet)."""
from __future__ import annotations

import io

import pytest

from commandline.progress import PlainProgress, progress_bar, resolve_mode


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_auto_is_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    assert resolve_mode("auto", Tty()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "plain"
    assert resolve_mode(True, io.StringIO()) == "plain" and resolve_mode(False) == "none"
    assert progress_bar("none", 10, "sweep", "point") is None
    with pytest.raises(ValueError, match="progress"):
        resolve_mode("fancy")


def test_plain_lines_come_every_tenth_and_at_the_end_without_carriage_returns():
    out = io.StringIO()
    now = [0.0]
    bar = PlainProgress(100, "search", "searches", stream=out, clock=lambda: now[0])
    for _ in range(100):
        bar.update(1)
        bar.set_postfix_str("3 running")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 11   # one a tenth, and the closing line
    assert lines[0].startswith("search: 10 of 100 searches done (10%)")
    assert lines[-1].startswith("search: 100 of 100") and "(100%)" in lines[-1] and "3 running" in lines[-1]


def test_plain_lines_also_come_with_time_when_work_is_slow():
    out = io.StringIO()
    now = [0.0]
    bar = PlainProgress(1000, "sweep", "points", stream=out, clock=lambda: now[0])
    bar.update(1)
    assert out.getvalue() == ""          # 0.1% done, no time passed: nothing yet
    now[0] = 11.0
    bar.update(1)
    assert out.getvalue().startswith("sweep: 2 of 1000 points done (0%), 11 s")

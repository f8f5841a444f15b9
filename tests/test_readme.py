"""The README is a front door: the two set-up commands first and exact, short, and every file it points to
exists (pages other packages add, docs/hardware.md and docs/fidelity/gpu/, are allowed to be missing)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND_1 = ("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m experiments.run "
             "examples/quickstart.yaml")
COMMAND_2 = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
ADDED_ELSEWHERE = {"docs/hardware.md", "docs/fidelity/gpu/"}


def test_the_two_commands_come_first_and_exactly():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in first_block.splitlines() if line and not line.startswith("#")]
    assert commands == [COMMAND_1, COMMAND_2]


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) < 300


def test_every_file_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`((?:docs|examples)/[\w./-]+)`", text))
    named |= set(re.findall(r"\]\((docs/[\w./-]+)\)", text))
    missing = sorted(p for p in named - ADDED_ELSEWHERE if not (ROOT / p).exists())
    assert not missing, missing

"""The argument parser every command uses: a bad argument is one line naming it (the usage is a --help
away) and exit 2, the same as every other bad input."""
from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse, refusing in one line: `error: argument --tp: expected ... (see --help)`, exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")

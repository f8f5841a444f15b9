"""Argument types for the parser (`type=positive_int`): each refuses what the option cannot mean (a word, a
fraction, zero or a negative count, NaN, infinity) with argparse's one line, which names the option."""
from __future__ import annotations

import argparse
import math


def _int(text: str, minimum: int, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if n < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return n


def positive_int(text: str) -> int:
    """A count of at least 1 (requests, repeats, threads, GPUs)."""
    return _int(text, 1, "a whole number >= 1")


def non_negative_int(text: str) -> int:
    """A count that may be 0 (warm-up requests, a first seed)."""
    return _int(text, 0, "a whole number >= 0")


def _float(text: str, ok, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(x) or not ok(x):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return x


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a threshold in %, a start time)."""
    return _float(text, lambda x: x >= 0, "a finite number >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (an interval, a time scale)."""
    return _float(text, lambda x: x > 0, "a finite number > 0")


def positive_int_list(text: str) -> list[int]:
    """Comma-separated counts of at least 1, sorted, each once (prompt lengths, burst sizes)."""
    values = sorted({_int(x.strip(), 1, "comma-separated whole numbers >= 1") for x in text.split(",") if x.strip()})
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 1, got {text!r}")
    return values

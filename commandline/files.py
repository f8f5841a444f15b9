"""Results that are either whole or absent, and the keys that say whether a saved result still applies.

A command that can be interrupted (Ctrl-C, a killed job) and resumed must never leave a half-written file
that a later run would read as finished: every file that marks work as done is written beside its final
name and renamed over it (rename is atomic on one filesystem). The temporary name carries the process id,
so two processes writing the same file (parallel workers, two runs sharing a cache) never share a
temporary file.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json_atomic(path: Path, data, indent: int | None = 1) -> None:
    """`data` as JSON (anything json cannot encode written with str()), atomically."""
    write_text_atomic(path, json.dumps(data, default=str, indent=indent))


def write_csv_atomic(path: Path, frame) -> None:
    """A pandas DataFrame as CSV without its index, atomically."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(path)


def content_hash(data, length: int = 16) -> str:
    """A short stable hash of JSON-able `data` (key order ignored; other objects by str()): the key that
    says whether a saved result was made from the same inputs."""
    blob = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]

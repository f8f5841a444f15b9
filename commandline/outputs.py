"""Where a command writes, checked before any long work starts: a folder that is a folder (not a file, not a
symbolic-link loop or a link to nothing) and writable, or a file whose folder is. The error names the
argument and the path, in one line."""
from __future__ import annotations

import errno
import os
from pathlib import Path


class OutputError(ValueError):
    """An output path a command cannot write; one line naming the argument."""


def _problem(path: Path) -> str | None:
    """Why `path` cannot be, or become, a folder we write into; None when it can."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        if e.errno == errno.ENOTDIR:
            return "lies under a file, not a folder"
        if e.errno == errno.EACCES:
            return "cannot be reached (permission denied)"
        if e.errno != errno.ENOENT:
            return f"cannot be read ({e.strerror})"
        if os.path.islink(path):
            return f"is a symbolic link to nothing ({os.readlink(path)})"
        parent = path.parent if path.parent != path else None
        return _problem(parent) if parent is not None else None
    import stat
    if not stat.S_ISDIR(st.st_mode):
        return "exists and is not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def out_dir(path: str | Path, arg: str = "--out", create: bool = False) -> Path:
    """`path` as a folder to write into (or to create: its nearest existing folder writable), created with
    its parents when `create`; OutputError naming `arg` if it is a file, under a file, a link loop or a
    dangling link, or not writable. Without `create` nothing is written: a command checks first and creates
    the folder when it writes."""
    path = Path(path).expanduser()
    why = _problem(path)
    if why is not None:
        raise OutputError(f"{arg} {path}: {why}")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"{arg} {path}: cannot create the folder ({e.strerror or e})") from None
    return path


def out_file(path: str | Path, arg: str = "--out") -> Path:
    """`path` as a file to write: not a folder, an existing file writable, its folder as `out_dir`. Nothing
    is created."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputError(f"{arg} {path}: is a folder; give the file to write")
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(f"{arg} {path}: is a loop of symbolic links") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{arg} {path}: exists and is not writable")
    out_dir(path.parent, arg=f"{arg} {path}: its folder")
    return path

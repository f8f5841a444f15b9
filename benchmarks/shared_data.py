"""Where the benchmarks that replay public measurements find them: the read-only `shared/` folder beside
the checkout (real-runs/, traces/, kernel-timings/). A user's checkout has none, and those benchmarks then
say so and exit 0; a folder named with `--shared` must hold `real-runs/`, or the command refuses it in one
line (exit 2), since a mistyped path would otherwise read as "no data" and skip silently."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (a user's layout), else beside the main checkout of a git worktree
SHARED_CANDIDATES = (ROOT.parent / "shared", ROOT.parents[1] / "shared")


def shared_folder(parser, given: str | None) -> Path | None:
    """The shared folder: `given` (the --shared argument; `parser.error`, exit 2, where it has no
    real-runs/), else the first of SHARED_CANDIDATES that has real-runs/, else None."""
    if given:
        if not (Path(given) / "real-runs").is_dir():
            parser.error(f"argument --shared: {given} has no real-runs folder")
        return Path(given)
    return next((p for p in SHARED_CANDIDATES if (p / "real-runs").is_dir()), None)

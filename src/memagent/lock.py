"""One run per output: a second run on the same output folder (or file) refuses instead of interleaving writes.

The lock is an OS file lock (`filelock`): `DIR/.memagent.lock` for a folder (eval, train, demo), `.NAME.lock` beside
an output file (`ask --output`). The OS drops it when the process dies, so a run killed with kill -9 never leaves a
stale lock behind.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from memagent.errors import MemAgentError

LOCK_NAME = ".memagent.lock"


class RunLockedError(MemAgentError):
    """Another run holds the output folder or file."""


@contextmanager
def _hold(lock_path: Path, what: str, target: Path, kind: str) -> Iterator[Path]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunLockedError(f"another {what} is writing to {target} (it holds {lock_path}); wait for it to finish "
                             f"or choose another output {kind}") from None
    try:
        yield lock_path
    finally:
        lock.release()


def run_lock(folder: str | Path, what: str = "run"):
    """Hold `folder`'s lock for the body (the folder is created); refuse at once if another process holds it."""
    folder = Path(folder)
    return _hold(folder / LOCK_NAME, what, folder, "folder")


def file_lock(path: str | Path, what: str = "run"):
    """Hold the lock of one output file (`.NAME.lock` beside it) for the body; refuse at once if another process
    holds it (two `ask --output X` runs would interleave their results)."""
    path = Path(path)
    return _hold(path.with_name(f".{path.name}.lock"), what, path, "file")

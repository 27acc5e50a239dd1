"""One run per output folder: a second run on the same folder refuses instead of interleaving writes.

The lock is an OS file lock (`filelock`) on `DIR/.memagent.lock`; the OS drops it when the process dies,
so a run killed with kill -9 never leaves a stale lock behind.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from memagent.errors import MemAgentError

LOCK_NAME = ".memagent.lock"


class RunLockedError(MemAgentError):
    """Another run holds the output folder."""


@contextmanager
def run_lock(folder: str | Path, what: str = "run") -> Iterator[Path]:
    """Hold `folder`'s lock for the body (the folder is created); refuse at once if another process holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunLockedError(f"another {what} is writing to {folder} (it holds {path}); wait for it to finish "
                             f"or choose another output folder") from None
    try:
        yield path
    finally:
        lock.release()


@contextmanager
def file_lock(path: str | Path, what: str = "run") -> Iterator[Path]:
    """Hold the lock of one output file (`.NAME.lock` beside it) for the body; refuse at once if another process
    holds it (two `ask --output X` runs would interleave their results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(f".{path.name}.lock")
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunLockedError(f"another {what} is writing to {path} (it holds {lock_path}); wait for it to finish "
                             f"or choose another output file") from None
    try:
        yield lock_path
    finally:
        lock.release()

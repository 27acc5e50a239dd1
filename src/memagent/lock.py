"""One run per output: a second run on the same output folder (or file) refuses instead of interleaving writes.

The lock is an OS file lock (`filelock`): `DIR/.memagent.lock` for a folder (eval, train, demo), `.NAME.lock` beside
an output file (`ask --output`). The OS drops it when the process dies, so a run killed with kill -9 never leaves a
stale lock behind.

A lock taken with `run_lock(..., reenter=True)` may be taken again by the same thread without waiting (the train
CLI takes the run's lock before writing profile.yaml, and the trainer takes it again); any other lock held
refuses a second taker, in this process too, and an output that is a device or a FIFO (`/dev/null`) takes no lock: nothing could be
written beside it (no `/dev/.null.lock`), and writes to a sink cannot interleave into a file.
"""
from __future__ import annotations

import os
import shutil
import stat
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from memagent.errors import MemAgentError
from memagent.io import is_sink

LOCK_NAME = ".memagent.lock"
_LOCAL = threading.local()  # .held: lock files this thread took with reenter=True; taking one again is a no-op


class RunLockedError(MemAgentError):
    """Another run holds the output folder or file."""


@contextmanager
def _hold(lock_path: Path, what: str, target: Path, kind: str, reenter: bool = False) -> Iterator[Path]:
    key = os.path.realpath(lock_path)
    held = _LOCAL.__dict__.setdefault("held", set())
    if key in held:  # this process holds it already (an outer block of the same run)
        yield lock_path
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunLockedError(f"another {what} is writing to {target} (it holds {lock_path}); wait for it to finish "
                             f"or choose another output {kind}") from None
    if reenter:
        held.add(key)
    try:
        yield lock_path
    finally:
        held.discard(key)
        lock.release()


def run_lock(folder: str | Path, what: str = "run", reenter: bool = False):
    """Hold `folder`'s lock for the body (the folder is created); refuse at once if another holder has it.
    reenter: the same thread may take it again inside the body (e.g. the trainer inside the train command)."""
    folder = Path(folder)
    return _hold(folder / LOCK_NAME, what, folder, "folder", reenter)


def file_lock(path: str | Path, what: str = "run"):
    """Hold the lock of one output file (`.NAME.lock` beside it) for the body; refuse at once if another process
    holds it (two `ask --output X` runs would interleave their results)."""
    path = Path(path)
    if is_sink(path):
        return nullcontext(None)
    return _hold(lock_path_for(path), what, path, "file")


def lock_path_for(path: str | Path) -> Path:
    """The lock file of one output file: `.NAME.lock` beside it (checked against the inputs as a side file)."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


# -- temporary folders of a live process ----------------------------------------------------------------------
OWNER_NAME = ".memagent-owner.lock"


class OwnerLock:
    """An exclusive OS lock (`flock`) on `FOLDER/.memagent-owner.lock`, held while the process that made a
    temporary folder is alive: the OS drops it when the process dies, even by kill -9, so a later run can tell
    a dead run's leftover folder (lock free) from a live one's (lock held; `sweep_dead`). The file is locked
    under another name first and then renamed into place, so no sweeper ever sees it unlocked. Without
    `fcntl` (Windows) there is no lock, and a folder is never taken as dead."""

    def __init__(self, folder: Path) -> None:
        self.fd: int | None = None
        self.path = folder / OWNER_NAME
        try:
            import fcntl  # lazy: fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        staging = folder / f"{OWNER_NAME}.{os.getpid()}"
        fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(staging, self.path)
        except OSError:
            os.close(fd)
            raise
        self.fd = fd

    def release(self, keep_folder: bool = False) -> None:
        """Drop the lock: the folder is removed, or (`keep_folder`) kept on purpose, and then its lock file is
        deleted first, so that no later sweep takes the folder as a dead run's."""
        fd, self.fd = self.fd, None
        if fd is not None:
            if keep_folder:
                self.path.unlink(missing_ok=True)
            os.close(fd)


def sweep_dead(parent: Path, prefix: str) -> list[Path]:
    """Remove the folders `parent/PREFIX*` left by processes that died (their `OwnerLock` file is there and
    no process holds it); the folders removed. Left alone: a folder whose owner lives, one with no lock file
    (made by an older memagent, or kept with keep=True), one owned by another user, a symlink."""
    try:
        import fcntl  # lazy: fcntl
    except ImportError:  # pragma: no cover - Windows
        return []
    removed = []
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    for folder in candidates:
        try:
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(folder / OWNER_NAME, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: its owner died
        except OSError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed

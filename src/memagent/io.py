"""Where files leave the program: output paths checked before any work, atomic writes, clear OS errors.

- `check_output_file` / `check_output_dir`: refuse an output that is one of the inputs (resolved paths
  and same-file), a directory where a file goes (or a file where a folder goes), a path under a
  file, or a folder that cannot be written; called before any model is loaded.
- `refuse_occupied`: a folder that already holds a model or a run is refused unless forced.
- `atomic_write` / `atomic_write_text`: write a temp file beside the target, then rename it over the
  target; the temp file is removed when the write fails, so a failed run leaves the old file intact.
- `os_error_message`: the one-line message of an OS error the user can fix (permission, missing
  folder, disk full, ...), or None for one that is a bug.
"""
from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterable, Iterator, Mapping

from memagent.errors import MemAgentError


class OutputError(MemAgentError, ValueError):
    """An output path would destroy an input or cannot be written; nothing was written."""


PathLike = str | os.PathLike

_ERRNO_HINTS = {
    errno.EACCES: "permission denied; choose a path you can write (or read), or fix its permissions",
    errno.EPERM: "operation not permitted; choose another path or fix its permissions",
    errno.EROFS: "the file system is read-only; choose a writable location",
    errno.ENOENT: "no such file or folder; check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; check the path",
    errno.EISDIR: "it is a folder where a file is expected; give a file path",
    errno.EEXIST: "it already exists; remove it or choose another path",
    errno.ENOTEMPTY: "the folder is not empty; choose another path",
    errno.ENOSPC: "no space left on the device; free some space or write elsewhere",
    errno.EFBIG: "the file is too large for this file system or its size limit; write elsewhere or raise the limit",
    errno.EDQUOT: "the disk quota is exceeded; free some space or write elsewhere",
    errno.ENAMETOOLONG: "the file name is too long; choose a shorter path",
    errno.ELOOP: "too many symbolic links in the path; check the path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) or run fewer at once",
}


_USER_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def os_error_message(e: OSError) -> str | None:
    """'PATH: what went wrong; what to do' for an OS error the user can fix; None for any other."""
    if e.errno is None and isinstance(e, _USER_OS_ERRORS) and str(e):
        return str(e)  # raised by our code with its own message, e.g. FileExistsError("... choose another --out")
    hint = _ERRNO_HINTS.get(e.errno) if e.errno is not None else None
    if hint is None:
        return None
    where = e.filename if e.filename is not None else None
    if where is not None and e.filename2 is not None:
        where = f"{where} -> {e.filename2}"
    return f"{where}: {hint}" if where is not None else hint


def same_path(a: PathLike, b: PathLike) -> bool:
    """True when `a` and `b` name the same file: equal resolved paths, or the same inode (hard links)."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.resolve() == pb.resolve():
            return True
        return pa.exists() and pb.exists() and os.path.samefile(pa, pb)
    except OSError:
        return False


def check_not_input(output: PathLike, inputs: Mapping[str, PathLike | None], flag: str) -> None:
    """Refuse `output` when it is one of `inputs` ({what: path}); nothing is written."""
    for what, path in inputs.items():
        if not isinstance(path, (str, os.PathLike)) or str(path) == "-":
            continue  # None, or a stream such as stdin
        if same_path(output, path):
            raise OutputError(f"{flag} {output} is the same path as {what} {path}: writing there would "
                              f"destroy the input; choose another output path")


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_creatable(path: Path, flag: str) -> None:
    """The nearest existing ancestor of `path` must be a writable folder (the rest is created)."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputError(f"{flag} {path}: {base} is a file, not a folder; choose a path in a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path}: cannot write in {base} (permission denied); choose a writable folder")


def check_output_file(path: PathLike, flag: str, inputs: Mapping[str, PathLike | None] | None = None) -> Path:
    """Check, before any work, that the file `path` can be written and is none of `inputs`."""
    p = Path(path)
    if not str(path).strip():
        raise OutputError(f"{flag} is empty; give a file path")
    check_not_input(p, inputs or {}, flag)
    if p.is_dir():
        raise OutputError(f"{flag} {p} is a folder; give a file path (e.g. {p / 'out.jsonl'})")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{flag} {p} is not writable (permission denied); choose another path")
    _check_creatable(p, flag)
    return p


def check_output_dir(path: PathLike, flag: str, inputs: Mapping[str, PathLike | None] | None = None) -> Path:
    """Check, before any work, that the folder `path` can be created or written and is none of `inputs`."""
    p = Path(path)
    if not str(path).strip():
        raise OutputError(f"{flag} is empty; give a folder path")
    check_not_input(p, inputs or {}, flag)
    if p.exists():
        if not p.is_dir():
            raise OutputError(f"{flag} {p} is a file, not a folder; give a folder path")
        if not os.access(p, os.W_OK | os.X_OK):
            raise OutputError(f"{flag} {p} is not writable (permission denied); choose another folder")
        return p
    _check_creatable(p / "x", flag)
    return p


_MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "tokenizer.json",
                "tokenizer_config.json")
_RUN_MARKERS = ("checkpoints", "metrics.jsonl", "results.jsonl", "results.json")


def folder_holds(path: PathLike) -> str | None:
    """What `path` holds that a new model or run would overwrite: 'a model', 'a run', or None."""
    p = Path(path)
    if not p.is_dir():
        return None
    if any((p / name).exists() for name in _MODEL_FILES) or any(p.glob("*.safetensors")):
        return "a model"
    if any((p / name).exists() for name in _RUN_MARKERS):
        return "a run"
    return None


def refuse_occupied(path: PathLike, flag: str, force: bool, force_hint: str = "--force") -> None:
    """Refuse to write a model or a run into a folder that holds one, unless `force`."""
    held = folder_holds(path)
    if held is not None and not force:
        raise OutputError(f"{flag} {path} already holds {held}; writing there would overwrite it. Choose another "
                          f"folder, or pass {force_hint} to overwrite")


@contextmanager
def atomic_write(path: PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside `path` for writing; on success it replaces `path`, on failure it is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        kw = {} if "b" in mode else {"encoding": encoding, "newline": "\n"}
        with os.fdopen(fd, mode, **kw) as fh:
            yield fh
        if target.exists():  # keep the old file's permissions, not mkstemp's 0600
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(target)  # a failed write() names no file: name the one being written
        raise


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_write(path) as fh:
        fh.write(text)
    return Path(path)


def current_umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_text(path: PathLike, what: str, error: type[MemAgentError]) -> str:
    """The UTF-8 text of `path`; a missing file, a folder or bytes that are not UTF-8 raise `error`."""
    p = Path(path)
    if not p.exists():
        raise error(f"{what} {p} does not exist; check the path")
    if p.is_dir():
        raise error(f"{what} {p} is a folder, not a file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {p} is not valid UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None


def existing_files(folder: PathLike | None) -> Iterable[Path]:
    """The files directly in `folder` (a local model directory), or none when it is not a folder."""
    if folder is None:
        return []
    p = Path(folder)
    try:
        return [f for f in p.iterdir() if f.is_file()] if p.is_dir() else []
    except OSError:
        return []

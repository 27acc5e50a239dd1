"""Where files leave the program: output paths checked before any work, atomic writes, clear OS errors.

- `check_output_file` / `check_output_dir`: refuse an output that is one of the inputs (resolved paths
  and same-file), a directory where a file goes (or a file where a folder goes), a path under a
  file, or a folder that cannot be written; called before any model is loaded.
- `refuse_occupied`: a folder that already holds a model or a run is refused unless forced.
- `atomic_write` / `atomic_write_text`: write a temp file beside the target, then rename it over the
  target; the temp file is removed when the write fails, so a failed run leaves the old file intact.
  A symlink is followed (its target is replaced, the link stays); a character device or a FIFO
  (`/dev/null`, a pipe) is written in place, never replaced by a regular file; a block device is refused.
- `output_device` / `is_sink`: what kind of special file an output path names (through symlinks), so a
  command writes a sink in place and skips its side files and locks (no `/dev/.null.lock`).
- `given_path`: an empty path option means nothing (not the working folder): one check for every path option.
- `os_error_message`: the one-line message of an OS error the user can fix (permission, missing
  folder, disk full, ...), or None for one that is a bug.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
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


def given_path(value: PathLike | None, flag: str, what: str = "path") -> Path | None:
    """`value` as a Path; an empty or blank value is refused (Path("") would mean the working folder)."""
    if value is None:
        return None
    if not str(value).strip():
        raise OutputError(f"{flag} is empty; give a {what} (an empty path would mean the current folder)")
    return Path(value)


def output_device(path: PathLike) -> str | None:
    """'a character device', 'a block device' or 'a FIFO' when `path` (through symlinks) is one; else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return None


def is_sink(path: PathLike | None) -> bool:
    """True when `path` is a character device or a FIFO: written in place, with no side files or locks."""
    return path is not None and output_device(path) in ("a character device", "a FIFO")


def check_device_output(path: PathLike, flag: str, devices: bool = True) -> bool:
    """Refuse a block device always, and a character device or FIFO unless `devices`; True for a sink
    that is to be written in place."""
    kind = output_device(path)
    if kind is None:
        return False
    if kind == "a block device" or not devices:
        why = "a disk is never written as a file" if kind == "a block device" else "this output has side files"
        raise OutputError(f"{flag} {path} is {kind}, not a file ({why}); give a regular file path")
    return True


def check_side_files(side: Mapping[str, PathLike], inputs: Mapping[str, PathLike | None]) -> None:
    """Refuse any side file a command writes ({what: path}, e.g. `--output (its X.profile.yaml)`) that is one
    of `inputs` or a folder; checked with the main output, before anything is written or trimmed."""
    for what, path in side.items():
        check_not_input(path, inputs, what)
        if Path(path).is_dir():
            raise OutputError(f"{what} {path} is a folder; move it away or choose another output path")
        check_device_output(path, what, devices=False)


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


def check_output_file(path: PathLike, flag: str, inputs: Mapping[str, PathLike | None] | None = None,
                      devices: bool = True) -> Path:
    """Check, before any work, that the file `path` can be written and is none of `inputs`. A character
    device or FIFO is accepted as a sink (written in place) when `devices`, else refused; a block device is
    always refused."""
    p = given_path(path, flag, "file path")
    check_not_input(p, inputs or {}, flag)
    if check_device_output(p, flag, devices):
        return p
    if p.is_dir():
        raise OutputError(f"{flag} {p} is a folder; give a file path (e.g. {p / 'out.jsonl'})")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{flag} {p} is not writable (permission denied); choose another path")
    _check_creatable(p, flag)
    return p


def check_output_dir(path: PathLike, flag: str, inputs: Mapping[str, PathLike | None] | None = None) -> Path:
    """Check, before any work, that the folder `path` can be created or written and is none of `inputs`."""
    p = given_path(path, flag, "folder path")
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


def refuse_files(folder: PathLike, names: Iterable[str], flag: str, force: bool, force_hint: str = "--force") -> None:
    """Refuse to write `names` into `folder` when any is there already (e.g. an unrelated config.json that
    `tiny-model DIR` would overwrite), unless `force`."""
    there = [n for n in names if (Path(folder) / n).exists()]
    if there and not force:
        raise OutputError(f"{flag} {folder} already holds {', '.join(there)}; writing there would overwrite "
                          f"{'it' if len(there) == 1 else 'them'}. Choose another folder, or pass {force_hint} to "
                          "overwrite")


@contextmanager
def atomic_write(path: PathLike, mode: str = "w", encoding: str | None = "utf-8", fsync: bool = False) -> Iterator[IO]:
    """Open a temp file beside `path` for writing; on success it replaces `path`, on failure it is removed.

    A symlink is followed: the temp file goes beside its target and replaces the target, so the link stays.
    A character device or FIFO is opened and written in place (replacing it would turn `/dev/null` into a
    regular file); a block device is refused. fsync: flush the data to disk before the rename (results that
    must survive a power cut)."""
    target = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    kw = {} if "b" in mode else {"encoding": encoding, "newline": "\n"}
    if check_device_output(target, str(path)):
        with _named_errors(target):
            with open(target, mode, **kw) as fh:
                yield fh
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with _named_errors(target):
            with os.fdopen(fd, mode, **kw) as fh:
                yield fh
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
        if target.exists():  # keep the old file's permissions, not mkstemp's 0600
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@contextmanager
def _named_errors(target: Path) -> Iterator[None]:
    """A failed write() or close() names no file: name the one being written (for the one-line message)."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(target)
        raise


def atomic_write_lines(path: PathLike, lines: Iterable[str], fsync: bool = False) -> Path:
    """Write `lines` (each with its newline) to `path` atomically; fsync as in `atomic_write`."""
    with atomic_write(path, fsync=fsync) as fh:
        fh.writelines(lines)
    return Path(path)


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_write(path) as fh:
        fh.write(text)
    return Path(path)


@contextmanager
def staged_dir(out: PathLike) -> Iterator[Path]:
    """A temp folder beside `out` to write a whole folder (a model) into; on success its files move into `out`
    (one rename of the folder when `out` does not exist, else one rename per file), on failure (a full disk,
    an error, Ctrl-C) it is removed, so an interrupted write never leaves a half-written folder at `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if not out.exists():
            os.chmod(tmp, 0o777 & ~current_umask())
            os.replace(tmp, out)
            return
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
        tmp.rmdir()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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


def file_sha256(path: PathLike) -> str:
    """SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def existing_files(folder: PathLike | None) -> Iterable[Path]:
    """The files directly in `folder` (a local model directory), or none when it is not a folder."""
    if folder is None:
        return []
    p = Path(folder)
    try:
        return [f for f in p.iterdir() if f.is_file()] if p.is_dir() else []
    except OSError:
        return []

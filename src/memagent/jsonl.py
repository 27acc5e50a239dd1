"""Reading JSONL files line by line, with errors that name the file and the line.

Each line is read by the bounded JSON reader (`memagent.bounded.loads_json`: depth, size, integer digits, text
that is valid UTF-8); a byte order mark before the first line is accepted and stripped."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from memagent.bounded import loads_json


def iter_jsonl(path: Path, error: type[Exception], fh: BinaryIO | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line of `path` (`fh`: the file opened already, at its start);
    a line that is not JSON raises `error` with "PATH:LINE: not valid JSON (...)". The caller checks that the
    file exists."""
    with open(path, "rb") if fh is None else nullcontext(fh) as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(f"{path}:{lineno}: not valid UTF-8 (byte {exc.start} of the line: {exc.reason}); "
                            "save the file as UTF-8") from None
            if not line.strip():
                continue
            yield lineno, loads_json(line, f"{path}:{lineno}", error)


def trim_torn_tail(path: Path) -> bytes:
    """The bytes of `path` up to its last newline; a last line cut short by a crash (no newline at the end) is
    cut off the file too, so appending goes on after the last whole record."""
    data = Path(path).read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(path, "r+b") as fh:
            fh.truncate(keep)
        data = data[:keep]
    return data

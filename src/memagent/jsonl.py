"""Reading JSONL files line by line, with errors that name the file and the line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def iter_jsonl(path: Path, error: type[Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line of `path`; a line that is not JSON raises
    `error` with "PATH:LINE: not valid JSON (...)". The caller checks that the file exists."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None

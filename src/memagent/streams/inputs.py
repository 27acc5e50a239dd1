"""Events read from files and pipes: what `memagent stream append` (and the server) append.

Three formats, one event each:
- `lines`: every line (blank lines are skipped and counted); read as it arrives, so `tail -f log | memagent stream
  append s.db` appends each line as it is written;
- `jsonl`: every line a JSON object {text, role?, time?, source?} (a blank line skipped and counted);
- `text`: the whole input.
The role, time and source given on the command line apply to every event that does not carry its own. A line or
an input over the stream's event limit is refused before it is read whole (bounded RAM).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

from memagent.streams.events import StreamError

FORMATS = ("lines", "jsonl", "text")
_FIELDS = ("text", "role", "time", "source")


@dataclass
class Skipped:
    blank: int = 0  # blank lines left out (they hold no event)


def iter_input_events(fh: BinaryIO, name: str, fmt: str, max_bytes: int, defaults: dict[str, Any],
                      skipped: Skipped | None = None) -> Iterator[dict[str, Any]]:
    """The events of the binary input `fh` (named `name` in errors) in format `fmt`, each {text, role, time,
    source}: its own fields over `defaults`."""
    if fmt not in FORMATS:
        raise StreamError(f"unknown input format {fmt!r}; the formats are {', '.join(FORMATS)}")
    skipped = skipped if skipped is not None else Skipped()
    if fmt == "text":
        raw = fh.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise StreamError(f"{name} is over the stream's event limit of {max_bytes} bytes; append it as lines "
                              "(--format lines) or split it")
        yield dict(defaults, text=_decode(raw, name, None))
        return
    limit = max_bytes * 6 + 4096 if fmt == "jsonl" else max_bytes + 2  # a JSON string may escape each byte
    n = 0
    while True:
        raw = fh.readline(limit)
        if not raw:
            return
        n += 1
        if len(raw) >= limit and not raw.endswith(b"\n"):
            raise StreamError(f"{name} line {n} is over the stream's event limit of {max_bytes} bytes; split it")
        line = _decode(raw, name, n).rstrip("\r\n")
        if not line.strip():
            skipped.blank += 1
            continue
        if fmt == "lines":
            yield dict(defaults, text=line)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise StreamError(f"{name} line {n} is not JSON ({e.msg} at column {e.colno}); each line of --format "
                              "jsonl is one object {text, role, time, source}") from None
        if not isinstance(record, dict):
            raise StreamError(f"{name} line {n} is a JSON {type(record).__name__}, not an object {{text, role, time, "
                              "source}")
        unknown = sorted(set(record) - set(_FIELDS))
        if unknown:
            raise StreamError(f"{name} line {n} has the field(s) {', '.join(unknown)[:200]}; an event has "
                              f"{', '.join(_FIELDS)}")
        if not isinstance(record.get("text"), str):
            raise StreamError(f"{name} line {n}: an event's text must be a string (field `text`)")
        yield dict(defaults, **{k: v for k, v in record.items() if v is not None})


def _decode(raw: bytes, name: str, line: int | None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"line {line}" if line is not None else f"byte {e.start}"
        raise StreamError(f"{name} {where} is not valid UTF-8 ({e.reason}); a stream holds UTF-8 text") from None

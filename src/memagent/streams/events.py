"""Events of a stream and the one template that turns them into text.

An event is (text, role, time, source). A stream's text is its events rendered in order by `EVENT_TEMPLATE`:

    [2026-12-06T12:58:54Z] user (chat):
    I moved to Berlin last week.

one header line (`[TIME] ROLE` and ` (SOURCE)` when there is one, then `:`), the text, and exactly one newline.
So a stream is also an ordinary document: `memagent stream show s.db --text > s.txt` is what every other
command reads.

Why exactly this shape: a standing question (memagent.streams.standing) tokenises each event on its own and
reads the concatenation of those token ids in chunks of C tokens, while `memagent ask` tokenises the whole text.
The two agree when no token spans the boundary between two events. Every event ends with one newline and the next
starts with `[`: byte-level BPE pre-tokenisers (GPT-2, Llama 3, Qwen, SmolLM2) always split between a newline and
a following `[`, and a single trailing newline is the same pre-token at the end of the text as before a `[`
(two newlines would not be: GPT-2's `\\s+(?!\\S)` takes "\\n\\n" whole at the end and splits it before `[`). So
the text's trailing whitespace is removed and an event of only whitespace is refused. Each boundary is also
checked against the model's own tokenizer as it is read (`memagent.streams.standing.event_ids`).

Bounds: the text at most `max_event_bytes` UTF-8 bytes (the stream's, default 1 MiB, set at create), the role
1-32 characters of [A-Za-z0-9_.-], the source at most 200 characters of one line. Times are ISO 8601
(`2026-12-06T12:58:54Z`, `2026-12-06 12:58:54+01:00`, `2026-12-06`); one without a zone is UTC; all are kept in
UTC, to the second.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from memagent.errors import MemAgentError
from memagent.text import bad_char, describe_bad

EVENT_TEMPLATE = "[{time}] {role}{source}:\n{text}\n"  # source: " (SOURCE)" or ""
DEFAULT_EVENT_BYTES = 1 << 20  # the text of one event, in UTF-8 bytes
MOST_EVENT_BYTES = 16 << 20  # the highest limit a stream may set
ROLE = re.compile(r"[A-Za-z0-9_.\-]{1,32}")
MAX_SOURCE_CHARS = 200
DEFAULT_ROLE = "user"


class StreamError(MemAgentError, ValueError):
    """A stream, an event or a standing question the user must fix (the CLI's one `error:` line, exit code 2)."""


@dataclass(frozen=True)
class Event:
    """One event of a stream, as stored (its time in UTC, `YYYY-MM-DDTHH:MM:SSZ`)."""

    text: str
    role: str = DEFAULT_ROLE
    time: str = ""
    source: str | None = None
    id: int = 0  # 1, 2, ... in the stream (0: not appended yet)

    def render(self) -> str:
        """The event's text in the stream's text (EVENT_TEMPLATE)."""
        return render(self.text, self.role, self.time, self.source)

    def as_dict(self) -> dict:
        return dict(id=self.id, time=self.time, role=self.role, source=self.source, text=self.text)


def render(text: str, role: str, time: str, source: str | None) -> str:
    return EVENT_TEMPLATE.format(time=time, role=role, source=f" ({source})" if source else "", text=text)


def parse_time(value: str | datetime | None, now: datetime | None = None) -> str:
    """The UTC time of an event as stored (`2026-12-06T12:58:54Z`): `value` in ISO 8601 (no zone: UTC), a datetime,
    or None for now. StreamError for anything else."""
    if value is None:
        return _fmt(now or datetime.now(timezone.utc))
    if isinstance(value, datetime):
        return _fmt(value)
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise StreamError(f"bad time {str(value)[:64]!r}: give an ISO 8601 time, e.g. 2026-12-06T12:58:54Z")
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise StreamError(f"bad time {value!r}: give an ISO 8601 time, e.g. 2026-12-06T12:58:54Z "
                          "(no zone: UTC)") from None
    return _fmt(t)


def _fmt(t: datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    try:
        return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError):
        raise StreamError(f"bad time {t.isoformat()!r}: it is out of range once in UTC") from None


def make_event(text: str, role: str | None = None, time: str | datetime | None = None, source: str | None = None,
               max_bytes: int = DEFAULT_EVENT_BYTES) -> Event:
    """A checked event (StreamError naming what is wrong): text not empty, within `max_bytes`, valid text."""
    if not isinstance(text, str):
        raise StreamError(f"an event's text must be a string, got {type(text).__name__}")
    text = text.rstrip()  # see the module's docstring: one newline ends every event
    if not text:
        raise StreamError("an event's text is empty (or only whitespace); there is nothing to append")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise StreamError(f"an event of {size} bytes is over the stream's limit of {max_bytes} bytes; split it "
                          "into several events (or create the stream with a higher --max-event-bytes)")
    i = bad_char(text)
    if i is not None:
        raise StreamError(f"an event's text holds {describe_bad(text, i)}; give valid UTF-8 text")
    if "\x00" in text:
        raise StreamError(f"an event's text holds a NUL character (at character {text.index(chr(0))}); a stream "
                          "holds text, not binary data")
    role = DEFAULT_ROLE if role is None else role
    if not isinstance(role, str) or not ROLE.fullmatch(role):
        raise StreamError(f"bad role {str(role)[:40]!r}: 1-32 characters of letters, digits, _ . -")
    if source is not None:
        if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS or not source.isprintable():
            raise StreamError(f"bad source {str(source)[:40]!r}: at most {MAX_SOURCE_CHARS} printable characters "
                              "on one line")
        source = source.strip() or None
    return Event(text, role, parse_time(time), source)

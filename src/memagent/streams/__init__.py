"""Memory over a stream: an append-only log of events that grows, and standing questions kept current as text
arrives (issue 47; docs/streams.md).

    events.py     Event, the one event-to-text template (EVENT_TEMPLATE), the bounds and time rule, StreamError
    store.py      the stream file (SQLite): events, standing questions, every memory version, answers
    standing.py   a standing question: one memory update per full chunk as events arrive, the tail when asked
    stream.py     `Stream` (memagent.Stream): open, append, ask, watch
"""
from __future__ import annotations

from memagent.streams.events import EVENT_TEMPLATE, Event, StreamError, make_event, parse_time, render
from memagent.streams.standing import MemoryVersion, StandingQuestion, StreamAnswer
from memagent.streams.stream import Stream

__all__ = ["EVENT_TEMPLATE", "Event", "MemoryVersion", "StandingQuestion", "Stream", "StreamAnswer", "StreamError",
           "make_event", "parse_time", "render"]

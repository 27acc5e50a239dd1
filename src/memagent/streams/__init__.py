"""Memory over a stream: an append-only log of events that grows, and standing questions kept current as text
arrives (issue 47; docs/streams.md).

    events.py     Event, the one event-to-text template (EVENT_TEMPLATE), the bounds and time rule, StreamError
    store.py      the stream file (SQLite): events, standing questions, every memory version, answers
    standing.py   a standing question: one memory update per full chunk as events arrive, the tail when asked
    stream.py     `Stream` (memagent.Stream): open, append, ask, watch
    inputs.py     events read from files and pipes (lines, jsonl, text): what `memagent stream append` appends
    formats.py    LongMemEval, LoCoMo and MemoryAgentBench files read as conversations
    samples.py    conversations written as stream files and sample JSONL; offline look-alikes (`data streams`)
"""
from __future__ import annotations

from memagent.streams.events import EVENT_TEMPLATE, Event, StreamError, make_event, parse_time, render
from memagent.streams.standing import MemoryVersion, StandingQuestion, StreamAnswer
from memagent.streams.stream import Stream

__all__ = ["EVENT_TEMPLATE", "Event", "MemoryVersion", "StandingQuestion", "Stream", "StreamAnswer", "StreamError",
           "make_event", "parse_time", "render"]

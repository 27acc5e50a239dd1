"""`memagent.Stream`: a stream file in Python (open, append, ask, watch), the semantics of `memagent stream`.

    s = Stream.create("s.db")                       # or Stream.open("s.db")
    s.append("I moved to Berlin.", role="user", time="2026-12-06T12:00:00Z")
    for v in s.watch("Where does the user live?", backend, config, model="m"):   # one version per full chunk
        print(v.chunk, v.memory)
    print(s.ask("Where does the user live?", backend, config, model="m").answer)

Appending takes the stream's writer lock (an OS lock on `.NAME.lock` beside the file, held until `close`): a
second process appending to the same stream is refused at once, or waits `wait` seconds for it, so the events of
two writers never interleave. Reading, watching and asking take no lock (SQLite's transactions keep each write
whole).
"""
from __future__ import annotations

import os
import time as _time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from filelock import FileLock, Timeout

from memagent.agent.protocol import AgentInput
from memagent.agent.registry import DEFAULT_WORKFLOW, build_workflow, run_workflow
from memagent.config import AgentConfig
from memagent.lock import lock_path_for
from memagent.streams.events import Event, StreamError, make_event
from memagent.streams.standing import (MemoryVersion, StandingQuestion, StreamAnswer, question_key,
                                       register)
from memagent.streams.store import StreamFile

TRACE_ANSWERS = 16  # the answers `Stream.trace` draws, the newest


class Stream:
    """An append-only log of events in a SQLite file, with its standing questions (memagent.streams)."""

    def __init__(self, path: str | os.PathLike, create: bool = False, max_event_bytes: int | None = None,
                 wait: float = 0.0, name: str = "") -> None:
        self.path = Path(path)
        self.file = StreamFile(self.path, create=create, max_event_bytes=max_event_bytes, name=name)
        self.wait = wait  # seconds an append waits for another writer's lock (0: refuse at once)
        self._lock: FileLock | None = None

    @classmethod
    def create(cls, path: str | os.PathLike, max_event_bytes: int | None = None, name: str = "") -> "Stream":
        """A new, empty stream file at `path` (StreamError when something is there); `name`: a label for people."""
        return cls(path, create=True, max_event_bytes=max_event_bytes, name=name)

    @classmethod
    def open(cls, path: str | os.PathLike, wait: float = 0.0) -> "Stream":
        """The stream file at `path` (StreamError when there is none, or it is not a stream, or it is damaged)."""
        return cls(path, wait=wait)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.file.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __len__(self) -> int:
        return self.file.count()

    # -- events -----------------------------------------------------------------------------------------------
    def writer(self) -> None:
        """Take the writer lock (kept until close); StreamError when another process holds it past `wait`."""
        if self._lock is not None:
            return
        lock = FileLock(str(lock_path_for(self.path)), timeout=self.wait)
        try:
            lock.acquire()
        except Timeout:
            waited = f" for {self.wait:g} s" if self.wait else ""
            raise StreamError(f"another process is appending to {self.path} (it holds {lock_path_for(self.path)}); "
                              f"waited{waited or ' not at all'}: wait for it to finish, or give --wait SECONDS") \
                from None
        self._lock = lock

    def append(self, text: str, role: str | None = None, time: Any = None, source: str | None = None) -> Event:
        """Append one event (checked: memagent.streams.events.make_event); the event as stored, with its id."""
        event = make_event(text, role, time, source, self.file.max_event_bytes)
        self.writer()
        (eid,) = self.file.append([event])
        return Event(event.text, event.role, event.time, event.source, eid)

    def append_many(self, events: Iterable[dict[str, Any]]) -> list[int]:
        """Append many events ({text, role?, time?, source?} each) in one transaction: all or none."""
        made = [make_event(e.get("text"), e.get("role"), e.get("time"), e.get("source"), self.file.max_event_bytes)
                for e in events]
        self.writer()
        return self.file.append(made)

    def events(self, after: int = 0, limit: int | None = None) -> list[Event]:
        return self.file.events(after, limit)

    def text_blocks(self, upto: int | None = None) -> Iterator[str]:
        """The stream's text (its events rendered in order, up to event `upto`), one event at a time."""
        for event in self.file.iter_events():
            if upto is not None and event.id > upto:
                return
            yield event.render()

    def text(self) -> str:
        return "".join(self.text_blocks())

    # -- questions --------------------------------------------------------------------------------------------
    def standing(self, question: str, backend: Any, config: AgentConfig | None = None, model: str = "",
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> StandingQuestion:
        """The standing question (question, model, config) of this stream, registered now if it is new."""
        config = config or AgentConfig()
        qid = register(self.file, question, model, config, backend)
        return StandingQuestion(self.file, qid, backend, config, on_step)

    def find(self, question: str, model: str, config: AgentConfig | None = None) -> int | None:
        """The id of the standing question (question, model, config), or None."""
        row = self.file.question_row("key", question_key(question, model, config or AgentConfig()))
        return None if row is None else row["id"]

    def questions(self) -> list[dict[str, Any]]:
        """Each standing question: {id, question, model, config, events_read, chunks, memory, ...}."""
        return self.file.questions()

    def memories(self, qid: int) -> list[dict[str, Any]]:
        return self.file.memories(qid)

    def answers(self, qid: int) -> list[dict[str, Any]]:
        return self.file.answers(qid)

    def trace(self, qid: int, answers: int = TRACE_ANSWERS) -> list[dict[str, Any]]:
        """Question `qid` as a trace `memagent report` draws, to see how its answer changed over time: one document
        per answer given (the last `answers`), "q{qid} after event N": the memory versions it was answered from
        (those whose events were all read by then), then the answer as the final record. No answer yet: the
        versions alone, as "q{qid}"."""
        versions, given = self.memories(qid), self.answers(qid)[-answers:] if answers > 0 else []
        if not given:
            return [dict(v["record"], doc_id=f"q{qid}") for v in versions]
        out: list[dict[str, Any]] = []
        for a in given:
            doc = f"q{qid} after event {a['events']}"
            out += [dict(v["record"], doc_id=doc) for v in versions if v["events_read"] <= a["events"]]
            out.append(dict(doc_id=doc, step=a["chunks"], kind="final", answer=a["answer"], raw_answer=a["raw_answer"]))
        return out

    def watch(self, question: str, backend: Any, config: AgentConfig | None = None, model: str = "",
              follow: bool = False, poll: float = 1.0, stop: Callable[[], bool] | None = None) -> Iterator[MemoryVersion]:
        """Register the standing question (if new) and keep it current: each memory version as it is made. With
        `follow`, wait for more events (checking every `poll` seconds) until `stop()` says so."""
        q = self.standing(question, backend, config, model)
        while True:
            yield from q.iter_advance()
            if not follow or (stop is not None and stop()):
                return
            _time.sleep(poll)

    def ask(self, question: str, backend: Any, config: AgentConfig | None = None, model: str = "",
            workflow: str = DEFAULT_WORKFLOW, standing: bool | None = None, **options: Any) -> StreamAnswer:
        """Answer `question` over the stream. A standing question (registered with this model and config; or any
        with `standing=True`, registered now) answers from its memory: the tail and the final call once it is
        current. Otherwise the whole text is read with `workflow` (memagent, lookup, skim, ...) and its options."""
        config = config or AgentConfig()
        if standing is None:
            standing = workflow == DEFAULT_WORKFLOW and not options and self.find(question, model, config) is not None
        if standing:
            if workflow != DEFAULT_WORKFLOW or options:
                raise StreamError("a standing question reads with the paper's workflow (memagent) and no options; "
                                  "ask ad hoc for another workflow")
            return self.standing(question, backend, config, model).answer()
        n = len(self)
        runner = build_workflow(workflow, backend, config, failures="raise", **options)
        r = run_workflow(runner, [AgentInput(question, self.text_blocks(n), "stream")])[0]
        return StreamAnswer(question, r.answer, r.raw_answer, r.memory, n, r.num_chunks, r.calls)

"""A stream file: one SQLite database holding the events, the standing questions and every memory version.

    events     (id 1, 2, ..., time, role, source, text)          append-only
    questions  (id, question, model, config, key, ...; the read state: events_read, chunks, memory, tail ids)
    memories   (question_id, chunk, events_read, memory, record)  one row per memory update, every version kept
    answers    (question_id, events, chunks, answer, ...)          one row per answer given

Every write is one transaction (BEGIN IMMEDIATE), so a process killed at any point (kill -9) leaves each event
either there once or not there, and a question's memory version together with the read state it belongs to.
The journal is SQLite's WAL with synchronous=NORMAL: a commit survives the process dying at once; a power cut
may lose the last commits, never half of one.

A file is a stream when SQLite opens it and its header's application id is ours (`APPLICATION_ID`); anything
else (garbage, another database, a damaged file) is one StreamError naming the file. A full disk during a write
is one StreamError as well: the write is rolled back, what was there before stays.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from memagent.streams.events import DEFAULT_EVENT_BYTES, MOST_EVENT_BYTES, Event, StreamError

APPLICATION_ID = 0x4D454D53  # "MEMS" in the SQLite header: this file is a memagent stream
VERSION = 1  # PRAGMA user_version of the stream files this code writes
BUSY_MS = 10_000  # how long a write waits for another process's write to finish

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (id INTEGER PRIMARY KEY, time TEXT NOT NULL, role TEXT NOT NULL, source TEXT,
    text TEXT NOT NULL);
CREATE TABLE questions (id INTEGER PRIMARY KEY, question TEXT NOT NULL, model TEXT NOT NULL, config TEXT NOT NULL,
    key TEXT NOT NULL UNIQUE, probe TEXT NOT NULL, created REAL NOT NULL,
    events_read INTEGER NOT NULL DEFAULT 0, chunks INTEGER NOT NULL DEFAULT 0, memory TEXT,
    tail TEXT NOT NULL DEFAULT '[]', last TEXT NOT NULL DEFAULT '');
CREATE TABLE memories (question_id INTEGER NOT NULL, chunk INTEGER NOT NULL, events_read INTEGER NOT NULL,
    memory TEXT NOT NULL, record TEXT NOT NULL, time REAL NOT NULL, PRIMARY KEY (question_id, chunk));
CREATE TABLE answers (id INTEGER PRIMARY KEY, question_id INTEGER NOT NULL, events INTEGER NOT NULL,
    chunks INTEGER NOT NULL, answer TEXT, raw_answer TEXT NOT NULL, memory TEXT NOT NULL, time REAL NOT NULL);
"""
_TABLES = {"meta", "events", "questions", "memories", "answers"}

# SQLite's primary result codes (an extended code's low byte)
_BUSY, _LOCKED, _CORRUPT, _FULL, _NOTADB, _IOERR = 5, 6, 11, 13, 26, 10


def sqlite_message(path: Path, e: sqlite3.Error, doing: str) -> str:
    """The one line of a SQLite failure on the stream file `path` while `doing` something."""
    code = (getattr(e, "sqlite_errorcode", None) or 0) & 0xFF
    text = str(e)
    if code == _FULL or "disk is full" in text:
        return (f"{path}: no space left on the device while {doing}; it was not written (what the stream held "
                "before is kept); free some space and try again")
    if code in (_BUSY, _LOCKED) or "locked" in text:
        return (f"{path}: another process kept the stream busy for more than {BUSY_MS // 1000} s while {doing}; "
                "try again when it has finished")
    if code == _NOTADB or "not a database" in text:
        return f"{path} is not a memagent stream (not a SQLite database); give a stream file (memagent stream create)"
    if code == _CORRUPT or "malformed" in text:
        return (f"{path} is damaged (SQLite: {text}); restore it from a copy, or start a new stream and append "
                "its events again (memagent stream show --events lists what can still be read)")
    if code == _IOERR:
        return f"{path}: an I/O error while {doing} (SQLite: {text}); check the disk"
    return f"{path}: SQLite failed while {doing}: {text}"


class StreamFile:
    """The SQLite file of one stream: its tables, checked as it opens; each method one transaction or one read."""

    def __init__(self, path: str | os.PathLike, create: bool = False, max_event_bytes: int | None = None,
                 name: str = "") -> None:
        self.path = Path(path)
        self.token_cache: OrderedDict[tuple[str, int], list[int]] = OrderedDict()  # memagent.streams.standing
        if create:
            if self.path.exists() and (self.path.is_dir() or self.path.stat().st_size > 0):
                raise StreamError(f"{self.path} already exists; give a new file to create a stream "
                                  "(or append to this one)")
            if not self.path.parent.is_dir():
                raise StreamError(f"{self.path}: its folder {self.path.parent} does not exist")
        else:
            if not self.path.exists():
                raise StreamError(f"no stream at {self.path}; create it first: memagent stream create {self.path}")
            if self.path.is_dir():
                raise StreamError(f"{self.path} is a folder, not a stream file")
            if self.path.stat().st_size == 0:
                raise StreamError(f"{self.path} is empty, not a memagent stream; create one with memagent stream "
                                  "create")
        try:
            self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                      timeout=BUSY_MS / 1000)
        except sqlite3.Error as e:
            raise StreamError(sqlite_message(self.path, e, "opening it")) from None
        try:
            with self.errors("opening it"):
                if create:
                    self._create(max_event_bytes, name)
                else:
                    self._check()
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.max_event_bytes = int(self.meta("max_event_bytes"))
        except BaseException:
            self.db.close()
            raise

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """SQLite's failures as one StreamError line (memagent.streams.store.sqlite_message)."""
        try:
            yield
        except sqlite3.Error as e:
            raise StreamError(sqlite_message(self.path, e, doing)) from None

    @contextmanager
    def write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: it waits for another writer up to BUSY_MS, never interleaves);
        rolled back when the body or the commit fails."""
        with self.errors(doing):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    def _create(self, max_event_bytes: int | None, name: str) -> None:
        limit = DEFAULT_EVENT_BYTES if max_event_bytes is None else max_event_bytes
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MOST_EVENT_BYTES:
            raise StreamError(f"max_event_bytes must be a whole number in 1..{MOST_EVENT_BYTES}, got {limit!r}")
        self.db.execute("PRAGMA journal_mode=WAL")
        with self.write("creating it") as db:
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {VERSION}")
            for statement in _SCHEMA.strip().split(";"):
                if statement.strip():
                    db.execute(statement)
            db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                           [("format", "memagent-stream"), ("max_event_bytes", str(limit)),
                            ("created", str(time.time())), ("name", name)])

    def _check(self) -> None:
        app = self.db.execute("PRAGMA application_id").fetchone()[0]
        if app != APPLICATION_ID:
            raise StreamError(f"{self.path} is a SQLite database but not a memagent stream; give a stream file "
                              "(memagent stream create)")
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version != VERSION:
            raise StreamError(f"{self.path} is a stream of format version {version}; this memagent reads version "
                              f"{VERSION}")
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not _TABLES <= tables:
            raise StreamError(f"{self.path} is damaged: it lacks the table(s) {', '.join(sorted(_TABLES - tables))}")
        self.db.execute("PRAGMA journal_mode=WAL")

    def close(self) -> None:
        self.db.close()

    # -- reads ------------------------------------------------------------------------------------------------
    def meta(self, key: str, default: str | None = None) -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None and default is not None:
            return default
        if row is None:
            raise StreamError(f"{self.path} is damaged: its meta table lacks {key!r}")
        return row[0]

    def count(self) -> int:
        with self.errors("reading it"):
            return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def events(self, after: int = 0, limit: int | None = None) -> list[Event]:
        """The events with id > `after`, in order (at most `limit`)."""
        with self.errors("reading its events"):
            rows = self.db.execute("SELECT id, time, role, source, text FROM events WHERE id > ? ORDER BY id LIMIT ?",
                                   (after, -1 if limit is None else limit)).fetchall()
        return [Event(text, role, t, source, i) for i, t, role, source, text in rows]

    def iter_events(self, after: int = 0, page: int = 256) -> Iterator[Event]:
        """Every event with id > `after`, read `page` at a time (bounded RAM)."""
        while True:
            batch = self.events(after, page)
            yield from batch
            if len(batch) < page:
                return
            after = batch[-1].id

    # -- writes -----------------------------------------------------------------------------------------------
    def append(self, events: list[Event]) -> list[int]:
        """Append `events` in one transaction; their ids."""
        ids = []
        with self.write("appending an event") as db:
            for e in events:
                cur = db.execute("INSERT INTO events (time, role, source, text) VALUES (?, ?, ?, ?)",
                                 (e.time, e.role, e.source, e.text))
                ids.append(cur.lastrowid)
        return ids

    # -- standing questions -----------------------------------------------------------------------------------
    def question_row(self, where: str, arg: Any) -> dict[str, Any] | None:
        with self.errors("reading its questions"):
            row = self.db.execute("SELECT id, question, model, config, key, probe, created, events_read, chunks, "
                                  f"memory, tail, last FROM questions WHERE {where} = ?", (arg,)).fetchone()
        if row is None:
            return None
        keys = ("id", "question", "model", "config", "key", "probe", "created", "events_read", "chunks", "memory",
                "tail", "last")
        out = dict(zip(keys, row))
        out["config"], out["tail"] = json.loads(out["config"]), json.loads(out["tail"])
        return out

    def questions(self) -> list[dict[str, Any]]:
        with self.errors("reading its questions"):
            ids = [r[0] for r in self.db.execute("SELECT id FROM questions ORDER BY id")]
        return [self.question_row("id", i) for i in ids]  # type: ignore[misc]

    def add_question(self, question: str, model: str, config: dict, key: str, probe: str) -> int:
        with self.write("registering a standing question") as db:
            cur = db.execute("INSERT INTO questions (question, model, config, key, probe, created) "
                             "VALUES (?, ?, ?, ?, ?, ?)",
                             (question, model, json.dumps(config, sort_keys=True), key, probe, time.time()))
            return cur.lastrowid  # type: ignore[return-value]

    def save_progress(self, qid: int, chunks: int, events_read: int, tail: list[int], last: str,
                      memory: str | None = None, record: dict | None = None) -> bool:
        """Move question `qid` from `chunks` full chunks read to what is given, in one transaction: with `memory`,
        one more memory version (chunk number `chunks`, the question then at chunks + 1); without, only its read
        state (events tokenised into the tail). False when another process moved it first (nothing written)."""
        with self.write("saving a standing question's memory") as db:
            now = db.execute("SELECT chunks FROM questions WHERE id = ?", (qid,)).fetchone()
            if now is None or now[0] != chunks:
                return False
            if memory is not None:
                db.execute("INSERT INTO memories (question_id, chunk, events_read, memory, record, time) "
                           "VALUES (?, ?, ?, ?, ?, ?)",
                           (qid, chunks, events_read, memory, json.dumps(record or {}, ensure_ascii=False), time.time()))
                db.execute("UPDATE questions SET chunks = ?, memory = ?, events_read = ?, tail = ?, last = ? "
                           "WHERE id = ?", (chunks + 1, memory, events_read, json.dumps(tail), last, qid))
            else:
                db.execute("UPDATE questions SET events_read = ?, tail = ?, last = ? WHERE id = ?",
                           (events_read, json.dumps(tail), last, qid))
        return True

    def memories(self, qid: int) -> list[dict[str, Any]]:
        """Every memory version of question `qid`, oldest first: {chunk, events_read, memory, record, time}."""
        with self.errors("reading its memories"):
            rows = self.db.execute("SELECT chunk, events_read, memory, record, time FROM memories "
                                   "WHERE question_id = ? ORDER BY chunk", (qid,)).fetchall()
        return [dict(chunk=c, events_read=e, memory=m, record=json.loads(r), time=t) for c, e, m, r, t in rows]

    def add_answer(self, qid: int, events: int, chunks: int, answer: str | None, raw: str, memory: str) -> None:
        with self.write("saving an answer") as db:
            db.execute("INSERT INTO answers (question_id, events, chunks, answer, raw_answer, memory, time) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", (qid, events, chunks, answer, raw, memory, time.time()))

    def answers(self, qid: int) -> list[dict[str, Any]]:
        with self.errors("reading its answers"):
            rows = self.db.execute("SELECT events, chunks, answer, raw_answer, memory, time FROM answers "
                                   "WHERE question_id = ? ORDER BY id", (qid,)).fetchall()
        return [dict(events=e, chunks=c, answer=a, raw_answer=r, memory=m, time=t) for e, c, a, r, m, t in rows]

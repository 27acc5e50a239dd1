"""The service's state in SQLite (`STATE_DIR/serve.sqlite3`): jobs, their questions, and one row per
finished chunk (the trace record, with the memory and token offset after it), so a restarted server
resumes every unfinished job at its last finished chunk. Each job keeps its reading workflow (`workflow`),
so a restarted server resumes it, and shows it, with the workflow it was started with.

Every write is its own transaction; one connection is shared by the threads under a lock. A file that is
not such a database (garbage, a database of another schema or version, a folder) is refused when the store
opens, naming the file; a 0-byte file is a new, empty database (SQLite's own rule: it holds nothing to lose).

Schema versions (`PRAGMA user_version`): 0 (written before it was set) and 1 lack `jobs.workflow`; 0 to 2 key
`steps` by chunk number, so a workflow that reads a chunk twice (`lookup`'s hits) or makes several calls of one
step number (its queries) kept only the last record of each. Version 3 keys a step by its place in the
question's stream (`seq`, 0, 1, ...: the order the records were written). Opening an older database adds
`jobs.workflow` (NULL for the old jobs: not recorded) and rebuilds `steps` with `seq` = the chunk number (the
order they had), then sets version 3, in one transaction. A version above 3 (a newer memagent's) is refused,
and left as it was.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from memagent.errors import InputError

_STEPS_TABLE = """CREATE TABLE IF NOT EXISTS steps (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, seq INTEGER NOT NULL, step INTEGER NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (job_id, idx, seq))"""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, document_id TEXT NOT NULL, error TEXT,
    created REAL NOT NULL, calls INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0, chat INTEGER NOT NULL DEFAULT 0, workflow TEXT);
CREATE TABLE IF NOT EXISTS questions (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, question TEXT NOT NULL, chunks_total INTEGER,
    final TEXT, PRIMARY KEY (job_id, idx));
CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs (created);
""" + _STEPS_TABLE + ";\n"
UNFINISHED = ("queued", "running")
SCHEMA_VERSION = 3  # PRAGMA user_version of the databases this code writes (0: written before it was set)
READS = (0, 1, 2, SCHEMA_VERSION)  # the versions it opens (0 to 2 are migrated to 3)
_COLUMNS = {"jobs": {"id", "state", "document_id", "error", "created", "calls", "prompt_tokens",
                     "completion_tokens", "chat"},
            "questions": {"job_id", "idx", "question", "chunks_total", "final"},
            "steps": {"job_id", "idx", "step", "record"}}


class Store:
    """Jobs, questions and per-chunk progress; thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise self._not_ours(f"SQLite cannot open it: {e}") from None
        try:
            self._open()
        except sqlite3.Error as e:
            self._db.close()
            raise self._not_ours(f"SQLite: {e}") from None
        except InputError:
            self._db.close()
            raise
        self._lock = threading.Lock()

    def _open(self) -> None:
        """The schema check (reads only: a database that is not ours is left as it was), then WAL mode and the
        tables that are absent."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in READS:
            raise self._not_ours(f"schema version {version}; this memagent reads version {SCHEMA_VERSION}")
        for table, want in _COLUMNS.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if have and not want <= have:
                raise self._not_ours(f"another schema: its table {table!r} lacks the column(s) "
                                     f"{', '.join(sorted(want - have))}")
            if have:
                self._db.execute(f"SELECT {', '.join(sorted(want))} FROM {table} LIMIT 1").fetchall()  # readable
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        if version != SCHEMA_VERSION:
            self._migrate()

    def _migrate(self) -> None:
        """Version 0-2 -> 3: the column `jobs.workflow` (NULL for the jobs written before), `steps` rebuilt with
        `seq` (the chunk number: the order the old key gave), then the version; one transaction, so a crash leaves
        the old database as it was."""
        have = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        steps = {row[1] for row in self._db.execute("PRAGMA table_info(steps)")}
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if "workflow" not in have:
                self._db.execute("ALTER TABLE jobs ADD COLUMN workflow TEXT")
            if "seq" not in steps:
                self._db.execute("ALTER TABLE steps RENAME TO steps_v2")
                self._db.execute(_STEPS_TABLE)  # execute, not executescript: that would commit the transaction
                self._db.execute("INSERT INTO steps (job_id, idx, seq, step, record) "
                                 "SELECT job_id, idx, step, step, record FROM steps_v2")
                self._db.execute("DROP TABLE steps_v2")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _not_ours(self, why: str) -> InputError:
        return InputError(f"{self.path} is not a memagent serve database ({why}); move it away, or give another "
                          "--state-dir, to start with an empty one")

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def add_job(self, job_id: str, document_id: str, questions: list[str], chat: bool = False,
                workflow: str | None = None) -> None:
        """A queued job; `chat`: made by a chat completion (its client waits on the connection); `workflow`: the
        name of its reading workflow."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO jobs (id, state, document_id, created, chat, workflow) "
                             "VALUES (?, 'queued', ?, ?, ?, ?)", (job_id, document_id, time.time(), int(chat), workflow))
            self._db.executemany("INSERT INTO questions (job_id, idx, question) VALUES (?, ?, ?)",
                                 [(job_id, i, q) for i, q in enumerate(questions)])
            self._db.execute("COMMIT")

    def set_state(self, job_id: str, state: str, error: str | None = None) -> None:
        self._run("UPDATE jobs SET state = ?, error = ? WHERE id = ?", (state, error, job_id))

    def set_total(self, job_id: str, chunks_total: int) -> None:
        self._run("UPDATE questions SET chunks_total = ? WHERE job_id = ?", (chunks_total, job_id))

    def add_usage(self, job_id: str, calls: int, prompt_tokens: int, completion_tokens: int) -> None:
        self._run("UPDATE jobs SET calls = calls + ?, prompt_tokens = prompt_tokens + ?, "
                  "completion_tokens = completion_tokens + ? WHERE id = ?",
                  (calls, prompt_tokens, completion_tokens, job_id))

    def add_step(self, job_id: str, idx: int, record: dict[str, Any]) -> None:
        """One more record of question `idx`, after those it has (every call is kept: a chunk read twice, or
        several calls of one step number, are several rows)."""
        self._run("INSERT INTO steps (job_id, idx, seq, step, record) SELECT ?, ?, COALESCE(MAX(seq) + 1, 0), ?, ? "
                  "FROM steps WHERE job_id = ? AND idx = ?",
                  (job_id, idx, record["step"], json.dumps(record, ensure_ascii=False), job_id, idx))

    def clear_steps(self, job_id: str, idx: int) -> None:
        """Forget question `idx`'s records (a workflow that starts over after a restart writes them anew)."""
        self._run("DELETE FROM steps WHERE job_id = ? AND idx = ?", (job_id, idx))

    def set_final(self, job_id: str, idx: int, record: dict[str, Any]) -> None:
        self._run("UPDATE questions SET final = ? WHERE job_id = ? AND idx = ?",
                  (json.dumps(record, ensure_ascii=False), job_id, idx))

    def job(self, job_id: str) -> dict[str, Any] | None:
        """{id, state, document_id, error, workflow, created, chat, usage} or None (`workflow` None: a job of a
        database written before version 2, whose workflow was not recorded)."""
        rows = self._run("SELECT id, state, document_id, error, workflow, created, chat, calls, prompt_tokens, "
                         "completion_tokens FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        jid, state, doc, error, workflow, created, chat, calls, p, c = rows[0]
        return dict(id=jid, state=state, document_id=doc, error=error, workflow=workflow, created=created,
                    chat=bool(chat), usage=dict(calls=calls, prompt_tokens=p, completion_tokens=c, total_tokens=p + c))

    def recent(self, limit: int, preview_chars: int = 200) -> list[dict[str, Any]]:
        """The newest `limit` jobs, newest first: {id, state, workflow, created, chat, error, questions (count),
        question (the first one, cut to `preview_chars`)}."""
        rows = self._run("SELECT j.id, j.state, j.workflow, j.created, j.chat, j.error, "
                         "(SELECT COUNT(*) FROM questions q WHERE q.job_id = j.id), "
                         "(SELECT substr(q.question, 1, ?) FROM questions q WHERE q.job_id = j.id AND q.idx = 0) "
                         "FROM jobs j ORDER BY j.created DESC, j.rowid DESC LIMIT ?", (preview_chars, limit))
        return [dict(id=jid, state=state, workflow=wf, created=created, chat=bool(chat), error=error, questions=n,
                     question=q) for jid, state, wf, created, chat, error, n, q in rows]

    def chunk(self, job_id: str, chunk_no: int) -> dict[str, Any] | None:
        """The first memory record (of any question) of chunk number `chunk_no` that holds its text, or None."""
        rows = self._run("SELECT idx, record FROM steps WHERE job_id = ? AND step = ? ORDER BY idx, seq",
                         (job_id, chunk_no))
        for idx, rec in rows:
            r = json.loads(rec)
            if r.get("kind", "memory") == "memory" and isinstance(r.get("chunk_text"), str):
                return dict(r, question_index=idx)
        return None

    def chunks_read(self, job_id: str) -> list[int]:
        """The chunk numbers some memory record of the job holds, ascending."""
        return [r[0] for r in self._run("SELECT DISTINCT step FROM steps WHERE job_id = ? ORDER BY step", (job_id,))]

    def questions(self, job_id: str) -> list[dict[str, Any]]:
        """Each question: {index, question, chunks_total, final (record or None), steps [records, in order]}."""
        qs = self._run("SELECT idx, question, chunks_total, final FROM questions WHERE job_id = ? ORDER BY idx",
                       (job_id,))
        steps = self._run("SELECT idx, record FROM steps WHERE job_id = ? ORDER BY idx, seq", (job_id,))
        by_q: dict[int, list[dict]] = {}
        for idx, rec in steps:
            by_q.setdefault(idx, []).append(json.loads(rec))
        return [dict(index=i, question=q, chunks_total=t, final=json.loads(f) if f else None,
                     steps=by_q.get(i, [])) for i, q, t, f in qs]

    def unfinished(self) -> list[tuple[str, bool]]:
        """(id, made by a chat completion) of the jobs queued or running, oldest first (after a restart)."""
        rows = self._run("SELECT id, chat FROM jobs WHERE state IN (?, ?) ORDER BY created", UNFINISHED)
        return [(r[0], bool(r[1])) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()

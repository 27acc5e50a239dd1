"""An on-disk full-text index of a document's chunks (SQLite FTS5 from Python's standard library, BM25
ranking), so that a workflow can look back into text it has already read (`lookup`) or pick the chunks
worth reading before it reads them (`skim`).

One index per document. Each chunk is one row, written as the document streams: its number, its token
offsets [start, end), its text and its token ids. Nothing is kept in Python, so RAM stays flat in the
document's length (SQLite's page cache is bounded, a few MB); the text lives on disk.

Queries come from the model, so they are untrusted: `search` reads ANY string as plain words. It keeps
the word characters (`\\w`, Unicode), quotes each word as an FTS5 string (so `OR`, `NEAR`, `*`, `text:`
and quotes mean nothing), ORs them, and keeps at most `MAX_TERMS` distinct words. No word: no hit.
Values are always bound as SQL parameters, never formatted into SQL text.

The index lives in a temporary folder, or in a given folder (e.g. the run's), and is removed on close
unless `keep=True`. A temporary folder holds its process's owner lock (`memagent.lock.OwnerLock`), so the
folders of a run killed mid-index (kill -9, out of memory) are removed by the next run that makes one
(`memagent.lock.sweep_dead`). A write that fails (a full disk) is a `ChunkIndexError` naming the folder,
and the partial file is removed.
"""
from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
from array import array
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from memagent.documents.reading import Chunk
from memagent.errors import MemAgentError
from memagent.lock import OwnerLock, sweep_dead

TEMP_PREFIX = "memagent-index-"
MAX_TERMS = 64  # distinct query words searched; a longer query keeps its first 64 (bounds the MATCH cost)
MAX_TERM_CHARS = 64  # a longer "word" (a run of 10 KB of letters) is cut: no real word is that long
_WORD = re.compile(r"\w+")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_SCHEMA = (
    "CREATE TABLE chunks (chunk_no INTEGER PRIMARY KEY, start_token INTEGER NOT NULL, "
    "end_token INTEGER NOT NULL, text TEXT NOT NULL, ids BLOB NOT NULL, source TEXT)",
    # external content: the text is stored once, in `chunks`; the FTS table holds only its inverted index
    "CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='chunk_no')",
)


class ChunkIndexError(MemAgentError, RuntimeError):
    """The index cannot be built here (no FTS5 in this Python's SQLite, a folder that cannot be written)."""


@dataclass(frozen=True)
class Hit:
    """One chunk found in the index."""

    chunk_no: int  # 0-based chunk number (Chunk.index)
    start_token: int  # offset of its first token in the document
    end_token: int  # one past its last token: the chunk is tokens [start_token, end_token)
    text: str
    token_ids: tuple[int, ...]  # [end_token - start_token]
    score: float  # BM25 as SQLite gives it: lower is better (0.0 for a chunk not found by a query)
    source: str | None = None  # the page, chapter or heading it came from (Chunk.source); None for plain text

    def chunk(self) -> Chunk:
        """The chunk as the chunker made it (same number, text, ids, offset and source)."""
        return Chunk(self.chunk_no, self.text, list(self.token_ids), self.start_token, self.source)


def query_terms(query: str) -> list[str]:
    """The plain words of `query`: runs of word characters, distinct, in order, at most MAX_TERMS of them."""
    seen: dict[str, None] = {}
    for m in _WORD.finditer(query if isinstance(query, str) else ""):
        word = m.group()[:MAX_TERM_CHARS].lower()
        if word not in seen:
            seen[word] = None
            if len(seen) == MAX_TERMS:
                break
    return list(seen)


def match_expression(query: str) -> str | None:
    """The FTS5 MATCH expression for `query` as plain words ("w1" OR "w2" ...), or None when it has none.

    A word holds only word characters, so it can hold no double quote; quoting it makes every FTS5
    keyword and operator a plain string."""
    terms = query_terms(query)
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


def check_fts5() -> None:
    """Raise ChunkIndexError when this Python's sqlite3 cannot make an FTS5 table."""
    con = sqlite3.connect(":memory:")
    try:
        con.execute("CREATE VIRTUAL TABLE t USING fts5(text)")
    except sqlite3.OperationalError as exc:
        raise ChunkIndexError(
            f"this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5 full-text search ({exc}); use a Python "
            "whose sqlite3 is built with FTS5 (python.org and most Linux builds are), or --workflow memagent"
        ) from None
    finally:
        con.close()


class ChunkIndex:
    """The chunks of one document in a SQLite FTS5 file.

    folder: where the file goes (made if missing); None: a new temporary folder, removed on close.
    name: the file's name inside `folder` (an existing file of that name is replaced).
    keep: leave the file (and a temporary folder) on close, e.g. to inspect what a run read.
    """

    def __init__(self, folder: str | Path | None = None, *, name: str = "chunks.sqlite", keep: bool = False) -> None:
        check_fts5()
        self.keep = keep
        self._own_folder = folder is None
        self._owner: OwnerLock | None = None
        self._con: sqlite3.Connection | None = None
        self.count = 0  # chunks added
        try:
            if folder is None:
                _sweep_once()
                self.folder = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
                self._owner = OwnerLock(self.folder)
            else:
                self.folder = Path(folder)
            self.folder.mkdir(parents=True, exist_ok=True)
            self.path = self.folder / (_SAFE_NAME.sub("_", name)[:120] or "chunks.sqlite")
            self.path.unlink(missing_ok=True)
            self._con = sqlite3.connect(self.path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            self._discard()
            raise ChunkIndexError(f"cannot make the chunk index in {folder or 'a temporary folder'} ({exc}); "
                                  "give a folder that can be written") from None
        with self._writing():
            con = self._con
            con.execute("PRAGMA journal_mode=OFF")  # a scratch file: no rollback journal, no fsync
            con.execute("PRAGMA synchronous=OFF")
            con.execute("PRAGMA cache_size=-2048")  # page cache at most 2 MiB, whatever the document's length
            for statement in _SCHEMA:
                con.execute(statement)
            con.execute("BEGIN")

    # -- writing --------------------------------------------------------------------------
    def add(self, chunk: Chunk) -> None:
        """Write one chunk (its number, offsets, text and ids); visible to `search` at once."""
        con = self._open()
        end = chunk.start_token + len(chunk.token_ids)
        ids = array("q", chunk.token_ids).tobytes()
        with self._writing():
            con.execute("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?)",
                        (chunk.index, chunk.start_token, end, chunk.text, ids, chunk.source))
            con.execute("INSERT INTO chunks_fts (rowid, text) VALUES (?, ?)", (chunk.index, chunk.text))
        self.count += 1

    def add_all(self, chunks: Iterable[Chunk]) -> int:
        """`add` each chunk of a stream (one at a time: the stream is never held); the number added."""
        n = 0
        for chunk in chunks:
            self.add(chunk)
            n += 1
        return n

    # -- reading --------------------------------------------------------------------------
    def search(self, query: str, k: int, exclude: Iterable[int] = ()) -> list[Hit]:
        """The at most `k` best chunks for `query` read as plain words (module doc), best first (BM25, then
        chunk number), leaving out the chunk numbers in `exclude`. Any string is a valid query."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        expr = match_expression(query)
        if expr is None:
            return []
        skip = set(exclude)
        rows = self._open().execute(
            "SELECT c.chunk_no, c.start_token, c.end_token, c.text, c.ids, bm25(chunks_fts) AS score, c.source "
            "FROM chunks_fts JOIN chunks AS c ON c.chunk_no = chunks_fts.rowid "
            "WHERE chunks_fts MATCH ? ORDER BY score, c.chunk_no LIMIT ?", (expr, k + len(skip)))
        return [h for h in map(_hit, rows) if h.chunk_no not in skip][:k]

    def get(self, chunk_no: int) -> Hit:
        """The chunk numbered `chunk_no` (KeyError when there is none)."""
        row = self._open().execute("SELECT chunk_no, start_token, end_token, text, ids, 0.0, source FROM chunks "
                                   "WHERE chunk_no = ?", (int(chunk_no),)).fetchone()
        if row is None:
            raise KeyError(chunk_no)
        return _hit(row)

    def first(self, n: int, exclude: Iterable[int] = ()) -> list[int]:
        """The numbers of the first `n` chunks in document order, leaving out those in `exclude`."""
        skip = set(exclude)
        rows = self._open().execute("SELECT chunk_no FROM chunks ORDER BY chunk_no LIMIT ?", (n + len(skip),))
        return [no for (no,) in rows if no not in skip][:n]

    def __iter__(self) -> Iterator[Hit]:
        """Every chunk in document order (one row at a time)."""
        cur = self._open().execute("SELECT chunk_no, start_token, end_token, text, ids, 0.0, source FROM chunks "
                                   "ORDER BY chunk_no")
        return map(_hit, cur)

    def __len__(self) -> int:
        return self.count

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the file; remove it (and a temporary folder) unless `keep`. Safe to call twice."""
        if self._con is None:
            return
        if self.keep and self._con.in_transaction:
            with self._writing():
                self._con.execute("COMMIT")
        if self.keep:
            self._con.close()
            self._con = None
            if self._owner is not None:
                self._owner.release(keep_folder=True)  # kept on purpose: no later run's sweep removes it
            return
        self._discard()

    def _discard(self) -> None:
        """Close without committing and remove the file (and a temporary folder with its owner lock)."""
        con, self._con = self._con, None
        if con is not None:
            con.close()
        if self._own_folder and getattr(self, "folder", None) is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        elif getattr(self, "path", None) is not None:
            self.path.unlink(missing_ok=True)
        if self._owner is not None:
            self._owner.release()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write to the file: a SQLite error (a full disk: SQLITE_FULL) removes the partial index and
        becomes a ChunkIndexError naming the folder."""
        try:
            yield
        except sqlite3.Error as exc:
            self._discard()
            code = getattr(exc, "sqlite_errorcode", None)  # SQLITE_FULL is 13
            full = code == getattr(sqlite3, "SQLITE_FULL", 13) or "full" in str(exc).lower()
            what = "no space left on the device" if full else f"the write failed ({exc})"
            raise ChunkIndexError(f"cannot write the chunk index in {self.folder}: {what}; free some space, or "
                                  "give the workflow an index_dir on a disk with room (the index takes about "
                                  "4 times the document's size)") from None

    @property
    def closed(self) -> bool:
        return self._con is None

    def _open(self) -> sqlite3.Connection:
        if self._con is None:
            raise ValueError("the chunk index is closed")
        return self._con

    def __enter__(self) -> "ChunkIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a document dropped mid-run (an error) still removes its file
        try:
            self.close()
        except Exception:
            pass


_swept: list[bool] = []  # the sweep of the temp folder runs once per process


def _sweep_once() -> None:
    """Remove the temp index folders of dead runs (`memagent.lock.sweep_dead`), once per process."""
    if not _swept:
        _swept.append(True)
        sweep_dead(Path(tempfile.gettempdir()), TEMP_PREFIX)


def _hit(row: tuple) -> Hit:
    no, start, end, text, blob, score, source = row
    ids = array("q")
    ids.frombytes(blob)
    return Hit(no, start, end, text, tuple(ids), float(score), source)

"""The results file of a sweep (`results.jsonl`): which records are there already (resume), appending a record
durably, and the cap on the failures of one run.

The file is append-only during a sweep, one JSON record a line, each flushed and fsynced before the next is
written, so a crash loses at most a torn last line (dropped on the next open, `memagent.eval.records`). The last
record of a key wins: a retried failure is appended after its error record.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Callable

from memagent.eval.baselines import EvalError
from memagent.eval.records import failures_message, latest, load_records, rescore_stale
from memagent.eval.scoring import ScoreOptions

__all__ = ["ResultsFile", "append_record"]


def append_record(fh: IO[str], rec: dict) -> None:
    """Write `rec` as one JSON line to `fh` and make it durable (flush, fsync) before returning."""
    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


class ResultsFile:
    """`path` opened for a run of the sweep: `done` (key -> latest record) holds what is there, rescored first
    when it was scored under other `scoring` options; `append` adds a record; `failed` holds this run's error
    records and `max_failures` (None: no cap) stops the run once it has that many.

    Use as a context manager (`with ResultsFile(path, scoring) as results:`): reading happens on construction (a
    torn last line is removed from the file then); the file is opened for appending at the first record, so a run
    stopped before any (its settings checked and refused) leaves no new file; a clean exit creates it empty when
    no record was written.
    """

    def __init__(self, path: str | Path, scoring: ScoreOptions, max_failures: int | None = None,
                 on_record: Callable[[dict], None] | None = None) -> None:
        self.path = Path(path)
        self.max_failures = max_failures
        self.on_record = on_record  # called after each record is on disk (a progress line, a caller's hook)
        self.done: dict[str, dict] = latest(load_records(self.path))
        rescore_stale(self.path, self.done, scoring)
        self.failed: list[dict] = []
        self._fh: IO[str] | None = None
        self._open = False

    def __enter__(self) -> "ResultsFile":
        self._open = True
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self._open = False
        if self._fh is None and kind is None:
            self._fh = open(self.path, "a", encoding="utf-8")  # a finished run leaves its (maybe empty) file
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def append(self, rec: dict) -> None:
        """`rec` on disk (fsynced), in `done`, passed to `on_record`, and counted in `failed` when an error."""
        if not self._open:
            raise RuntimeError("ResultsFile.append outside its `with` block")
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")
        append_record(self._fh, rec)
        self.done[rec["key"]] = rec
        if self.on_record is not None:
            self.on_record(rec)
        if rec["status"] == "error":
            self.failed.append(rec)

    def append_all(self, records: list[dict]) -> None:
        """Append each of `records` (one unit's, or one streamed sample's), then check the failure cap."""
        for rec in records:
            self.append(rec)
        self.check_failures()

    def check_failures(self) -> None:
        """An EvalError (naming the last failure and the file) once this run has `max_failures` error records."""
        if self.max_failures is not None and len(self.failed) >= self.max_failures:
            raise EvalError(failures_message(self.failed, self.max_failures, self.path))

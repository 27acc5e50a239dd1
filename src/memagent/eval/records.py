"""The records of `memagent eval`: their keys, the settings fingerprint, reading and rescoring `results.jsonl`.

A record's key is the sha256 (first 32 hex digits) of the canonical JSON of
`[model, method, data path (resolved), data sha256, sample id, repeat, fingerprint]`, so two data files of one
name in different folders, a regenerated data file, another repeat or a changed setting never share a key.
The fingerprint is the sha256 of the canonical JSON of `dataclasses.asdict(SweepConfig)` minus the fields in
`NON_RESULT` (they change how fast or how much is run, not a sample's result). Fields added to `SweepConfig`
or `AgentConfig` later are in the fingerprint unless they are listed there.

A record is a sample's result (`status: "ok"`) or its failure (`status: "error"`, with
`error: {kind, message, attempts}`). `results.jsonl` is append-only during a sweep; the last record of a key
wins (a retried failure is appended after its error record).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from memagent.agent.answer import final_answer
from memagent.bounded import loads_json
from memagent.errors import MemAgentError
from memagent.eval.baselines import EvalError
from memagent.eval.scoring import ScoreOptions, canonical_metric, failed_score, score_sample
from memagent.io import atomic_write_lines as io_write_lines
from memagent.jsonl import trim_torn_tail
from memagent.documents import DocumentError, check_document
from memagent.tasks.schema import file_sha256, read_samples

log = logging.getLogger(__name__)

__all__ = ["MAX_LENGTH", "NON_RESULT", "check_record", "DataFile", "atomic_write_lines", "data_file", "failures_message", "fingerprint", "latest", "load_records",
           "record_key", "record_length", "rescore_file", "rescore_record", "rescore_stale", "sample_ids"]

MAX_LENGTH = 10**15  # the largest sample length (documents, tokens, chunks) a table column may hold

# Settings that never change a sample's result: {SweepConfig field: None (drop it) or {subfield: None}}.
NON_RESULT: dict[str, Any] = {
    "model_name": None,  # in the key itself
    "methods": None,  # the method is in the key itself
    "limit": None,  # how many samples, not what each scores
    "repeats": None,  # the repeat index is in the key; its seed is agent.seed + repeat
    "scoring": None,  # applied to the stored replies; a change rescores without a model call
    "agent": {"max_batch_docs": None},  # batch size: speed only
    "workflows": None,  # each workflow's options: folded into its own record fingerprint (eval.workflow_runs)
    "rewards": None,  # values computed from the replies (eval.rewards), like the scores
}


@dataclass(frozen=True)
class DataFile:
    """A data file's full identity: its resolved path and the sha256 of its bytes."""

    path: str  # resolved absolute path
    sha256: str
    name: str  # the file name, for tables and messages


def data_file(path: str | Path) -> DataFile:
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"data file {p} does not exist; make one with `memagent data ...`")
    return DataFile(str(p.resolve()), file_sha256(p), p.name)


def sample_ids(path: str | Path, limit: int | None = None) -> list[str]:
    """The ids of the first `limit` samples of a data file; a duplicate id or an unknown metric is an error
    naming the file and the sample."""
    seen: dict[Any, int] = {}
    for n, sample in enumerate(read_samples(path)):
        if limit is not None and n >= limit:
            break
        sid = sample["id"]
        try:
            canonical_metric(sample.get("metric", "sub_em"))
        except MemAgentError as exc:
            raise EvalError(f"{path}: sample {n + 1} (id {sid!r}): {exc}") from None
        for name in ("task", "question"):
            if not isinstance(sample[name], str):
                raise EvalError(f"{path}: sample {n + 1} (id {sid!r}): {name} must be text, got {sample[name]!r}")
        if not all(isinstance(a, str) for a in sample["answers"]):
            raise EvalError(f"{path}: sample {n + 1} (id {sid!r}): answers must be a list of texts")
        length = record_length(sample)[0]
        if length is not None and (not isinstance(length, int) or isinstance(length, bool)
                                   or not 0 <= length <= MAX_LENGTH):
            raise EvalError(f"{path}: sample {n + 1} (id {sid!r}): its length (length, num_docs or num_chunks) "
                            f"must be an integer in [0, {MAX_LENGTH}], got {str(length)[:40]}")
        if not isinstance(sid, (str, int)) or isinstance(sid, bool):
            raise EvalError(f"{path}: sample {n + 1} has id {sid!r}; an id must be a string or an integer")
        if "document" in sample:  # a PDF, HTML or EPUB file is checked here, before any model call
            try:
                check_document(sample["document"])
            except DocumentError as exc:
                raise EvalError(f"{path}: sample {n + 1} (id {sid!r}): {exc}") from None
        if sid in seen:
            raise EvalError(f"{path}: sample id {sid!r} occurs twice (samples {seen[sid] + 1} and {n + 1}); "
                            f"ids must be unique within a data file")
        seen[sid] = n
    return list(seen)


def _strip(values: dict[str, Any], drop: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if k in drop and drop[k] is None:
            continue
        out[k] = _strip(v, drop[k]) if k in drop and isinstance(v, dict) else v
    return out


def fingerprint(cfg: Any) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of `asdict(cfg)` minus `NON_RESULT`."""
    values = _strip(dataclasses.asdict(cfg), NON_RESULT)
    text = json.dumps(values, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def record_key(model: str, method: str, data: DataFile, sample_id: Any, repeat: int, fp: str) -> str:
    parts = [model, method, data.path, data.sha256, sample_id, repeat, fp]
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def load_records(path: str | Path) -> list[dict]:
    """Every record of a results file in order, each read bounded (`memagent.bounded`) and its fields checked
    (`check_record`); a last line cut short by a crash is removed from the file."""
    path = Path(path)
    if not path.exists():
        return []
    data = trim_torn_tail(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EvalError(f"{path} is not UTF-8 text; move the file away to start over") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            where = f"{path}:{n}"
            records.append(check_record(loads_json(line, where, _DamagedRecord), where))
    return records


class _DamagedRecord(EvalError):
    """A line of results.jsonl that is not a record of ours; the message says how to start over."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; the results file is damaged: fix or delete that line, or move the file "
                         "away to start over")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# field -> (check, what it must be): the fields the table, summary and rescoring read
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "key": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "status": (lambda v: v in ("ok", "error"), '"ok" or "error"'),
    "model": (lambda v: isinstance(v, str), "a string"),
    "method": (lambda v: isinstance(v, str), "a string"),
    "task": (lambda v: isinstance(v, str), "a string"),
    "metric": (lambda v: isinstance(v, str), "a metric name"),
    "length_unit": (lambda v: isinstance(v, str), "a string"),
    "data": (lambda v: isinstance(v, str), "a string"),
    "data_path": (lambda v: isinstance(v, str), "a string"),
    "sample_id": (lambda v: isinstance(v, str) or _is_int(v), "a string or an integer"),
    "repeat": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "length": (lambda v: v is None or (_is_int(v) and 0 <= v <= MAX_LENGTH), f"null or an integer in [0, {MAX_LENGTH}]"),
    "score": (lambda v: v is None or _is_number(v), "a number or null"),
    "scores": (lambda v: isinstance(v, dict) and all(_is_number(x) for x in v.values()), "an object of numbers"),
    "raw": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "prediction": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "gold": (lambda v: isinstance(v, list) and all(isinstance(g, str) for g in v), "a list of strings"),
    "scoring": (lambda v: isinstance(v, dict), "an object"),
    "answer_protocol": (lambda v: isinstance(v, str), "a string"),
    "think": (lambda v: isinstance(v, str), "a string"),
}
_REQUIRED = ("key", "model", "method", "task", "metric", "score")
_ERROR_FIELDS = {"kind": str, "message": str}


def check_record(rec: Any, where: str) -> dict:
    """`rec` when it is a record of ours whose fields have the types the readers use; else an EvalError naming
    `where` (FILE:LINE) and the field. An error record must carry its `error` {kind, message, attempts?}."""
    if not isinstance(rec, dict):
        raise _DamagedRecord(f"{where}: not a result record (a JSON object expected, got {type(rec).__name__})")
    for name in _REQUIRED:
        if name not in rec:
            raise _DamagedRecord(f"{where}: not a result record (no {name!r})")
    for name, (ok, what) in _FIELDS.items():
        if name in rec and not ok(rec[name]):
            raise _DamagedRecord(f"{where}, field {name!r}: must be {what}, got {str(rec[name])[:60]!r}")
    if rec.get("status") == "error":
        err = rec.get("error")
        if not isinstance(err, dict):
            raise _DamagedRecord(f"{where}, field 'error': an error record needs its error {{kind, message}}, "
                                 f"got {str(err)[:60]!r}")
        for name, kind in _ERROR_FIELDS.items():
            if not isinstance(err.get(name), kind):
                raise _DamagedRecord(f"{where}, field 'error.{name}': must be a string, got {str(err.get(name))[:60]!r}")
        if "attempts" in err and not (_is_int(err["attempts"]) and err["attempts"] >= 0):
            raise _DamagedRecord(f"{where}, field 'error.attempts': must be an integer >= 0")
    return rec


def latest(records: Iterable[dict]) -> dict[str, dict]:
    """The last record of each key, in the order the keys first appear."""
    out: dict[str, dict] = {}
    for rec in records:
        out[rec["key"]] = rec
    return out


def rescore_record(rec: dict, options: ScoreOptions) -> dict:
    """The record scored anew from its stored raw reply under `options` (no model call)."""
    rec = dict(rec)
    if rec.get("status", "ok") == "error":
        rec["score"], rec["scores"] = failed_score(options), {}
    else:
        raw = rec.get("raw")
        # the answer protocol and think handling the record was made with (records before them: boxed, strip)
        protocol, think = rec.get("answer_protocol", "boxed"), rec.get("think", "strip")
        rec["prediction"] = final_answer(raw, protocol, think)[0] if isinstance(raw, str) else None
        rec["score"], rec["scores"] = score_sample(rec["metric"], rec["prediction"], rec["gold"], options)
    rec["scoring"] = dataclasses.asdict(options)
    return rec


def atomic_write_lines(path: str | Path, lines: Iterable[str]) -> Path:
    """Write `lines` to `path` atomically and fsynced (`memagent.io.atomic_write_lines`): a reader sees the
    old file or the new one, never half of one; a device is written in place, a symlink followed."""
    return io_write_lines(path, lines, fsync=True)


def _lines(records: Iterable[dict]) -> Iterator[str]:
    for rec in records:
        yield json.dumps(rec, ensure_ascii=False) + "\n"


def rescore_file(path: str | Path, options: ScoreOptions) -> list[dict]:
    """Rescore every record of `path` in place (atomically); returns the records as now written."""
    new = [rescore_record(r, options) for r in load_records(path)]
    atomic_write_lines(path, _lines(new))
    return new


def record_length(sample: dict) -> tuple[int | None, str]:
    """The sample's column in the table: its `length`, else its documents, else its chunks (toy data)."""
    if sample.get("length") is not None:
        return sample["length"], sample.get("length_unit", "docs")
    if sample.get("num_docs") is not None:
        return sample["num_docs"], "docs"
    if sample.get("num_chunks") is not None:
        return sample["num_chunks"], "chunks"
    return None, sample.get("length_unit", "docs")


def rescore_stale(results: Path, records: dict[str, dict], scoring: ScoreOptions) -> None:
    """Records scored under other ScoreOptions are rescored from their stored replies (no model call)."""
    want = dataclasses.asdict(scoring)
    if any(r.get("scoring", want) != want for r in records.values()):
        log.warning("rescoring %s under the current scoring options", results)
        records.update(latest(rescore_file(results, scoring)))


def failures_message(failed: list[dict], limit: int, results: Path) -> str:
    last = failed[-1]
    return (f"stopped after {len(failed)} failed sample(s) (--max-failures {limit}); the last: {last['method']} "
            f"{last['data']} sample {last['sample_id']!r}: {last['error']['kind']}: {last['error']['message']}. "
            f"The error records (status \"error\") are in {results}; fix the cause and rerun with --retry-failed")

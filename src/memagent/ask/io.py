"""`memagent ask`'s files: the `--input` records read and checked by the one sample reader, the outputs checked before any
model call, and `--output` written one result a line as each finishes (a rerun skips the ids already there).

Result line (one JSON object): id, question, answer (the boxed content or null), raw_answer, memory,
num_chunks. Lines come in the order the documents finish, not the input order. A document whose model calls
failed (after the backend's retries) has a line with answer null and error {kind, message, attempts}; a
rerun tries it again (its later line wins).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from memagent.agent.workflow import AgentInput, AgentResult
from memagent.documents import DocumentError, check_document
from memagent.errors import InputError
from memagent.io import check_output_file, check_side_files, existing_files, is_sink
from memagent.jsonl import iter_jsonl, trim_torn_tail
from memagent.lock import lock_path_for
from memagent.tasks.base import DataError
from memagent.tasks.released import check_context, check_lazy, check_text
from memagent.tasks.schema import read_samples, sample_document


def read_inputs(path: Path, errors: str = "strict") -> list[AgentInput]:
    """The questions of `ask --input`, read by the one sample reader (`memagent.tasks.schema.read_samples`).

    A record is {id?, question, context | document (a path, relative to the input file), memory? (to start
    from, e.g. the final memory of an earlier run over the text before)}; answers and task are not needed.
    Every field's type is checked, with the messages `eval` gives for the same fields; document files must
    exist, and ids must be unique (a rerun skips the ids already answered). A record without an id takes its
    line number. A document may be plain text, PDF, HTML or EPUB (memagent.documents, told apart by content);
    each is checked here, before any model call (`errors`: the --errors of its text).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"input file not found: {path}")
    if not path.is_file():
        raise InputError(f"--input {path} is a folder; give a JSONL file")
    items = []
    for sample in read_samples(path, check=_ask_record(path, errors)):
        document = sample["document"] if "document" in sample else sample_document(sample)
        items.append(AgentInput(sample["question"], document, str(sample["id"]), sample.get("memory")))
    return items


def _ask_record(path: Path, errors: str = "strict") -> Callable[[dict, Callable[[str | None], str]], dict]:
    """The check of one `ask --input` record (fields shared with eval's samples are checked as eval does);
    returns the record with its id (default: its line number) and its document as a resolved Path."""
    def check(rec: dict, where: Callable[[str | None], str]) -> dict:
        if "question" not in rec:
            raise DataError(f"{where(None)}: sample lacks question")
        check_text(rec["question"], where, "question")
        rec = dict(rec, id=rec.get("id", where(None)[len(str(path)):].lstrip(": ")))
        if isinstance(rec["id"], bool) or not isinstance(rec["id"], (str, int)):
            raise DataError(f"{where('id')}: must be a string or an integer, got {rec['id']!r}")
        if "context" in rec and "document" in rec:
            raise DataError(f"{where(None)}: give 'context' (text) or 'document' (a file path), not both")
        if "context" in rec:
            if not isinstance(check_context(rec["context"], where), str):
                raise DataError(f"{where('context')}: must be the document text (index lists belong in 'lazy')")
        elif "document" in rec:
            rec["document"] = _document_path(rec["document"], path, where, errors)
        elif "lazy" in rec:
            check_lazy(rec["lazy"], where)
        else:
            raise DataError(f"{where(None)}: needs 'context' (text) or 'document' (a file path)")
        if rec.get("memory") is not None and not isinstance(rec["memory"], str):
            raise DataError(f"{where('memory')}: the memory to start from must be a string")
        return rec

    return check


def _document_path(name: Any, path: Path, where: Callable[[str | None], str], errors: str = "strict") -> Path:
    """The file a record's 'document' names (relative to the input file); it must exist, and a PDF, HTML or EPUB
    file must pass its checks (memagent.documents.check_document)."""
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"{where('document')}: must be a file path (a string)")
    doc = Path(name) if Path(name).is_absolute() else path.parent / name
    if not doc.is_file():
        raise DataError(f"{where('document')}: document {doc} {'is a folder' if doc.is_dir() else 'not found'}; "
                        "'document' is a file path (text, PDF, HTML or EPUB), relative to the input file")
    try:
        check_document(doc, errors)
    except DocumentError as e:
        raise DataError(f"{where('document')}: {e}") from None
    return doc


def check_ask_outputs(output: Optional[Path], trace: Optional[Path], model: str, inputs: dict[str, Any]) -> None:
    """Before any model call and before anything is written or trimmed: --output and --trace writable, apart,
    and none of the inputs (the --input file, the documents, --profile, the model's own files); the side files
    of --output (its X.profile.yaml and its lock) none of them either; an existing --output a result file of
    an earlier run. A sink (/dev/null, a FIFO) is written in place, without side files."""
    guarded = dict(inputs)
    guarded.update({f"model file {f.name}": f for f in existing_files(model)})
    if output is not None:
        check_output_file(output, "--output", {**guarded, "--trace": trace})
        if not is_sink(output):
            check_side_files({f"--output (its profile {profile_path_for(output).name})": profile_path_for(output),
                              f"--output (its lock {lock_path_for(output).name})": lock_path_for(output)},
                             {**guarded, "--trace": trace, "--output": output})
            check_result_file(output)
    if trace is not None:
        check_output_file(trace, "--trace", guarded)


def profile_path_for(output: Path) -> Path:
    """Where the resolved profile of `ask --output X` goes: beside X, as X's stem + .profile.yaml."""
    return output.with_name(output.stem + ".profile.yaml")


def check_result_file(path: Path) -> None:
    """An existing --output must be JSONL of `memagent ask` results (a rerun appends to it and skips the ids
    there): every whole line a record with an 'id', and a last line without its newline (a run killed
    mid-write, trimmed when the run starts) the start of one. Checked before the trim, so a file of notes is
    refused untouched."""
    if not path.is_file():
        return
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    hint = "a rerun appends to --output, so give a new file or one an earlier run wrote"
    if data[keep:].strip() and not data[keep:].lstrip().startswith(b"{"):
        raise InputError(f"--output {path} is not a JSONL file of `memagent ask` results (its last line is not a "
                         f"JSON record); {hint}")
    for n, raw in enumerate(data[:keep].splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict) or "id" not in rec:
            raise InputError(f"{path}:{n}: not a result line of `memagent ask` (a JSON record with an 'id'); {hint}")


def document_inputs(items: list[AgentInput]) -> dict[str, Any]:
    """{what: path} of the document files among `items`, for the output checks."""
    return {f"the document of id {it.doc_id!r}": it.document for it in items if isinstance(it.document, Path)}


class ResultLog:
    """Where `ask --input` writes results: a JSONL file appended to (a rerun resumes), or stdout.

    Opening an existing file trims a torn last line (a run killed mid-write) and reads the ids already
    answered; `write` flushes each result at once.
    """

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.done: set[str] = set()
        self.written = self.failed = 0  # results written by this run, and how many of them are failures
        self.first_failure = ""  # "id 'b': why", of the first failure written
        self._f: Optional[TextIO] = None
        if path is not None and path.exists() and not is_sink(path):  # a sink holds nothing to resume from
            self.done = _done_ids(path)

    def open(self) -> "ResultLog":
        if self.path is None:
            self._f = sys.stdout
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
        return self

    def write(self, r: AgentResult) -> None:
        assert self._f is not None, "open() first"
        rec = dict(id=r.doc_id, question=r.question, answer=r.answer, raw_answer=r.raw_answer,
                   memory=r.memory, num_chunks=r.num_chunks)
        if r.error is not None:
            rec["error"] = r.error
            self.failed += 1
            self.first_failure = self.first_failure or f"id {r.doc_id!r}: {r.error['message']}"
        self.written += 1
        line = json.dumps(rec, ensure_ascii=False)
        try:
            self._f.write(line + "\n")
            self._f.flush()
        except OSError as e:  # e.g. the disk is full: name the file (a rerun trims the torn line and resumes)
            if e.filename is None and self.path is not None:
                e.filename = str(self.path)
            raise

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None and self.path is not None:
            try:
                f.close()  # flushes what a failed write left in the buffer: that error names the file too
            except OSError as e:
                if e.filename is None:
                    e.filename = str(self.path)
                raise

    def __enter__(self) -> "ResultLog":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _done_ids(path: Path) -> set[str]:
    """The ids in an earlier `--output`; a torn last line (no newline at the end) is cut off the file."""
    trim_torn_tail(path)
    done = set()
    for n, rec in iter_jsonl(path, InputError):
        if not isinstance(rec, dict) or "id" not in rec:
            raise InputError(f"{path}:{n}: not a result line of `memagent ask` (no 'id'); a rerun appends to "
                             "--output, so give a new file or one an earlier run wrote")
        if rec.get("error") is None:  # a failed document is tried again
            done.add(str(rec["id"]))
        else:
            done.discard(str(rec["id"]))
    return done


class DocumentsFailed(InputError):
    """Some documents of `ask --input` failed (their error lines are written); the run exits non-zero."""


def failures_error(log: ResultLog, total: int) -> DocumentsFailed:
    """The error `ask --input` ends with when documents failed: how many, the first, where to look."""
    where = str(log.path) if log.path is not None else "the output"
    return DocumentsFailed(f"{log.failed} of {total} documents failed (first: {log.first_failure}); see their lines "
                           f"with \"error\" in {where}; fix the cause and rerun the same command to retry them")

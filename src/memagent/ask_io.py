"""`memagent ask`'s files: the `--input` JSONL read and checked line by line, the outputs checked before any
model call, and `--output` written one result a line as each finishes (a rerun skips the ids already there).

Result line (one JSON object): id, question, answer (the boxed content or null), raw_answer, memory,
num_chunks. Lines come in the order the documents finish, not the input order.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, TextIO

from memagent.agent.workflow import AgentInput, AgentResult
from memagent.errors import InputError
from memagent.io import check_output_file, existing_files
from memagent.jsonl import iter_jsonl, trim_torn_tail


def read_jsonl_inputs(path: Path) -> list[AgentInput]:
    """Lines of {id?, question, context | document (a path, relative to the JSONL file), memory? (to start
    from, e.g. the final memory of an earlier run over the text before)}; every field's type is checked,
    document files must exist, and ids must be unique (a rerun skips the ids already answered)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"input file not found: {path}")
    if not path.is_file():
        raise InputError(f"--input {path} is a folder; give a JSONL file")
    items: list[AgentInput] = []
    seen: dict[str, int] = {}
    for n, rec in iter_jsonl(path, InputError):
        item = _input_of(rec, path, n)
        if item.doc_id in seen:
            raise InputError(f"{path}:{n}: id {item.doc_id!r} repeats line {seen[item.doc_id]}; ids must be unique "
                             "(results are matched to questions by id)")
        seen[item.doc_id] = n
        items.append(item)
    return items


def _input_of(rec: Any, path: Path, n: int) -> AgentInput:
    where = f"{path}:{n}"
    if not isinstance(rec, dict) or "question" not in rec:
        raise InputError(f"{where}: each line needs a 'question' field")
    if not isinstance(rec["question"], str):
        raise InputError(f"{where}: 'question' must be a string, got {type(rec['question']).__name__}")
    if "context" in rec and "document" in rec:
        raise InputError(f"{where}: give 'context' (text) or 'document' (a file path), not both")
    if "context" in rec:
        doc: Any = rec["context"]
        if not isinstance(doc, str):
            raise InputError(f"{where}: 'context' must be a string (the document's text), got {type(doc).__name__}")
    elif "document" in rec:
        name = rec["document"]
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"{where}: 'document' must be a file path (a string)")
        doc = Path(name) if Path(name).is_absolute() else path.parent / name
        if not doc.is_file():
            raise InputError(f"{where}: document {doc} {'is a folder' if doc.is_dir() else 'not found'}; "
                             "'document' is a text file path, relative to the JSONL file")
    else:
        raise InputError(f"{where}: each line needs 'context' (text) or 'document' (a file path)")
    memory = rec.get("memory")
    if memory is not None and not isinstance(memory, str):
        raise InputError(f"{where}: 'memory' (the memory to start from) must be a string")
    doc_id = rec.get("id", n)
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise InputError(f"{where}: 'id' must be a string or an integer, got {type(doc_id).__name__}")
    return AgentInput(rec["question"], doc, str(doc_id), memory)


def check_ask_outputs(output: Optional[Path], trace: Optional[Path], model: str, inputs: dict[str, Any]) -> None:
    """Before any model call: --output and --trace writable, apart, and none of the inputs (the --input file,
    the documents, the model's own files)."""
    guarded = dict(inputs)
    guarded.update({f"model file {f.name}": f for f in existing_files(model)})
    if output is not None:
        check_output_file(output, "--output", {**guarded, "--trace": trace})
    if trace is not None:
        check_output_file(trace, "--trace", guarded)


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
        self._f: Optional[TextIO] = None
        if path is not None and path.exists():
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
        line = json.dumps(dict(id=r.doc_id, question=r.question, answer=r.answer, raw_answer=r.raw_answer,
                               memory=r.memory, num_chunks=r.num_chunks), ensure_ascii=False)
        try:
            self._f.write(line + "\n")
            self._f.flush()
        except OSError as e:  # e.g. the disk is full: name the file (a rerun trims the torn line and resumes)
            if e.filename is None and self.path is not None:
                e.filename = str(self.path)
            raise

    def close(self) -> None:
        if self._f is not None and self.path is not None:
            self._f.close()
        self._f = None

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
        done.add(str(rec["id"]))
    return done

"""The common sample record of every synthetic task, its JSONL files, and token counting.

One sample is one JSON object on one line:

    id        str        unique within the file, e.g. "ruler_hqa-docs50-0003"
    task      str        "ruler_hqa", "niah_single_1", "vt", ... (see `memagent.tasks.ruler.TASKS`)
    question  str        the problem put to the model
    answers   list[str]  gold answers (alternatives for QA; all required values for RULER tasks)
    metric    str        the score the task is judged by (a `memagent.tasks.metrics.METRICS` name)
    length    int        the target the sample was built for (a column of the results table) ...
    length_unit str      ... in "docs" (number of documents) or "tokens" (under `tokenizer`)
    num_docs  int        number of documents in the context (document tasks only)
    num_tokens int|None  token count of the context under `tokenizer` (None when not measured)
    tokenizer str|None   the tokenizer name the lengths were measured with
    context   str        the document text, OR a file (below), OR, for very long samples, instead:
    document  str        a file path (relative to the data file): text, PDF, HTML or EPUB (memagent.documents,
                         told apart by content), read as a stream like any path
    lazy      dict       {"kind": "paragraphs", "format": "hotpotqa", "source": path,
                          "sha256": ..., "doc_ids": [...]}
                         the document is rebuilt as a stream of text blocks from the source file
                         (`sample_document`), so a multi-million-token sample is never held whole

    evidence  list[str]  optional: gold supporting strings (the toy facts, RULER's queried needles, HotpotQA's
                         supporting sentences); the `evidence` step reward pays a memory update for holding them
    distractors list[str] optional: strings shaped like evidence that answer another question (RULER's needles
                         under keys not asked for); `memagent data warmup --keep-distractors` keeps them too

Extra fields a task adds (gold document positions, the needles, ...) ride along unchanged.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterator

from memagent.backends.tokenizer import load_tokenizer
from memagent.tasks.base import LAZY_DOC_THRESHOLD, DataError, count_tokens, file_sha256, write_samples
from memagent.tasks.corpora import LOADERS, paragraph_table
from memagent.tasks.documents import document_block
from memagent.tasks.metrics import METRIC_ALIASES, METRICS
from memagent.tasks.released import (check_answers, check_context, check_evidence, check_lazy, check_text,
                                     read_released, sniff_format)

__all__ = [
    "DataError",
    "LAZY_DOC_THRESHOLD",
    "check_sample",
    "ParagraphCache",
    "count_tokens",
    "file_sha256",
    "import_released",
    "load_tokenizer",
    "read_samples",
    "sample_document",
    "write_samples",
]

_REQUIRED = ("id", "question", "answers")
DEFAULT_TASK = "qa"  # the task of a record without one (training files often have none); eval groups by it


def check_sample(sample: Any, where: Callable[[str | None], str], base: Path | None = None) -> dict:
    """Check the types of one of our sample records where it enters; `where(field)` names the place. `base`: the
    folder a `document` path is relative to (the data file's); the path is made absolute here."""
    if not isinstance(sample, dict):
        raise DataError(f"{where(None)}: a sample must be a JSON object, got {type(sample).__name__}")
    missing = [k for k in _REQUIRED if k not in sample]
    if missing:
        raise DataError(f"{where(None)}: sample lacks {', '.join(missing)}")
    sample.setdefault("task", DEFAULT_TASK)
    if not isinstance(sample["id"], (str, int)) or isinstance(sample["id"], bool):
        raise DataError(f"{where('id')}: must be a string or an integer, got {sample['id']!r}")
    check_text(sample["question"], where, "question")
    check_text(sample["task"], where, "task")
    check_answers(sample["answers"], where, "answers")
    if "context" in sample:
        if not isinstance(check_context(sample["context"], where), str):
            raise DataError(f"{where('context')}: must be the document text (index lists belong in 'lazy')")
    elif "document" in sample:
        sample["document"] = document_file(sample["document"], base, where)
    elif "lazy" in sample:
        check_lazy(sample["lazy"], where)
    else:
        raise DataError(f"{where(None)}: sample {sample['id']!r} has neither 'context', 'document' nor a 'lazy' object")
    if "evidence" in sample:
        check_evidence(sample["evidence"], where)
    metric = sample.get("metric")
    if metric is not None:
        if not isinstance(metric, str):
            raise DataError(f"{where('metric')}: must be a metric name (a string), got {type(metric).__name__}; "
                            f"choose one of: {', '.join(METRICS)}")
        if metric not in METRICS and metric not in METRIC_ALIASES:
            raise DataError(f"{where('metric')}: unknown metric {metric!r}; choose one of: {', '.join(METRICS)}")
    return sample


def document_file(name: Any, base: Path | None, where: Callable[[str | None], str]) -> str:
    """The absolute path of a sample's `document` file (relative to `base`); it must be a file. Its contents are
    checked by `memagent.documents.check_document` before any model call (eval's `sample_ids`)."""
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"{where('document')}: must be a file path (a string)")
    doc = Path(name) if Path(name).is_absolute() or base is None else base / name
    if not doc.is_file():
        raise DataError(f"{where('document')}: document {doc} {'is a folder' if doc.is_dir() else 'not found'}; "
                        "'document' is a file path (text, PDF, HTML or EPUB), relative to the data file")
    return str(doc.resolve())


def read_samples(path: str | Path, source: str | Path | None = None,
                 check: Callable[[Any, Callable[[str | None], str]], dict] = check_sample,
                 digest: Any = None) -> Iterator[dict]:
    """Read and check samples one at a time from our JSONL or any released format
    (`memagent.tasks.released`: JSON arrays streamed, parquet by row batches); errors name the
    file, the line or record, and the field. `source`: the paragraph file that index contexts
    point into. Sample ids must be unique within the file. `check` checks a record of our own format
    (`ask --input` passes its own, for records without answers). `digest` (a hashlib object): the file's bytes
    hashed as they are read (the file is read once)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"sample file {path} does not exist; make one with `memagent data ...`")
    if check is check_sample:  # `document` paths are relative to the data file
        check = functools.partial(check_sample, base=path.parent)
    seen: dict[str, str] = {}
    for n, sample in enumerate(read_released(path, source, check_own=check, digest=digest)):
        key = str(sample["id"])
        if key in seen:
            raise DataError(f"{path}: sample id {key!r} of record {n} repeats record {seen[key]}; ids must be unique")
        seen[key] = str(n)
        yield sample
    if not seen:
        raise DataError(f"{path} holds no samples; give a file with at least one record")


def sample_document(
    sample: dict, paragraphs: Callable[[str, str, str], list[str]] | None = None
) -> str | Path | Iterator[str]:
    """The document of a sample: its `context` string, its `document` file, or a lazy stream of text blocks.

    A lazy sample's blocks are "Document i:\\n{paragraph}" joined by blank lines, exactly the
    text an eager sample of the same documents holds (concatenate the blocks to get it).
    `paragraphs(format, source, sha256)` returns the paragraph table of a source file; pass a caching
    one (`ParagraphCache`) when expanding many samples of the same file.
    """
    if "context" in sample:
        return sample["context"]
    if "document" in sample:  # a file (absolute since check_sample): text, PDF, HTML or EPUB
        return Path(sample["document"])
    lazy = sample.get("lazy")
    if not isinstance(lazy, dict) or lazy.get("kind") != "paragraphs":
        raise DataError(f"sample {sample.get('id')!r} has no context and no lazy paragraph list")
    if paragraphs is None:
        paragraphs = ParagraphCache()
    table = paragraphs(lazy.get("format", "hotpotqa"), lazy["source"], lazy["sha256"])
    return _stream_documents(table, lazy["doc_ids"], sample.get("id"))


def _stream_documents(table: list[str], doc_ids: list[int], sample_id: Any) -> Iterator[str]:
    for position, doc_id in enumerate(doc_ids):
        if not 0 <= doc_id < len(table):
            raise DataError(f"sample {sample_id!r}: paragraph index {doc_id} outside the source's {len(table)}")
        block = document_block(position + 1, table[doc_id])
        yield block if position == 0 else "\n\n" + block


class ParagraphCache:
    """Loads each source's paragraph table once and checks it is the file the samples were built from."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], list[str]] = {}

    def __call__(self, format: str, source: str, sha256: str) -> list[str]:
        key = (source, sha256)
        if key not in self._tables:
            if format not in LOADERS:
                raise DataError(f"lazy sample of unknown source format {format!r}; known: {', '.join(LOADERS)}")

            if not Path(source).is_file():
                raise DataError(f"lazy sample source {source} is missing; samples must be expanded with their source file")
            actual = file_sha256(source)
            if actual != sha256:
                raise DataError(
                    f"lazy sample source {source} changed since the samples were written "
                    f"(sha256 {actual[:12]} != {sha256[:12]}); regenerate the samples"
                )
            self._tables[key] = paragraph_table(format, source)
        return self._tables[key]


def import_released(src: str | Path, out: str | Path, source: str | Path | None = None) -> tuple[int, str]:
    """`memagent data import`: any readable data file -> our JSONL (index contexts as lazy samples
    pointing at `source`); returns the sample count and the format read."""
    if str(out) != "-" and Path(out).resolve() == Path(src).resolve():
        raise DataError(f"--out {out} is the file being imported; write to another file")
    if not Path(src).is_file():
        raise DataError(f"{src} does not exist; give a released data file")
    container, fmt = sniff_format(src)
    return write_samples(read_samples(src, source), out), f"{fmt}, {container}"

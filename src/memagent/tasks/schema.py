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
    context   str        the document text, OR, for very long samples, instead:
    lazy      dict       {"kind": "paragraphs", "format": "hotpotqa", "source": path,
                          "sha256": ..., "doc_ids": [...]}
                         the document is rebuilt as a stream of text blocks from the source file
                         (`sample_document`), so a multi-million-token sample is never held whole

Extra fields a task adds (gold document positions, the needles, ...) ride along unchanged.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from memagent.errors import MemAgentError

__all__ = [
    "DataError",
    "LAZY_DOC_THRESHOLD",
    "check_sample",
    "ParagraphCache",
    "count_tokens",
    "file_sha256",
    "load_tokenizer",
    "read_samples",
    "sample_document",
    "write_samples",
]

LAZY_DOC_THRESHOLD = 10_000  # samples with this many documents or more are stored lazily


class DataError(MemAgentError, ValueError):
    """Input data is malformed or cannot make the requested sample; the message names the entry."""


def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer by hub id or local path; "tiny" is the project's tiny tokenizer."""
    if name == "tiny":
        from memagent.backends.tiny import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot load tokenizer {name!r} ({exc}); give a Hugging Face id reachable from here "
            "or a local directory holding tokenizer files, or 'tiny'"
        ) from exc


def count_tokens(tokenizer: Any, text: str) -> int:
    """Number of tokens of `text` under `tokenizer`, without special tokens.

    Uses the Rust tokenizer directly when there is one (no length warnings, no Python lists of
    special-token handling); otherwise `tokenizer.encode`.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return len(backend.encode(text, add_special_tokens=False).ids)
    return len(tokenizer.encode(text, add_special_tokens=False))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_samples(samples: Iterable[dict], path: str | Path) -> int:
    """Write samples as JSONL (UTF-8, keys in insertion order), atomically; returns the count.

    Same samples give byte-identical files. `-` writes to stdout.
    """
    if str(path) == "-":
        import sys

        n = 0
        for sample in samples:
            sys.stdout.write(json.dumps(sample, ensure_ascii=False) + "\n")
            n += 1
        return n
    from memagent.io import atomic_write

    n = 0
    with atomic_write(path) as fh:  # a temp file beside `path`, removed if the run fails
        for sample in samples:
            fh.write(json.dumps(sample, ensure_ascii=False) + "\n")
            n += 1
    return n


_REQUIRED = ("id", "question", "answers", "task")


def check_sample(sample: Any, where: Callable[[str | None], str]) -> dict:
    """Check the types of one of our sample records where it enters; `where(field)` names the place."""
    from memagent.tasks.released import check_answers, check_context, check_text

    if not isinstance(sample, dict):
        raise DataError(f"{where(None)}: a sample must be a JSON object, got {type(sample).__name__}")
    missing = [k for k in _REQUIRED if k not in sample]
    if missing:
        raise DataError(f"{where(None)}: sample lacks {', '.join(missing)}")
    if not isinstance(sample["id"], (str, int)) or isinstance(sample["id"], bool):
        raise DataError(f"{where('id')}: must be a string or an integer, got {sample['id']!r}")
    check_text(sample["question"], where, "question")
    check_text(sample["task"], where, "task")
    check_answers(sample["answers"], where, "answers")
    if "context" in sample:
        if not isinstance(check_context(sample["context"], where), str):
            raise DataError(f"{where('context')}: must be the document text (index lists belong in 'lazy')")
    elif not isinstance(sample.get("lazy"), dict):
        raise DataError(f"{where(None)}: sample {sample['id']!r} has neither 'context' nor a 'lazy' object")
    metric = sample.get("metric")
    if metric is not None:
        from memagent.tasks.metrics import METRIC_ALIASES, METRICS

        if metric not in METRICS and metric not in METRIC_ALIASES:
            raise DataError(f"{where('metric')}: unknown metric {metric!r}; choose one of: {', '.join(METRICS)}")
    return sample


def read_samples(path: str | Path, source: str | Path | None = None,
                 check: Callable[[Any, Callable[[str | None], str]], dict] = check_sample) -> Iterator[dict]:
    """Read and check samples one at a time from our JSONL or any released format
    (`memagent.tasks.released`: JSON arrays streamed, parquet by row batches); errors name the
    file, the line or record, and the field. `source`: the paragraph file that index contexts
    point into. Sample ids must be unique within the file. `check` checks a record of our own format
    (`ask --input` passes its own, for records without answers)."""
    from memagent.tasks.released import read_released

    path = Path(path)
    if not path.is_file():
        raise DataError(f"sample file {path} does not exist; make one with `memagent data ...`")
    seen: dict[str, str] = {}
    for n, sample in enumerate(read_released(path, source, check_own=check)):
        key = str(sample["id"])
        if key in seen:
            raise DataError(f"{path}: sample id {key!r} of record {n} repeats record {seen[key]}; ids must be unique")
        seen[key] = str(n)
        yield sample


def sample_document(
    sample: dict, paragraphs: Callable[[str, str, str], list[str]] | None = None
) -> str | Iterator[str]:
    """The document of a sample: its `context` string, or a lazy stream of text blocks.

    A lazy sample's blocks are "Document i:\\n{paragraph}" joined by blank lines, exactly the
    text an eager sample of the same documents holds (concatenate the blocks to get it).
    `paragraphs(format, source, sha256)` returns the paragraph table of a source file; pass a caching
    one (`ParagraphCache`) when expanding many samples of the same file.
    """
    if "context" in sample:
        return sample["context"]
    lazy = sample.get("lazy")
    if not isinstance(lazy, dict) or lazy.get("kind") != "paragraphs":
        raise DataError(f"sample {sample.get('id')!r} has no context and no lazy paragraph list")
    if paragraphs is None:
        paragraphs = ParagraphCache()
    table = paragraphs(lazy.get("format", "hotpotqa"), lazy["source"], lazy["sha256"])
    return _stream_documents(table, lazy["doc_ids"], sample.get("id"))


def _stream_documents(table: list[str], doc_ids: list[int], sample_id: Any) -> Iterator[str]:
    from memagent.tasks.documents import document_block

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
            from memagent.tasks.corpora import LOADERS, paragraph_table

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

"""Readers for the released data files: each record becomes one sample of `memagent.tasks.schema`.

Containers (told apart by the file's first bytes, never by its name):
    JSONL        one JSON object a line (errors name "FILE:LINE")
    JSON array   split out one record at a time by `memagent.bounded.iter_json_array` and each parsed bounded (errors name "FILE: record I")
    parquet      read by row batches with pyarrow (errors name "FILE: row I")

Record formats (told apart by the fields of the first record; docs/data.md has the field tables):
    memagent       our own samples: id, task, question, answers, context | lazy, ...
    hotpotqa-eval  the official RULER-HotpotQA eval_{N}.json: context, input (the question),
                   answers, num_docs, index; `context` is the text, or (N >= 12800) a list of
                   indices into the sorted "title\\ntext" paragraphs of the HotpotQA dev file
    verl           the official training/dev parquet: context, prompt[0].content (the question),
                   reward_model.ground_truth, extra_info {index, num_docs}, data_source
    ruler          RULER's files: input (the question when a `context` field is present, else the
                   whole prompt), query, context (text or paragraph indices), outputs, index, length
    longbench      LongBench's JSONL: input, context, answers, dataset, _id, length

Index contexts become lazy samples (`sample_document` expands them as a stream of
"Document i:\\n{paragraph}" blocks, the text the official scripts build), so the source file must be
given (`source=`) or lie next to the data file as hotpotqa_dev.json / hotpot_dev_distractor_v1.json.
"""
from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from memagent.bounded import check_tree, iter_json_array, loads_json
from memagent.jsonl import iter_jsonl
from memagent.tasks.base import DataError, file_sha256
from memagent.tasks.corpora import LOADERS

__all__ = ["FORMATS", "LONGBENCH_METRICS", "detect_container", "iter_records", "read_released",
           "record_format", "sniff_format"]

FORMATS = ("memagent", "hotpotqa-eval", "verl", "ruler", "longbench")
SOURCE_NAMES = ("hotpotqa_dev.json", "hotpot_dev_distractor_v1.json")  # looked for next to an index-context file

# The score LongBench's own eval gives each dataset, where we have that scorer.
LONGBENCH_METRICS = {  # samsum and triviaqa: LongBench scores the prediction's first line only
    **dict.fromkeys(("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique"), "qa_f1"),
    **dict.fromkeys(("gov_report", "qmsum", "multi_news"), "rouge_l_longbench"),
    "triviaqa": "qa_f1_first_line",
    "samsum": "rouge_l_longbench_first_line",
}

Where = Callable[[str | None], str]  # where(field) -> "FILE: record I, field 'F'"


def detect_container(path: Path, fh: BinaryIO | None = None) -> str:
    """"parquet", "json-array" or "jsonl", from the first bytes of the file (`fh`: opened already; read from
    its start, left where the sniff stopped)."""
    with open(path, "rb") if fh is None else nullcontext(fh) as fh:
        head = fh.read(4)
        if head == b"PAR1":
            return "parquet"
        fh.seek(0)
        while True:
            block = fh.read(4096)
            if not block:
                raise DataError(f"{path} is empty; a data file holds JSONL, a JSON array or parquet")
            stripped = block.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return "json-array" if stripped[:1] == b"[" else "jsonl"


def iter_records(path: Path, digest: Any = None) -> Iterator[tuple[str, Any]]:
    """(position, record) for each record of the file: position is "LINE", "record I" or "row I". `digest` (a
    hashlib object): updated with the file's bytes as they are read, all of them once the records are drawn."""
    with open(path, "rb") as fh:  # opened once: the sniff, then the records
        container = detect_container(path, fh)
        fh.seek(0)
        read = fh if digest is None else _Hashed(fh, digest)
        if container == "jsonl":
            for lineno, rec in iter_jsonl(path, DataError, read):
                yield str(lineno), rec
        elif container == "json-array":
            yield from _iter_json_array(path, read)
        if digest is not None and container != "parquet":
            digest.update(fh.read())  # what the reader left (a JSON array's trailing whitespace)
        if container != "parquet":
            return
    if digest is not None:
        digest.update(Path(path).read_bytes())
    yield from _iter_parquet(path)


class _Hashed:
    """A binary file read through (lines, or blocks) whose bytes go to `digest` as they are read."""

    def __init__(self, fh: BinaryIO, digest: Any) -> None:
        self.fh, self.digest = fh, digest

    def __iter__(self) -> Iterator[bytes]:
        for line in self.fh:
            self.digest.update(line)
            yield line

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.digest.update(data)
        return data


def _iter_json_array(path: Path, fh: BinaryIO) -> Iterator[tuple[str, Any]]:
    """Each record of a JSON array (`fh`: the file, at its start), split out by the bounded reader's stream
    (`memagent.bounded`) and parsed one at a time (a file of any size; each record bounded in depth, digits and
    text)."""
    for i, raw in iter_json_array(fh, str(path), DataError):
        where = f"{path}: record {i}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not valid UTF-8 ({exc.reason}); save the file as UTF-8") from None
        yield f"record {i}", loads_json(text, where, DataError)


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa  # lazy: pyarrow
    import pyarrow.parquet as pq  # lazy: pyarrow

    try:
        pf = pq.ParquetFile(path)
        row = 0
        for batch in pf.iter_batches(batch_size=32):
            for rec in batch.to_pylist():
                yield f"row {row}", check_tree(rec, f"{path}: row {row}", DataError)
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read it as parquet ({exc})") from None


def record_format(rec: Any, where: str) -> str:
    """Which of `FORMATS` a record is in, from its fields."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    keys = set(rec)
    if "question" in keys:  # ours (its own check then names any missing field)
        return "memagent"
    if "reward_model" in keys or "prompt" in keys:
        return "verl"
    if "outputs" in keys:
        return "ruler"
    if "dataset" in keys and "_id" in keys:
        return "longbench"
    if "input" in keys and "answers" in keys:
        return "hotpotqa-eval"
    raise DataError(f"{where}: record with fields {sorted(keys)} is in none of the known formats "
                    f"({', '.join(FORMATS)}); docs/data.md lists the fields of each")


# ---------------------------------------------------------------- field checks
def _where(path: Path, pos: str) -> Where:
    sep = ":" if pos.isdigit() else ": "
    return lambda field: f"{path}{sep}{pos}" + (f", field {field!r}" if field else "")


def _get(rec: dict, dotted: str, where: Where) -> Any:
    """rec["a"]["b"] / rec["a"][0]["b"] for "a.b" / "a[0].b"; a missing step names the field."""
    value: Any = rec
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", dotted):
        if part.startswith("["):
            k = int(part[1:-1])
            ok = isinstance(value, list) and k < len(value)
            value = value[k] if ok else None
        else:
            ok = isinstance(value, dict) and part in value
            value = value[part] if ok else None
        if not ok:
            raise DataError(f"{where(dotted)}: missing")
    return value


def check_text(value: Any, where: Where, field: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where(field)}: must be a string, got {type(value).__name__}")
    return value


def check_answers(value: Any, where: Where, field: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where(field)}: must be a non-empty list of answer strings, got {str(value)[:60]!r}")
    for a in value:
        if not isinstance(a, str):
            raise DataError(f"{where(field)}: answers must be strings, got {type(a).__name__} {a!r}")
    return list(value)


def check_context(value: Any, where: Where, field: str = "context") -> str | list[int]:
    """A context string, or a list of non-negative paragraph indices."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                 for i in value):
        return list(value)
    raise DataError(f"{where(field)}: must be the document text or a list of paragraph indices, "
                    f"got {type(value).__name__}")


def check_lazy(value: Any, where: Where, field: str = "lazy") -> dict:
    """A lazy paragraph-index object {kind: "paragraphs", format?, source, sha256, doc_ids}, every field's type
    checked where the record is read (an index list of floats, a string or an object is refused here, not
    when the document is expanded)."""
    if not isinstance(value, dict):
        raise DataError(f"{where(field)}: must be an object {{kind, source, sha256, doc_ids}}, got {type(value).__name__}")
    if value.get("kind") != "paragraphs":
        raise DataError(f"{where(field + '.kind')}: must be \"paragraphs\", got {value.get('kind')!r}")
    fmt = value.get("format", "hotpotqa")
    if not isinstance(fmt, str) or fmt not in LOADERS:
        raise DataError(f"{where(field + '.format')}: unknown source format {fmt!r}; known: {', '.join(LOADERS)}")
    for name in ("source", "sha256"):
        if not isinstance(value.get(name), str) or not value[name]:
            raise DataError(f"{where(f'{field}.{name}')}: must be a non-empty string, got {value.get(name)!r}; "
                            "write lazy samples with `memagent data import FILE --source SOURCE`")
    ids = value.get("doc_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise DataError(f"{where(field + '.doc_ids')}: must be a list of paragraph indices (integers >= 0), "
                        f"got {type(ids).__name__}")
    return value


def check_evidence(value: Any, where: Where, field: str = "evidence") -> list[str]:
    """A record's gold supporting strings: a list of strings (the `evidence` step reward reads them)."""
    if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
        raise DataError(f"{where(field)}: must be a list of strings (the gold supporting facts), got "
                        f"{type(value).__name__}")
    return value


def with_evidence(sample: dict, rec: dict, where: Where) -> dict:
    """`sample` with the source record's `evidence` passed on (checked), when it has one."""
    if "evidence" in rec:
        sample["evidence"] = check_evidence(rec["evidence"], where)
    return sample


def check_int(value: Any, where: Where, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataError(f"{where(field)}: must be an integer, got {value!r}")
    return value


_DOC_HEADER = re.compile(r"^Document \d+:$", re.M)


class _Sources:
    """The paragraph source of index contexts: given, or found next to the data file; hashed once."""

    def __init__(self, data: Path, source: str | Path | None) -> None:
        self.data, self.given = data, source
        self._found: tuple[str, str, str] | None = None

    def lazy(self, doc_ids: list[int], where: Where) -> dict:
        if self._found is None:
            path = Path(self.given) if self.given else next(
                (self.data.parent / n for n in SOURCE_NAMES if (self.data.parent / n).is_file()), None)
            if path is None or not path.is_file():
                raise DataError(
                    f"{where('context')}: is a list of paragraph indices; give the source it indexes "
                    f"(`memagent data import {self.data} --source HOTPOT_DEV.json --out FILE.jsonl`, then "
                    f"evaluate FILE.jsonl), or put it next to the data file as {SOURCE_NAMES[0]}"
                    + (f" ({path} does not exist)" if path is not None else ""))
            with open(path, "rb") as fh:
                first = fh.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
            if first not in (b"[", b"{"):
                raise DataError(f"--source {path} is not a paragraph file (a HotpotQA or SQuAD JSON file starts "
                                "with '[' or '{'); give the dev file the indices point into")
            fmt = "squad" if first == b"{" else "hotpotqa"
            self._found = (str(path.resolve()), file_sha256(path), fmt)
        source, sha, fmt = self._found
        return {"kind": "paragraphs", "format": fmt, "source": source, "sha256": sha, "doc_ids": doc_ids}

    def attach(self, sample: dict, context: str | list[int], where: Where) -> dict:
        if isinstance(context, str):
            sample["context"] = context
        else:
            sample["lazy"] = self.lazy(context, where)
        return sample


def _count_docs(context: str | list[int]) -> int:
    return len(context) if isinstance(context, list) else len(_DOC_HEADER.findall(context))


# ---------------------------------------------------------------- converters: record -> sample
def _hotpotqa_eval(rec: dict, where: Where, sources: _Sources, path: Path, n: int) -> dict:
    """eval_{N}.json -> a ruler_hqa sample (scored with sub_em, as the official eval does)."""
    question = check_text(_get(rec, "input", where), where, "input")
    answers = check_answers(_get(rec, "answers", where), where, "answers")
    context = check_context(_get(rec, "context", where), where)
    num_docs = check_int(rec["num_docs"], where, "num_docs") if "num_docs" in rec else _count_docs(context)
    index = check_int(_get(rec, "index", where), where, "index")
    sample = {"id": f"ruler_hqa-docs{num_docs}-{index}", "task": "ruler_hqa", "question": question,
              "answers": answers, "metric": "sub_em", "length": num_docs, "length_unit": "docs",
              "num_docs": num_docs, "num_tokens": None, "tokenizer": None, "source_id": str(index)}
    return sources.attach(sample, context, where)


def _verl(rec: dict, where: Where, sources: _Sources, path: Path, n: int) -> dict:
    """The training/dev parquet row -> a sample; data_source "hotpotqa" is the ruler_hqa task."""
    question = check_text(_get(rec, "prompt[0].content", where), where, "prompt[0].content")
    truth = _get(rec, "reward_model.ground_truth", where)
    answers = check_answers([truth] if isinstance(truth, str) else truth, where, "reward_model.ground_truth")
    context = check_context(_get(rec, "context", where), where)
    extra = rec.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where('extra_info')}: must be an object")
    num_docs = check_int(extra["num_docs"], where, "extra_info.num_docs") if "num_docs" in extra else _count_docs(context)
    index = check_int(extra.get("index", n), where, "extra_info.index")
    source = rec.get("data_source") or "hotpotqa"
    task = "ruler_hqa" if source == "hotpotqa" else str(source)
    sample = {"id": f"{task}-docs{num_docs}-{index}", "task": task, "question": question, "answers": answers,
              "metric": "sub_em", "length": num_docs, "length_unit": "docs", "num_docs": num_docs,
              "num_tokens": None, "tokenizer": None, "source_id": str(index)}
    return sources.attach(sample, context, where)


_RULER_NAME = re.compile(r"^eval_(?P<task>.+)_(?P<length>\d+)$")  # the official eval_{task}_{length}.json


def _ruler_task(rec: dict, path: Path) -> tuple[str, int | None]:
    m = _RULER_NAME.match(path.stem)
    task = rec.get("task") or (m.group("task") if m else path.parent.name or "ruler")
    length = rec.get("length") if isinstance(rec.get("length"), int) else int(m.group("length")) if m else None
    return str(task), length


def _ruler(rec: dict, where: Where, sources: _Sources, path: Path, n: int) -> dict:
    """A RULER record -> a sample. QA tasks are scored with sub_em (the official MemAgent eval; RULER's
    own uses string_match_part), the others with string_match_all (both)."""
    answers = check_answers(_get(rec, "outputs", where), where, "outputs")
    if "context" in rec:
        context = check_context(rec["context"], where)
        question = check_text(rec["query"] if "query" in rec else _get(rec, "input", where), where,
                              "query" if "query" in rec else "input")
    else:  # RULER's own prompt file: the whole prompt is the document, the question is `query`
        context = check_text(_get(rec, "input", where), where, "input")
        if "query" not in rec:
            raise DataError(f"{where('query')}: missing; a RULER record without 'context' needs 'query' "
                            "(the question) beside 'input' (the prompt that holds the document)")
        question = check_text(rec["query"], where, "query")
    task, length = _ruler_task(rec, path)
    index = check_int(_get(rec, "index", where), where, "index")
    metric = "sub_em" if task.startswith("qa") else "string_match_all"
    sample = {"id": f"{task}-{length if length is not None else 'x'}-{index}", "task": task, "question": question,
              "answers": answers, "metric": metric, "length": length if length is not None else _count_docs(context),
              "length_unit": "tokens" if length is not None else "docs", "num_tokens": None, "tokenizer": None}
    return sources.attach(sample, context, where)


def _longbench(rec: dict, where: Where, sources: _Sources, path: Path, n: int) -> dict:
    """A LongBench record -> a sample scored the way LongBench scores its dataset."""
    dataset = check_text(_get(rec, "dataset", where), where, "dataset")
    name = dataset[:-2] if dataset.endswith("_e") else dataset
    if name not in LONGBENCH_METRICS:
        raise DataError(f"{where('dataset')}: LongBench dataset {dataset!r} has no scorer here; "
                        f"supported: {', '.join(LONGBENCH_METRICS)}")
    question = check_text(_get(rec, "input", where), where, "input")
    answers = check_answers(_get(rec, "answers", where), where, "answers")
    context = check_text(_get(rec, "context", where), where, "context")
    length = rec.get("length")
    sample = {"id": str(_get(rec, "_id", where)), "task": f"longbench_{name}", "question": question,
              "answers": answers, "metric": LONGBENCH_METRICS[name],
              "length": length if isinstance(length, int) else len(context.split()), "length_unit": "words",
              "num_tokens": None, "tokenizer": None}
    return sources.attach(sample, context, where)


_CONVERTERS = {"hotpotqa-eval": _hotpotqa_eval, "verl": _verl, "ruler": _ruler, "longbench": _longbench}


def read_released(path: str | Path, source: str | Path | None = None,
                  check_own: Callable[[dict, Where], dict] | None = None, digest: Any = None) -> Iterator[dict]:
    """Samples from a file in any of `FORMATS`, one record at a time (the format of the first
    record holds for the file). `source`: the paragraph file of index contexts. `check_own`
    validates records already in our format (`memagent.tasks.schema.check_sample`)."""
    path = Path(path)
    sources = _Sources(path, source)
    fmt = None
    for n, (pos, rec) in enumerate(iter_records(path, digest)):
        where = _where(path, pos)
        if fmt is None:
            fmt = record_format(rec, where(None))
        elif not isinstance(rec, dict):
            raise DataError(f"{where(None)}: a record must be a JSON object, got {type(rec).__name__}")
        if fmt == "memagent":
            yield check_own(rec, where) if check_own else rec
        else:
            yield with_evidence(_CONVERTERS[fmt](rec, where, sources, path, n), rec, where)


def sniff_format(path: str | Path) -> tuple[str, str]:
    """(container, record format) of a data file, from its first record."""
    path = Path(path)
    for pos, rec in iter_records(path):
        return detect_container(path), record_format(rec, _where(path, pos)(None))
    raise DataError(f"{path} holds no records")

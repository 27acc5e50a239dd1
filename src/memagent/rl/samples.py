"""Training questions: the sample records of `memagent.tasks.schema` as the trainer holds them.

A data file is read by the one sample reader, `memagent.tasks.schema.read_samples` (our JSONL or any
released format; a bad record is a DataError naming the file, the line and the field). Records given
through the Python API (`train(config, dataset=[...])`) may also name the document `document` (a
string or a list of text blocks). Each becomes a `QASample` whose document can be re-read by G rollouts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from memagent.agent.chunking import iter_chunks
from memagent.agent.workflow import AgentInput
from memagent.documents import DocumentError, check_document
from memagent.errors import InputError
from memagent.tasks.schema import read_samples, sample_document


@dataclass(frozen=True)
class QASample:
    """One training question: its document (text or text blocks, re-readable) and gold answers."""

    id: str
    question: str
    document: str | tuple[str, ...] | Path
    answers: tuple[str, ...]
    memory: str | None = None  # the memory its rollouts start from; None: the agent's empty memory
    evidence: tuple[str, ...] | None = None  # gold supporting strings (the `evidence` step reward); None: none

    def agent_input(self, doc_id: str, seed_key: int | None = None) -> AgentInput:
        """This question as one workflow input (text blocks as a list), its draws keyed by `seed_key` if given."""
        document = list(self.document) if isinstance(self.document, tuple) else self.document
        return AgentInput(self.question, document, doc_id, self.memory, seed_key=seed_key)

    @classmethod
    def from_dict(cls, rec: dict[str, Any], where: str = "sample") -> "QASample":
        """From {id, question, answers, document | context | lazy, optional memory, optional evidence}; a clear
        InputError when a
        field is wrong."""
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a mapping with id, question, answers, document, got {type(rec).__name__}")
        has_doc = any(k in rec for k in ("document", "context", "lazy"))
        missing = [k for k in ("question", "answers") if k not in rec] + ([] if has_doc else ["document (or context)"])
        if missing:
            raise InputError(f"{where}: missing field(s) {', '.join(missing)}; each sample needs "
                             "id, question, answers (list of str) and document (str or list of str)")
        if "document" in rec or "context" in rec:
            doc = rec.get("document", rec.get("context"))
        else:  # a sample stored lazily (memagent.tasks.schema): rebuilt as its text blocks
            doc = sample_document(rec)
        if not isinstance(doc, (str, Path)):  # a Path: a data file's document file, re-read by each rollout
            doc = tuple(str(block) for block in doc)  # iterables are materialised: G rollouts re-read it
        answers = rec["answers"]
        answers = (answers,) if isinstance(answers, str) else tuple(str(a) for a in answers)
        if not answers:
            raise InputError(f"{where}: 'answers' is empty; give at least one gold answer")
        memory = rec.get("memory")
        if memory is not None and not isinstance(memory, str):
            raise InputError(f"{where}: 'memory' (the starting memory) must be a string, got {type(memory).__name__}")
        return cls(str(rec.get("id", where)), str(rec["question"]), doc, answers, memory,
                   sample_evidence(rec.get("evidence"), where))


def sample_evidence(value: Any, where: str) -> tuple[str, ...] | None:
    """A record's `evidence` (a list of gold supporting strings, or one string) as a tuple; None when absent or
    empty (such a sample gets no evidence reward); an InputError for anything else."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(e, str) for e in items):
        raise InputError(f"{where}: 'evidence' must be a list of strings (the gold supporting facts), "
                         f"got {type(value).__name__}")
    return tuple(items) or None


def load_samples(samples: Iterable[Any]) -> list[QASample]:
    """QASample list from dicts (or QASample objects); errors name the offending sample."""
    out = []
    for i, rec in enumerate(samples):
        out.append(rec if isinstance(rec, QASample) else QASample.from_dict(rec, f"sample {i}"))
    if not out:
        raise InputError("the training dataset is empty; give at least one sample")
    return out


def read_training_samples(path: str | Path, digest: Any = None) -> list[QASample]:
    """The samples of a data file (`read_samples`: checked, ids unique), each as a QASample; `digest` (a hashlib
    object) gets the file's bytes as they are read (the run's data_sha256, without a second read)."""
    return load_samples(QASample.from_dict(_file_document(rec, f"{path}: sample {n}"), f"{path}: sample {n}")
                        for n, rec in enumerate(read_samples(path, digest=digest)))


def _file_document(rec: dict[str, Any], where: str) -> dict[str, Any]:
    """A data file's record with its `document` (a file path there, not text) as a checked Path: text, PDF, HTML
    or EPUB (memagent.documents), re-read by each rollout."""
    if "document" not in rec:
        return rec
    try:
        check_document(rec["document"])
    except DocumentError as e:
        raise InputError(f"{where}: {e}") from None
    return dict(rec, document=Path(rec["document"]))


def middle_cut(ids: list[int], budget: int) -> list[int]:
    """`ids` if it holds at most `budget` tokens, else its first budget // 2 and its last
    budget - budget // 2 tokens, joined (the middle removed)."""
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")
    if len(ids) <= budget:
        return list(ids)
    head = budget // 2
    return list(ids[:head]) + list(ids[len(ids) - (budget - head):])


def cap_chunks(samples: list[QASample], tokenizer: Any, chunk_tokens: int, max_chunks: int) -> list[QASample]:
    """Each sample's document cut to at most `max_chunks` chunks of `chunk_tokens` tokens by removing its
    middle (`data.max_chunks`), tokenised as the workflow does; 0 leaves the samples as they are.
    The kept head and tail are decoded as one text, which the workflow re-tokenises."""
    if max_chunks == 0:
        return samples
    budget = max_chunks * chunk_tokens
    out = []
    for s in samples:
        doc = s.document if isinstance(s.document, (str, Path)) else list(s.document)
        ids = [t for chunk in iter_chunks(doc, tokenizer, chunk_tokens) for t in chunk.token_ids]
        out.append(s if len(ids) <= budget else replace(s, document=tokenizer.decode(middle_cut(ids, budget))))
    return out

"""Paragraph corpora read from the public QA files: HotpotQA and SQuAD JSON.

Both become a `ParagraphCorpus`: a table of distinct paragraphs (sorted, so a paragraph's index
depends only on the file's content, as in RULER's readers) and one `QAEntry` per question
pointing into it. HotpotQA paragraphs are "title\\n" + the sentences joined without separator
(RULER and the MemAgent reference do the same); SQuAD paragraphs are the context text.

Sources: a local JSON path, or `hf:NAME[:CONFIG][@SPLIT]` to read a Hugging Face dataset when
the optional `datasets` package is installed and the hub is reachable (rows in the hub's
dict-of-lists layout are accepted too).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memagent.bounded import loads_json  # depth, digits and text bounded (memagent.bounded)
from memagent.tasks.base import DataError, file_sha256

__all__ = ["ParagraphCorpus", "QAEntry", "load_hotpotqa", "load_squad", "paragraph_table", "read_json_source"]


@dataclass(frozen=True)
class QAEntry:
    """One question of the source file.

    gold: paragraph indices that hold the supporting facts (always kept in a sample)
    extra: the entry's own other paragraphs (HotpotQA's 8 distractors, SQuAD's same-article
        paragraphs), used before paragraphs of other questions
    """

    index: int  # position in the source file
    source_id: str  # the file's own id (`_id`, `id`), else the position
    question: str
    answers: list[str]
    gold: list[int]
    extra: list[int]
    own: tuple[int, ...] = ()  # all of the entry's paragraphs in file order (empty: gold + extra)
    evidence: tuple[str, ...] = ()  # the supporting sentences (HotpotQA's supporting_facts), in their order

    @property
    def own_in_file_order(self) -> list[int]:
        return list(self.own) if self.own else list(self.gold) + list(self.extra)


@dataclass
class ParagraphCorpus:
    paragraphs: list[str]  # distinct paragraphs, sorted
    entries: list[QAEntry]
    source: str  # absolute path, or the hf: id
    sha256: str | None  # of the source file (None for hub sources)
    format: str = "hotpotqa"
    extra_info: dict[str, Any] = field(default_factory=dict)


def read_json_source(source: str | Path) -> tuple[Any, str, str | None]:
    """Load a JSON file (or an `hf:` dataset as a list of rows); returns (data, source, sha256)."""
    text = str(source)
    if text.startswith("hf:"):
        return _read_hub(text[3:]), text, None
    path = Path(source)
    if not path.is_file():
        raise DataError(f"source file {path} does not exist; download the dataset JSON and give its path")

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not valid UTF-8 (byte {exc.start}: {exc.reason}); save it as UTF-8") from None
    data = loads_json(text, str(path), DataError, syntax="{where} is not valid JSON ({reason})")
    return data, str(path.resolve()), file_sha256(path)


def _read_hub(spec: str) -> list[dict]:
    try:
        import datasets  # lazy: datasets
    except ImportError as exc:
        raise DataError("reading hf: sources needs the `datasets` package (pip install datasets)") from exc
    name, _, split = spec.partition("@")
    name, _, config = name.partition(":")
    ds = datasets.load_dataset(name, config or None, split=split or "validation")
    return [dict(row) for row in ds]


def _entry_name(i: int, raw: Any) -> str:
    rid = raw.get("_id", raw.get("id")) if isinstance(raw, dict) else None
    return f"entry #{i}" + (f" (id {rid})" if rid is not None else "")


def _hotpot_pairs(raw: dict, name: str) -> list[tuple[str, str]]:
    ctx = raw.get("context")
    if ctx is None:
        raise DataError(f"HotpotQA {name} has no 'context'; each entry needs its [title, sentences] paragraphs")
    if isinstance(ctx, dict):  # hub layout: {"title": [...], "sentences": [[...], ...]}
        ctx = list(zip(ctx.get("title", []), ctx.get("sentences", [])))
    if not isinstance(ctx, list) or not ctx:
        raise DataError(f"HotpotQA {name}: 'context' must be a non-empty list of [title, sentences]")
    pairs = []
    for item in ctx:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], list) and all(isinstance(s, str) for s in item[1])):
            raise DataError(f"HotpotQA {name}: context item {str(item)[:80]!r} is not [title, [sentences]]")
        pairs.append((item[0], "".join(item[1])))
    return pairs


def _hotpot_support_titles(raw: dict, name: str) -> set[str] | None:
    facts = raw.get("supporting_facts")
    if facts is None:
        return None
    if isinstance(facts, dict):  # hub layout
        return set(facts.get("title", []))
    try:
        return {title for title, _ in facts}
    except (TypeError, ValueError) as exc:
        raise DataError(f"HotpotQA {name}: 'supporting_facts' must be [title, sentence id] pairs") from exc


def _hotpot_evidence(raw: dict, name: str) -> tuple[str, ...]:
    """The supporting sentences of an entry: for each [title, sentence id] of `supporting_facts` (list or hub
    layout), that sentence of the paragraph of that title, stripped; a fact whose sentence id is out of range
    (a few official entries have one) names no sentence and is left out."""
    facts, ctx = raw.get("supporting_facts"), raw.get("context")
    if facts is None or ctx is None:
        return ()
    if isinstance(facts, dict):  # hub layout: {"title": [...], "sent_id": [...]}
        facts = list(zip(facts.get("title", []), facts.get("sent_id", [])))
    if isinstance(ctx, dict):
        ctx = list(zip(ctx.get("title", []), ctx.get("sentences", [])))
    sentences = {title: list(sents) for title, sents in ctx}
    out = []
    for title, sid in facts:
        sents = sentences.get(title, [])
        if isinstance(sid, int) and not isinstance(sid, bool) and 0 <= sid < len(sents) and sents[sid].strip():
            out.append(sents[sid].strip())
    return tuple(dict.fromkeys(out))


def load_hotpotqa(source: str | Path) -> ParagraphCorpus:
    """Read a HotpotQA-format JSON (a list of entries with question, answer, context)."""
    data, where, sha = read_json_source(source)
    if not isinstance(data, list):
        raise DataError(f"{where}: a HotpotQA file is a JSON list of entries, got {type(data).__name__}")
    parsed = []
    for i, raw in enumerate(data):
        name = _entry_name(i, raw)
        if not isinstance(raw, dict):
            raise DataError(f"HotpotQA {name} in {where} is not an object")
        for key in ("question", "answer"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise DataError(f"HotpotQA {name} in {where}: missing or empty {key!r}")
        pairs = _hotpot_pairs(raw, name)
        support = _hotpot_support_titles(raw, name)
        titles = {t for t, _ in pairs}
        if support is not None and not support <= titles:
            raise DataError(f"HotpotQA {name}: supporting title(s) {sorted(support - titles)} not in its context")
        parsed.append((i, raw, pairs, support))
    table = sorted({f"{t}\n{text}" for _, _, pairs, _ in parsed for t, text in pairs})
    index = {p: k for k, p in enumerate(table)}
    entries = []
    for i, raw, pairs, support in parsed:
        ids = list(dict.fromkeys(index[f"{t}\n{text}"] for t, text in pairs))
        gold = ids if support is None else list(dict.fromkeys(index[f"{t}\n{x}"] for t, x in pairs if t in support))
        entries.append(QAEntry(i, str(raw.get("_id", raw.get("id", i))), raw["question"], [raw["answer"]],
                               gold, [k for k in ids if k not in gold], tuple(ids), _hotpot_evidence(raw, _entry_name(i, raw))))
    return ParagraphCorpus(table, entries, where, sha, "hotpotqa")


def _squad_articles(data: Any, where: str) -> list[dict]:
    articles = data.get("data") if isinstance(data, dict) else data if isinstance(data, list) else None
    if not isinstance(articles, list):
        raise DataError(f"{where}: a SQuAD file is an object with a 'data' list of articles")
    for a, art in enumerate(articles):
        paras = art.get("paragraphs") if isinstance(art, dict) else None
        if not isinstance(paras, list) or not all(isinstance(p, dict) and isinstance(p.get("context"), str) for p in paras):
            raise DataError(f"SQuAD article #{a} in {where}: needs 'paragraphs', each with a 'context' string")
    return articles


def load_squad(source: str | Path) -> ParagraphCorpus:
    """Read a SQuAD-format JSON ({"data": [{"paragraphs": [{"context", "qas"}]}]}).

    Unanswerable questions (SQuAD 2.0 `is_impossible`) are skipped, as in RULER.
    """
    data, where, sha = read_json_source(source)
    articles = _squad_articles(data, where)
    table = sorted({p["context"] for art in articles for p in art["paragraphs"]})
    index = {p: k for k, p in enumerate(table)}
    entries: list[QAEntry] = []
    n = 0
    for a, art in enumerate(articles):
        same_article = list(dict.fromkeys(index[p["context"]] for p in art["paragraphs"]))
        for p in art["paragraphs"]:
            own = index[p["context"]]
            for qa in p.get("qas", []):
                name = f"question {qa.get('id', n)!r} (article #{a})"
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str):
                    raise DataError(f"SQuAD {name} in {where}: missing 'question'")
                n += 1
                if qa.get("is_impossible", False):
                    continue
                answers = [x.get("text") for x in qa.get("answers", []) if isinstance(x, dict)]
                answers = list(dict.fromkeys(x for x in answers if isinstance(x, str) and x.strip()))
                if not answers:
                    raise DataError(f"SQuAD {name} in {where}: no answer texts (and not marked is_impossible)")
                entries.append(QAEntry(n - 1, str(qa.get("id", n - 1)), qa["question"], answers,
                                       [own], [k for k in same_article if k != own]))
    return ParagraphCorpus(table, entries, where, sha, "squad")


LOADERS = {"hotpotqa": load_hotpotqa, "squad": load_squad}


def paragraph_table(format: str, source: str | Path) -> list[str]:
    """The sorted distinct paragraphs of a source file, the table lazy samples and the official
    index contexts point into; only the structure is checked (not answers or supporting facts),
    as the official readers do. Equal to `LOADERS[format](source).paragraphs` for a valid file."""
    data, where, _ = read_json_source(source)
    if format == "hotpotqa":
        if not isinstance(data, list):
            raise DataError(f"{where}: a HotpotQA file is a JSON list of entries, got {type(data).__name__}")
        for i, raw in enumerate(data):
            if not isinstance(raw, dict):
                raise DataError(f"HotpotQA {_entry_name(i, raw)} in {where} is not an object")
        return sorted({f"{t}\n{x}" for i, raw in enumerate(data) for t, x in _hotpot_pairs(raw, _entry_name(i, raw))})
    if format == "squad":
        return sorted({p["context"] for art in _squad_articles(data, where) for p in art["paragraphs"]})
    raise DataError(f"unknown paragraph source format {format!r}; known: {', '.join(LOADERS)}")

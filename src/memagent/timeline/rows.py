"""The memory timeline of a run: one row per chunk read, what changed, and where the final memory came from.

Pure functions over trace records (see `memagent.agent.trace`): the service (`memagent serve`), its page and
`memagent report` (`memagent.timeline.report`) all show the same rows. Import them from `memagent.timeline`.

- `word_diff(old, new)`: the words `new` added to `old` and the words it removed, as runs of consecutive
  words (whitespace-split tokens joined by one space). The diff trims the common prefix and suffix, then
  matches the middle with difflib (autojunk off); the page's `timeline.js` does the same with an LCS.
- `timeline_rows(records)`: one row per memory record of one document, in step order.
- `evidence_steps(records)`: the steps whose added words are still in the final memory. Each word of the
  memory carries the step that wrote it; an unchanged word keeps its step, an inserted or replaced word
  takes the current one. The steps carried by the final memory's words are the evidence: the chunks the
  memory that answered was written from.
- `evidence_sources(records)`: the pages, chapters or headings of those chunks ("page 214"), for documents
  read from a PDF, HTML or EPUB file (memory records with `source`).
- `group_by_doc(records)`: records split by `doc_id`, in first-seen order.
"""
from __future__ import annotations

import difflib
from typing import Any

from memagent.errors import InputError

Record = dict[str, Any]


def _opcodes(old: list[str], new: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib opcodes (tag, i1, i2, j1, j2) of two word lists, with the common prefix/suffix matched first."""
    n = min(len(old), len(new))
    pre = 0
    while pre < n and old[pre] == new[pre]:
        pre += 1
    suf = 0
    while suf < n - pre and old[len(old) - 1 - suf] == new[len(new) - 1 - suf]:
        suf += 1
    ops: list[tuple[str, int, int, int, int]] = []
    if pre:
        ops.append(("equal", 0, pre, 0, pre))
    mid = difflib.SequenceMatcher(None, old[pre:len(old) - suf], new[pre:len(new) - suf], autojunk=False)
    for tag, i1, i2, j1, j2 in mid.get_opcodes():
        ops.append((tag, i1 + pre, i2 + pre, j1 + pre, j2 + pre))
    if suf:
        ops.append(("equal", len(old) - suf, len(old), len(new) - suf, len(new)))
    return ops


def word_diff(old: str, new: str) -> tuple[list[str], list[str]]:
    """(added, removed): runs of words in `new` not in `old`, and runs of `old` not in `new`."""
    a, b = old.split(), new.split()
    added, removed = [], []
    for tag, i1, i2, j1, j2 in _opcodes(a, b):
        if tag in ("insert", "replace"):
            added.append(" ".join(b[j1:j2]))
        if tag in ("delete", "replace"):
            removed.append(" ".join(a[i1:i2]))
    return added, removed


def _doc_key(r: Record) -> str:
    return str(r.get("doc_id", ""))


def is_memory(r: Record) -> bool:
    """A memory-update record: no `kind` (the paper's trace) or kind "memory". Kinds are an open set: "final",
    and a workflow's own ("query", ...), are calls of other kinds (`other_calls`)."""
    return r.get("kind", "memory") == "memory"


def other_calls(records: list[Record]) -> list[Record]:
    """The records of one document that are neither memory updates nor the final answer (e.g. a lookup query),
    in the order written: {kind, step, text, ...} as the workflow wrote them."""
    return [r for r in records if not is_memory(r) and r.get("kind") != "final"]


def memory_records(records: list[Record]) -> list[Record]:
    """The memory-update records (`is_memory`) of one document, sorted by step."""
    docs = {_doc_key(r) for r in records}
    if len(docs) > 1:
        raise InputError(f"timeline of one document expected, got records of {len(docs)} documents "
                         f"({', '.join(sorted(docs)[:3])}, ...); split them with group_by_doc")
    mem = [r for r in records if is_memory(r)]
    for r in mem:
        for key in ("step", "memory"):
            if key not in r:
                raise InputError(f"trace record of document {r.get('doc_id')} step {r.get('step')} "
                                 f"has no {key!r} field; is it a memagent trace?")
    return sorted(mem, key=lambda r: int(r["step"]))


def timeline_rows(records: list[Record], empty_memory: str = "") -> list[Record]:
    """One row per memory record of ONE document, in step order:
    {step, chunk_start, chunk_tokens, memory, previous_memory, added, removed, changed, truncated, chunk_text,
    source}; source: the page, heading or chapter the chunk came from (a PDF, HTML or EPUB document), else None.
    The first row's previous memory is `empty_memory` (the trace does not carry the empty-memory text)."""
    rows, previous = [], empty_memory
    for r in memory_records(records):
        memory = str(r["memory"])
        added, removed = word_diff(previous, memory)
        rows.append(dict(step=int(r["step"]), chunk_start=r.get("chunk_start"), chunk_tokens=r.get("chunk_tokens"),
                         memory=memory, previous_memory=previous, added=added, removed=removed,
                         changed=previous.split() != memory.split(), truncated=bool(r.get("truncated", False)),
                         chunk_text=r.get("chunk_text"), source=_source(r)))
        previous = memory
    return rows


def _source(r: Record) -> str | None:
    return str(r["source"]) if r.get("source") is not None else None


def evidence_sources(records: list[Record], empty_memory: str = "") -> list[str]:
    """The places (pages, chapters, headings) of the evidence steps' chunks, in step order, each once: what
    "memory came from: page 214" lists. Empty for a plain text document (its records carry no `source`)."""
    by_step = {int(r["step"]): _source(r) for r in memory_records(records)}
    places: list[str] = []
    for step in evidence_steps(records, empty_memory):
        place = by_step.get(step)
        if place is not None and place not in places:
            places.append(place)
    return places


def word_sources(records: list[Record], empty_memory: str = "") -> list[tuple[str, int | None]]:
    """(word, step that wrote it) for each word of the last memory; words of `empty_memory` carry None."""
    words = empty_memory.split()
    source: list[int | None] = [None] * len(words)
    for r in memory_records(records):
        new = str(r["memory"]).split()
        carried: list[int | None] = []
        for tag, i1, i2, j1, j2 in _opcodes(words, new):
            carried += source[i1:i2] if tag == "equal" else [int(r["step"])] * (j2 - j1)
        words, source = new, carried
    return list(zip(words, source))


def evidence_steps(records: list[Record], empty_memory: str = "") -> list[int]:
    """The steps whose added words survive into the final memory (the chunks it came from), in order."""
    return sorted({step for _, step in word_sources(records, empty_memory) if step is not None})


def group_by_doc(records: list[Record]) -> dict[str, list[Record]]:
    """{doc_id: its records in trace order}, documents in first-seen order (a missing doc_id is "")."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(_doc_key(r), []).append(r)
    return groups

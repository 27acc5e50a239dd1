"""Multi-document contexts in the RULER QA style (RULER-HotpotQA, RULER SQuAD-QA).

A sample's documents are its gold paragraphs, then its own distractors (HotpotQA's 8, SQuAD's
same-article paragraphs), then paragraphs drawn from other questions, all shuffled and written
"Document i:\\n{paragraph}" with a blank line between documents (paper, "Data"; RULER qa.py).

The size is set either by a number of documents (exact) or by a token target under a tokenizer:
documents are added in the order above until the context's token count is closest to the
target. Eager contexts are measured exactly (the whole text tokenised); contexts of
`LAZY_DOC_THRESHOLD` documents or more are never built, their count is the sum over documents
(paragraph + header + separator tokenised apart), which can differ from the joint count by about
one token per document where a paragraph's last punctuation merges with the blank line.

Departure from RULER: when fewer documents than the entry's own paragraphs are asked for, the
gold ones are kept and own distractors dropped (RULER fails there); fewer than the gold ones is
an error naming the entry.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Sequence

from memagent.tasks.corpora import QAEntry
from memagent.tasks.base import DataError, count_tokens

__all__ = ["DocumentPlan", "document_block", "plan_by_docs", "plan_by_tokens", "render_documents"]

DOCUMENT_TEMPLATE = "Document {i}:\n{paragraph}"
SEPARATOR = "\n\n"
TOKEN_TOLERANCE = 0.02  # a token target is met when the count is within 2% of it


def document_block(i: int, paragraph: str) -> str:
    """The text of document number `i` (1-based)."""
    return DOCUMENT_TEMPLATE.format(i=i, paragraph=paragraph)


def render_documents(paragraphs: Sequence[str]) -> str:
    return SEPARATOR.join(document_block(i + 1, p) for i, p in enumerate(paragraphs))


@dataclass(frozen=True)
class DocumentPlan:
    doc_ids: list[int]  # paragraph indices in document order (Document 1 first)
    gold_positions: list[int]  # 1-based document numbers of the gold paragraphs
    num_tokens: int | None  # token count of the context (None when no tokenizer was given)


def _name(entry: QAEntry) -> str:
    return f"entry #{entry.index} (id {entry.source_id})"


def _fillers(entry: QAEntry, n_table: int, k: int, rng: random.Random) -> list[int]:
    """k paragraphs of other entries, drawn without replacement (O(k), not O(table))."""
    own = set(entry.gold) | set(entry.extra)
    available = n_table - len(own)
    if k > available:
        raise DataError(
            f"{_name(entry)}: needs {k} paragraphs from other questions but the source has only "
            f"{available}; use a larger source file or fewer documents"
        )
    draw = rng.sample(range(n_table), min(n_table, k + len(own)))
    return [i for i in draw if i not in own][:k]


def _candidates(entry: QAEntry, n_table: int, n_fill: int, rng: random.Random) -> list[int]:
    extra = list(entry.extra)
    rng.shuffle(extra)
    return list(entry.gold) + extra + _fillers(entry, n_table, n_fill, rng)


def _ordered(ids: Sequence[int], order_seed: float | int, gold: Sequence[int]) -> tuple[list[int], list[int]]:
    ids = list(ids)
    random.Random(order_seed).shuffle(ids)
    gold_set = set(gold)
    return ids, [pos + 1 for pos, i in enumerate(ids) if i in gold_set]


def _fixed_candidates(entry: QAEntry, n_table: int, n_fill: int, rng: random.Random) -> list[int]:
    """The entry's own paragraphs in file order, then paragraphs of other entries (fixed placement)."""
    return entry.own_in_file_order + _fillers(entry, n_table, n_fill, rng)


def plan_by_docs(
    entry: QAEntry, table: Sequence[str], num_docs: int, rng: random.Random,
    tokenizer: Any = None, lazy: bool = False, fixed_seed: int | None = None,
) -> DocumentPlan:
    """Exactly `num_docs` documents holding the entry's gold paragraphs.

    fixed_seed: fixed placement: the own paragraphs in file order, then the fillers, put in order by
    `random.Random(fixed_seed).shuffle` (one permutation per document count, the same for every
    entry, as the official data's `random.Random(4)`); None: a fresh permutation per sample.
    """
    if num_docs < len(entry.gold):
        raise DataError(
            f"{_name(entry)}: {num_docs} documents cannot hold its {len(entry.gold)} gold paragraphs"
        )
    n_own = min(num_docs, len(entry.gold) + len(entry.extra))
    if fixed_seed is not None and n_own == len(entry.gold) + len(entry.extra):
        chosen = _fixed_candidates(entry, len(table), num_docs - n_own, rng)
    else:
        seq = _candidates(entry, len(table), num_docs - n_own, rng)
        chosen = seq[: len(entry.gold)] + seq[len(entry.gold) : n_own] + seq[len(entry.gold) + len(entry.extra) :]
    ids, gold_pos = _ordered(chosen, rng.random() if fixed_seed is None else fixed_seed, entry.gold)
    if tokenizer is None:
        return DocumentPlan(ids, gold_pos, None)
    if lazy:
        return DocumentPlan(ids, gold_pos, _blockwise_tokens(ids, table, tokenizer, {}))
    return DocumentPlan(ids, gold_pos, count_tokens(tokenizer, render_documents([table[i] for i in ids])))


def _paragraph_tokens(ids: Sequence[int], table: Sequence[str], tokenizer: Any, cache: dict[int, int]) -> list[int]:
    missing = [i for i in dict.fromkeys(ids) if i not in cache]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if missing and backend is not None:
        encs = backend.encode_batch([table[i] for i in missing], add_special_tokens=False)
        cache.update((i, len(e.ids)) for i, e in zip(missing, encs))
    for i in missing:
        if i not in cache:
            cache[i] = count_tokens(tokenizer, table[i])
    return [cache[i] for i in ids]


def _blockwise_tokens(ids: Sequence[int], table: Sequence[str], tokenizer: Any, cache: dict[int, int]) -> int:
    """Token count of the rendered documents, each header, paragraph and separator counted apart."""
    sep = count_tokens(tokenizer, SEPARATOR)
    headers = sum(count_tokens(tokenizer, document_block(i + 1, "")) for i in range(len(ids)))
    return sum(_paragraph_tokens(ids, table, tokenizer, cache)) + headers + sep * max(0, len(ids) - 1)


def plan_by_tokens(
    entry: QAEntry, table: Sequence[str], target: int, tokenizer: Any, rng: random.Random,
    lazy_threshold: int, cache: dict[int, int] | None = None, fixed_seed: int | None = None,
) -> DocumentPlan:
    """As many documents as bring the context's token count closest to `target`.

    `cache` maps paragraph index to its token count and may be shared across samples;
    `fixed_seed` as in `plan_by_docs` (the permutation is then one per document count).
    """
    candidates = _candidates if fixed_seed is None else _fixed_candidates
    cache = {} if cache is None else cache
    per_doc = count_tokens(tokenizer, document_block(10, "")) + count_tokens(tokenizer, SEPARATOR)
    probe = rng.sample(range(len(table)), min(len(table), 64))
    mean = per_doc + sum(_paragraph_tokens(probe, table, tokenizer, cache)) / max(1, len(probe))
    n_own = len(entry.gold) + len(entry.extra)
    n_fill = max(0, min(len(table) - n_own, int(1.3 * target / mean) + 32 - n_own))
    while True:
        seq = candidates(entry, len(table), n_fill, rng)
        est = list(accumulate((t + per_doc for t in _paragraph_tokens(seq, table, tokenizer, cache)), initial=0))
        if est[-1] >= target or n_fill >= len(table) - n_own:
            break
        n_fill = min(len(table) - n_own, 2 * n_fill + 32)  # the probe underestimated; draw more
    n_min = max(seq.index(g) for g in entry.gold) + 1  # the shortest prefix holding every gold paragraph
    if est[n_min] > target * (1 + TOKEN_TOLERANCE):
        raise DataError(
            f"{_name(entry)}: its gold paragraphs alone take about {est[n_min]} tokens, "
            f"more than the target {target}; use a larger token target"
        )
    if est[-1] < target * (1 - TOKEN_TOLERANCE):
        raise DataError(f"{_name(entry)}: the whole source holds only about {est[-1]} tokens, short of {target}")

    def closest(goal: float) -> int:  # the n in [n_min, len(seq)] whose estimate is nearest goal
        j = bisect.bisect_left(est, goal, lo=n_min)
        options = [n for n in (j - 1, j) if n_min <= n <= len(seq)]
        return min(options, key=lambda n: abs(est[n] - goal))

    order_seed = rng.random() if fixed_seed is None else fixed_seed
    n = closest(target)
    if n >= lazy_threshold:
        ids, gold_pos = _ordered(seq[:n], order_seed, entry.gold)
        return DocumentPlan(ids, gold_pos, _blockwise_tokens(ids, table, tokenizer, cache))
    measured: dict[int, tuple[int, list[int], list[int]]] = {}
    for _ in range(8):  # rescale the estimate by the measured count until n settles
        ids, gold_pos = _ordered(seq[:n], order_seed, entry.gold)
        exact = count_tokens(tokenizer, render_documents([table[i] for i in ids]))
        measured[n] = (exact, ids, gold_pos)
        n_next = closest(target * est[n] / exact)
        if n_next in measured:
            break
        n = n_next
    exact, ids, gold_pos = min(measured.values(), key=lambda m: abs(m[0] - target))
    return DocumentPlan(ids, gold_pos, exact)

"""RULER's QA task on SQuAD (qa_1): a SQuAD question among paragraphs of other questions.

The question's own paragraph, then the other paragraphs of its article, then paragraphs of
other articles, shuffled and written "Document i:" as in RULER-HotpotQA
(`memagent.tasks.documents`), sized to a token target. Scored with `sub_em`, as the MemAgent
reference scores RULER QA.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterator

from memagent.tasks.corpora import load_squad
from memagent.tasks.documents import plan_by_tokens, render_documents
from memagent.tasks.ruler_hqa import select_entries

__all__ = ["squad_samples"]


def squad_samples(source: str | Path, *, tokens: list[int], samples: int, seed: int, tokenizer: Any,
                  tokenizer_name: str | None = None) -> Iterator[dict]:
    corpus = load_squad(source)
    entries = select_entries(corpus, samples, seed)
    cache: dict[int, int] = {}
    for target in tokens:
        for k, entry in enumerate(entries):
            rng = random.Random(f"qa_squad:{seed}:{target}:{entry.source_id}:{k}")
            plan = plan_by_tokens(entry, corpus.paragraphs, target, tokenizer, rng, lazy_threshold=1 << 62, cache=cache)
            yield {
                "id": f"qa_squad-tokens{target}-{k:04d}", "task": "qa_squad",
                "question": entry.question, "answers": list(entry.answers), "metric": "sub_em",
                "length": target, "length_unit": "tokens", "num_docs": len(plan.doc_ids),
                "num_tokens": plan.num_tokens, "tokens_exact": True, "tokenizer": tokenizer_name,
                "source_id": entry.source_id, "gold_docs": plan.gold_positions,
                "context": render_documents([corpus.paragraphs[i] for i in plan.doc_ids]),
            }

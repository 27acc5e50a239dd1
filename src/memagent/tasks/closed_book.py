"""The no-context filter of RULER-HotpotQA synthesis: drop questions a model answers without documents.

A question counts as answered when ANY model, in ANY of its sampled replies, is right under ANY of
the chosen rules:

    sub_em     ours (the default): the last \\boxed{} answer (or the whole reply without a box)
               scores `sub_em` > 0 against the golds (normalised substring either way)
    substring  a gold answer occurs in the raw reply, case-insensitively, anywhere (the official rule)
    boxed      the last \\boxed{} answer equals a gold, both lower-cased with all white space removed
               (the official verifier; it also drops a few LaTeX markers and reads only the reply's
               last 300 characters, which short QA replies do not reach)

The official data (MemAgent's taskutils/memory_data filter) asks two models (a base and an instruct
model), two replies each, at temperature 1.0, top_p 0.7, up to 512 tokens, and drops a question
when `substring` or `boxed` holds for any reply: `--filter-model BASE --filter-model INSTRUCT
--filter-replies 2 --filter-temperature 1.0 --filter-top-p 0.7 --filter-max-tokens 512
--filter-rule substring --filter-rule boxed`. The prompt wording is ours.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from memagent.backends.base import SamplingParams
from memagent.tasks.base import DataError
from memagent.tasks.corpora import QAEntry
from memagent.tasks.metrics import extract_boxed, sub_em

__all__ = ["CLOSED_BOOK_PROMPT", "FILTER_RULES", "NoContextFilter", "closed_book_filter"]

# A filter gets a batch of entries and says, for each, whether the model answered it correctly
# with no context (such questions are dropped).
NoContextFilter = Callable[[Sequence[QAEntry]], Sequence[bool]]

CLOSED_BOOK_PROMPT = (
    "Answer the question with a short phrase, from your own knowledge. "
    "Put the final answer in \\boxed{{}}.\n\nQuestion: {question}"
)


def _rule_sub_em(reply: str, golds: Sequence[str]) -> bool:
    answer = extract_boxed(reply)
    return sub_em(reply if answer is None else answer, golds) > 0


def _rule_substring(reply: str, golds: Sequence[str]) -> bool:
    text = reply.lower()
    return any(g.lower() in text for g in golds)


def _rule_boxed(reply: str, golds: Sequence[str]) -> bool:
    answer = extract_boxed(reply)
    if answer is None:
        return False
    squash = "".join(answer.lower().split())
    return any(squash == "".join(g.lower().split()) for g in golds)


FILTER_RULES: dict[str, Callable[[str, Sequence[str]], bool]] = {
    "sub_em": _rule_sub_em, "substring": _rule_substring, "boxed": _rule_boxed,
}


def closed_book_filter(
    backends: Any | Sequence[Any], max_new_tokens: int = 64, *, replies: int = 1, temperature: float = 0.0,
    top_p: float = 1.0, seed: int = 0, rules: Sequence[str] = ("sub_em",),
) -> NoContextFilter:
    """A no-context filter asking each backend (`memagent.backends.base.Backend`) each question with
    no documents, `replies` times (reply r sampled with seed `seed + r`); see the module doc."""
    models = list(backends) if isinstance(backends, (list, tuple)) else [backends]
    unknown = [r for r in rules if r not in FILTER_RULES]
    if unknown or not rules:
        raise DataError(f"unknown filter rule(s) {unknown}; choose from: {', '.join(FILTER_RULES)}")
    if replies < 1 or not models:
        raise DataError(f"the no-context filter needs at least one model and one reply (got {len(models)}, {replies})")
    checks = [FILTER_RULES[r] for r in dict.fromkeys(rules)]
    params = [SamplingParams(max_new_tokens, temperature, top_p, seed + r) for r in range(replies)]

    def answered(batch: Sequence[QAEntry]) -> list[bool]:
        prompts = [CLOSED_BOOK_PROMPT.format(question=e.question) for e in batch]
        verdicts = [False] * len(batch)
        for backend in models:
            for p in params:
                for k, (entry, reply) in enumerate(zip(batch, backend.generate(prompts, p))):
                    verdicts[k] = verdicts[k] or any(check(reply.text, entry.answers) for check in checks)
        return verdicts

    return answered

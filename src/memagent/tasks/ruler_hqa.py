"""RULER-HotpotQA: HotpotQA questions hidden among many Wikipedia paragraphs (paper, "Data").

For each chosen question, its own 10 paragraphs (2 gold + 8 distractors) plus paragraphs of
other questions up to a target, shuffled with the seed, each written "Document i:\\n{title}\\n
{text}". Targets are numbers of documents (the paper's test sets: 50, 100, 200, ... 25600, which
is about 7K ... 3.5M tokens) or token counts under a named tokenizer. The same questions are
used at every length, so the columns of a results table compare like with like.

Samples of `lazy_threshold` (10,000) documents or more store the paragraph indices and the
source file's path and hash instead of the text; `memagent.tasks.schema.sample_document`
expands them as a stream of "Document i" blocks at evaluation time.

Training data filters out questions the model answers without any context
(`answered_without_context`, e.g. `memagent.tasks.closed_book.closed_book_filter`); the filter is
asked in batches, in the selection order, until enough questions survive.

Two choices tell our default from the official data (docs/data.md):
    placement  "random" (ours): each sample gets its own seeded permutation of its documents;
               "fixed" (official): the question's own paragraphs in file order, then the others,
               permuted by `random.Random(seed)`, one permutation per document count, so every
               question's own paragraphs sit in the same slots (`--seed 4` is the official permutation)
    select     "shuffle" (ours): questions in a seeded order; "first" (official): in file order,
               the filter applied in that order
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from memagent import backends as model_backends
from memagent.backends.replicas import check_base_url
from memagent.backends.tokenizer import load_tokenizer
from memagent.config import ConfigError, check_value
from memagent.tasks.base import LAZY_DOC_THRESHOLD, DataError, write_samples
from memagent.tasks.closed_book import CLOSED_BOOK_PROMPT, FILTER_RULES, NoContextFilter, closed_book_filter
from memagent.tasks.corpora import ParagraphCorpus, QAEntry, load_hotpotqa
from memagent.tasks.documents import plan_by_docs, plan_by_tokens, render_documents

__all__ = ["CLOSED_BOOK_PROMPT", "PLACEMENTS", "SELECTIONS", "FilterOptions", "closed_book_filter", "load_hotpotqa",
           "select_entries", "synthesize_ruler_hqa", "write_ruler_hqa"]

PLACEMENTS = ("random", "fixed")
SELECTIONS = ("shuffle", "first")


def select_entries(
    corpus: ParagraphCorpus, samples: int, seed: int,
    answered_without_context: NoContextFilter | None = None, batch_size: int = 64, select: str = "shuffle",
) -> list[QAEntry]:
    """`samples` questions in a seeded order ("shuffle") or in file order ("first"), skipping those
    the filter says need no context."""
    if samples <= 0:
        raise DataError(f"--samples must be positive, got {samples}")
    if select not in SELECTIONS:
        raise DataError(f"unknown selection {select!r}; choose one of: {', '.join(SELECTIONS)}")
    order = list(corpus.entries)
    if select == "shuffle":
        random.Random(f"select:{seed}").shuffle(order)
    if answered_without_context is None:
        if samples > len(order):
            raise DataError(f"asked for {samples} samples but {corpus.source} holds only {len(order)} questions")
        return order[:samples]
    kept: list[QAEntry] = []
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        verdicts = list(answered_without_context(batch))
        if len(verdicts) != len(batch):
            raise DataError(f"the no-context filter returned {len(verdicts)} verdicts for {len(batch)} questions")
        kept.extend(e for e, answered in zip(batch, verdicts) if not answered)
        if len(kept) >= samples:
            return kept[:samples]
    raise DataError(
        f"only {len(kept)} of {len(order)} questions in {corpus.source} need their context; "
        f"asked for {samples}"
    )


def _lengths(num_docs: Sequence[int], tokens: Sequence[int], tokenizer: Any, placement: str) -> tuple[str, list[int]]:
    """(unit, lengths) of a synthesis request, checked."""
    if placement not in PLACEMENTS:
        raise DataError(f"unknown placement {placement!r}; choose one of: {', '.join(PLACEMENTS)}")
    if bool(num_docs) == bool(tokens):
        raise DataError("give exactly one of num_docs (e.g. 50,100,200) or tokens (e.g. 7000,14000)")
    if tokens and tokenizer is None:
        raise DataError("token targets need a tokenizer (--tokenizer NAME)")
    for value in (*num_docs, *tokens):
        if value <= 0:
            raise DataError(f"lengths must be positive, got {value}")
    return ("docs", list(num_docs)) if num_docs else ("tokens", list(tokens))


def synthesize_ruler_hqa(
    corpus: ParagraphCorpus,
    *,
    samples: int,
    seed: int,
    num_docs: Sequence[int] = (),
    tokens: Sequence[int] = (),
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    answered_without_context: NoContextFilter | None = None,
    lazy_threshold: int = LAZY_DOC_THRESHOLD,
    placement: str = "random",
    select: str = "shuffle",
) -> Iterator[dict]:
    """Yield RULER-HotpotQA samples, all of the first length, then the next, ...

    Give exactly one of `num_docs` (documents per sample) or `tokens` (context tokens per
    sample, which needs `tokenizer`). With `num_docs` and a tokenizer the token count of each
    sample is recorded too. `placement`, `select`: see the module doc. Same corpus, arguments and
    seed give identical samples.
    """
    unit, lengths = _lengths(num_docs, tokens, tokenizer, placement)
    fixed_seed = seed if placement == "fixed" else None
    entries = select_entries(corpus, samples, seed, answered_without_context, select=select)
    token_cache: dict[int, int] = {}
    for length in lengths:
        for k, entry in enumerate(entries):
            rng = random.Random(f"ruler_hqa:{seed}:{unit}:{length}:{entry.source_id}:{k}")
            if unit == "docs":
                lazy = length >= lazy_threshold
                plan = plan_by_docs(entry, corpus.paragraphs, length, rng, tokenizer, lazy=lazy, fixed_seed=fixed_seed)
            else:
                plan = plan_by_tokens(entry, corpus.paragraphs, length, tokenizer, rng, lazy_threshold, token_cache,
                                      fixed_seed=fixed_seed)
                lazy = len(plan.doc_ids) >= lazy_threshold
            sample = {
                "id": f"ruler_hqa-{unit}{length}-{k:04d}",
                "task": "ruler_hqa",
                "question": entry.question,
                "answers": list(entry.answers),
                "metric": "sub_em",
                "length": length,
                "length_unit": unit,
                "num_docs": len(plan.doc_ids),
                "num_tokens": plan.num_tokens,
                "tokens_exact": plan.num_tokens is not None and not lazy,
                "tokenizer": tokenizer_name if tokenizer is not None else None,
                "source_id": entry.source_id,
                "gold_docs": plan.gold_positions,
                **({"evidence": list(entry.evidence)} if entry.evidence else {}),  # supporting sentences
            }
            if lazy:
                if corpus.sha256 is None:
                    raise DataError(f"samples of {length} documents are stored lazily and need a local source file, "
                                    f"not {corpus.source}; save the dataset as JSON first")
                sample["lazy"] = {"kind": "paragraphs", "format": corpus.format, "source": corpus.source,
                                  "sha256": corpus.sha256, "doc_ids": plan.doc_ids}
            else:
                sample["context"] = render_documents([corpus.paragraphs[i] for i in plan.doc_ids])
            yield sample


@dataclass(frozen=True)
class FilterOptions:
    """The no-context filter of `data ruler-hqa` (`memagent.tasks.closed_book`); no models: no filter."""

    models: Sequence[str] = ()
    backend: str = "transformers"
    base_urls: Sequence[str] = ()  # openai backend: one server for all models, or one per model
    replies: int = 1  # sampled replies per model and question
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 64
    rules: Sequence[str] = ("sub_em",)

    def __post_init__(self) -> None:
        unknown = [r for r in self.rules if r not in FILTER_RULES]
        if unknown or not self.rules:
            raise DataError(f"unknown --filter-rule {unknown}; choose from: {', '.join(FILTER_RULES)}")
        for name, value, limits, integer in (("--filter-replies", self.replies, dict(min=1), True),
                                             ("--filter-max-tokens", self.max_tokens, dict(min=1), True),
                                             ("--filter-temperature", self.temperature, dict(min=0), False),
                                             ("--filter-top-p", self.top_p, dict(above=0, max=1), False)):
            try:  # the flags' one rule (a NaN or infinite number too): memagent.config.check_value
                check_value(name, value, limits, integer)
            except ConfigError as e:
                raise DataError(str(e)) from None
        if self.base_urls and self.backend != "openai":
            raise DataError(f"--filter-base-url is for --filter-backend openai, not {self.backend}; add "
                            "--filter-backend openai, or leave out --filter-base-url to load the models here")
        for url in self.base_urls:
            check_base_url(url)  # a URL that does not parse: refused now, not at the first request

    def build(self, seed: int) -> NoContextFilter | None:
        if not self.models:
            return None

        urls = list(self.base_urls)
        if len(urls) not in (0, 1, len(self.models)):
            raise DataError(f"give one --filter-base-url for all {len(self.models)} filter models or one per model, "
                            f"not {len(urls)}")
        urls = urls * len(self.models) if len(urls) == 1 else urls
        backends = [model_backends.load_backend(self.backend, m, **({"base_url": urls[k]} if urls else {}))
                    for k, m in enumerate(self.models)]
        return closed_book_filter(backends, self.max_tokens, replies=self.replies, temperature=self.temperature,
                                  top_p=self.top_p, seed=seed, rules=self.rules)


def write_ruler_hqa(
    source: str, out: str, *, samples: int, seed: int, num_docs: Sequence[int] = (), tokens: Sequence[int] = (),
    tokenizer: str | None = None, filter: FilterOptions = FilterOptions(), placement: str = "random",
    select: str = "shuffle",
) -> int:
    """`memagent data ruler-hqa`: read the source, synthesize, write JSONL; returns the sample count.

    tokenizer: a tokenizer name (HF id, local path, or "tiny"), needed for token targets and
    optional with document counts (the samples then record their token counts).
    filter: drop questions these models answer with no context (`closed_book_filter`).
    """
    tok = load_tokenizer(tokenizer) if tokenizer else None
    corpus = load_hotpotqa(source)
    return write_samples(synthesize_ruler_hqa(corpus, samples=samples, seed=seed, num_docs=num_docs, tokens=tokens,
                                              tokenizer=tok, tokenizer_name=tokenizer,
                                              answered_without_context=filter.build(seed), placement=placement,
                                              select=select), out)

"""The two baselines MemAgent is compared with, both in one prompt of the model's window.

- full-context: the whole document in one prompt; a document longer than the window is cut in
  the middle, keeping its first and last halves, as LongBench does. Departure: LongBench cuts
  the whole prompt; here only the document is cut, so the instruction and question survive.
- rag-bm25: the document split into passages of `passage_tokens` tokens, ranked against the
  question with BM25 (`bm25s`), and the best passages that fit the same budget put back in
  document order. Words of one character are kept (numbers like "item 4" matter in QA).

Both stream the document through `memagent.agent.chunking.iter_chunks`, so a lazy
multi-million-token sample is never held whole by full-context (rag-bm25 holds the passages,
as any retriever's index does). The default prompt asks for the answer in `\\boxed{}`, like
MemAgent's final prompt; a profile may set another (`prompts.baseline_template`), and the prediction
follows the profile's answer protocol, as MemAgent's does. A profile also gives the baselines their
own answer budget and window (`budgets.baseline_answer_tokens`, `budgets.baseline_window`): the
reference evaluation lets them answer in up to 10K tokens over 120K of input.
"""
from __future__ import annotations

import re
from typing import Any

from memagent.agent.chunking import DocumentSource, Prepared, iter_chunks, middle_truncate
from memagent.errors import MemAgentError

__all__ = ["BASELINE_TEMPLATE", "EvalError", "Prepared", "bm25_context", "check_baseline_template", "context_budget",
           "middle_truncate", "render_baseline"]

BASELINE_TEMPLATE = """Read the text below and answer the question.

<text>
{context}
</text>

Question: {question}

Answer the question and put the final answer in \\boxed{}."""

_FIELDS = re.compile(r"\{(question|context)\}")


class EvalError(MemAgentError, ValueError):
    """The evaluation cannot run as asked (window too small, unknown method, bad data)."""


def check_baseline_template(template: str) -> None:
    """Raise EvalError unless `template` holds {context} exactly once and {question} at least once."""
    found = _FIELDS.findall(template)
    if found.count("context") != 1 or "question" not in found:
        raise EvalError(f"the baseline template must contain {{context}} exactly once and {{question}} at least "
                        f"once; it has {found.count('context')} and {found.count('question')}")


def render_baseline(question: str, context: str, template: str = BASELINE_TEMPLATE) -> str:
    """Fill {question} and {context} in one pass (text inside the document is left alone)."""
    values = {"question": question, "context": context}
    return _FIELDS.sub(lambda m: values[m.group(1)], template)


def context_budget(backend: Any, question: str, answer_tokens: int, window: int | None,
                   template: str = BASELINE_TEMPLATE) -> int:
    """Tokens left for the document once the template, question and answer are in the window."""
    window = window or backend.max_window
    if window is None:
        raise EvalError("the backend does not say its context window; give --window N")
    budget = window - answer_tokens - backend.prompt_length(render_baseline(question, "", template))
    if budget <= 0:
        raise EvalError(f"a window of {window} tokens leaves no room for the document after the "
                        f"prompt and {answer_tokens} answer tokens; raise --window or lower --answer-tokens")
    return budget


def bm25_context(question: str, document: DocumentSource, tokenizer: Any, budget: int,
                 passage_tokens: int = 512) -> Prepared:
    """The best BM25 passages for `question` that fit `budget` tokens, in document order."""
    import bm25s  # lazy: bm25s

    passages = list(iter_chunks(document, tokenizer, passage_tokens))
    total = sum(len(p.token_ids) for p in passages)
    if total <= budget:  # the whole document, one decode (joining the passages' texts glues words of word-level
        return Prepared(tokenizer.decode([i for p in passages for i in p.token_ids]), total, total)  # tokenizers)
    pattern = r"(?u)\b\w+\b"
    corpus = bm25s.tokenize([p.text for p in passages], stopwords="en", token_pattern=pattern, show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    (query,) = bm25s.tokenize([question], stopwords="en", token_pattern=pattern, return_ids=False,
                              show_progress=False)
    scores = retriever.get_scores(query) if query else [0.0] * len(passages)
    chosen, used = [], 0
    for i in sorted(range(len(passages)), key=lambda i: (-float(scores[i]), i)):
        n = len(passages[i].token_ids)
        if used + n <= budget:
            chosen.append(i)
            used += n
    chosen.sort()
    text = "\n\n".join(passages[i].text for i in chosen)
    return Prepared(text, total, used, f"retrieved {len(chosen)} of {len(passages)} passages")

"""LongBench's ROUGE-L: the `rouge` package's summary-level rouge-l F, as LongBench's metrics.py calls it.

LongBench scores gov_report, qmsum, multi_news and samsum with `Rouge().get_scores([pred], [gold],
avg=True)["rouge-l"]["f"]`, best over the golds, 0 when the package raises. That computation,
written out here (no dependency at run time):

1. Sentences: the text split on ".", segments of length 0 dropped, then each segment's white space
   folded (`" ".join(seg.split())`), so a segment of only spaces becomes an empty sentence "".
   Tokens: each sentence split on " ". Case-sensitive; punctuation other than "." stays on words.
2. m, n: the numbers of DISTINCT tokens of the reference and of the prediction (sets, not counts).
3. For each reference sentence r and each prediction sentence c, one longest common subsequence of
   r's and c's tokens is rebuilt by the package's backtrack (on a tie it steps along c); the
   words of all of them are pooled in one set U. LCS = |U|.
4. R = LCS/m, P = LCS/n, F = 2PR / (P + R + 1e-8).
5. No prediction sentence or no reference sentence (e.g. "" or "...") raises in the package:
   the score is 0.

Departure: the package rebuilds the subsequence recursively and raises RecursionError when a
sentence pair is longer than about 1,000 words together, which LongBench turns into a score of 0;
here the backtrack is a loop and such a pair is scored.

How it differs from `memagent.tasks.metrics.rouge_l` (rouge-score's ROUGE-L): that one lower-cases
and keeps only word characters, and takes one LCS over the whole texts counting repeated words;
this one keeps case and punctuation, splits sentences at ".", and counts distinct words only
("the cat. the dog" vs "the dog" scores F = 0.8 here, 2*(2/4)*(2/2)/1.5 = 0.667 there).
"""
from __future__ import annotations

from itertools import chain
from typing import Sequence

__all__ = ["longbench_sentences", "rouge_l_longbench_one"]


def longbench_sentences(text: str) -> list[str]:
    """The `rouge` package's sentences of `text` (step 1 above)."""
    return [" ".join(seg.split()) for seg in text.split(".") if len(seg) > 0]


def _words(sentences: Sequence[str]) -> list[str]:
    return list(chain.from_iterable(s.split(" ") for s in sentences))


def _lcs_words(ref: list[str], hyp: list[str]) -> set[str]:
    """The words of the LCS of `ref` and `hyp` that the package's backtrack rebuilds."""
    n, m = len(ref), len(hyp)
    table = [[0] * (m + 1) for _ in range(n + 1)]  # (n+1, m+1) LCS lengths of prefixes
    for i in range(1, n + 1):
        row, prev, word = table[i], table[i - 1], ref[i - 1]
        for j in range(1, m + 1):
            row[j] = prev[j - 1] + 1 if word == hyp[j - 1] else max(prev[j], row[j - 1])
    words: set[str] = set()
    i, j = n, m
    while i > 0 and j > 0:
        if ref[i - 1] == hyp[j - 1]:
            words.add(ref[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def rouge_l_longbench_one(prediction: str, gold: str) -> float:
    """Summary-level ROUGE-L F of one prediction against one gold, as the `rouge` package gives it."""
    hyp, ref = longbench_sentences(prediction), longbench_sentences(gold)
    if not hyp or not ref:
        return 0.0  # the package raises "Collections must contain at least 1 sentence"; LongBench scores 0
    m, n = len(set(_words(ref))), len(set(_words(hyp)))
    hyp_words = [s.split(" ") for s in hyp]
    union: set[str] = set()
    for r in ref:
        r_words = r.split(" ")
        for c_words in hyp_words:
            union |= _lcs_words(r_words, c_words)
    recall, precision = len(union) / m, len(union) / n
    return 2.0 * ((precision * recall) / (precision + recall + 1e-8))

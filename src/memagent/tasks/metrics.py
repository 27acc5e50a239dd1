"""Answer metrics and the training reward (paper, "Metrics").

Every public metric has the signature `metric(prediction, golds) -> float` in [0, 1]:
`prediction` is the model's answer text (None counts as no answer) and `golds` a list of gold
answers; the score is the best over the gold list unless the metric says otherwise.

- `normalize_answer`: SQuAD normalisation (lower case, drop ASCII punctuation, drop the articles
  a/an/the, fold white space), the function HotpotQA, SQuAD, LongBench and the MemAgent reference
  evaluation all share.
- `exact_match`, `f1_score`, `sub_em`: the HotpotQA evaluation the paper's RULER-HotpotQA numbers
  use (`f1_score` keeps HotpotQA's rule that yes/no/noanswer only match themselves).
- `string_match_all`, `string_match_part`: RULER's scorers (case-insensitive substring, fraction
  of references found / any found); no normalisation beyond lower case, as in RULER.
- `multi_value_fraction`: the multi-value reward, fraction of gold values found.
- `boxed_reward`: the training verifier, the last `\\boxed{}` lower-cased and stripped, equal
  to a gold answer.
- `qa_f1`: LongBench's QA token F1 (no yes/no rule); `rouge_l`: ROUGE-L through `rouge-score`;
  `rouge_l_longbench`: the `rouge` package's summary-level ROUGE-L F, LongBench's summarisation
  score (`memagent.tasks.rouge_longbench` says how the two differ).

Departures, all deliberate and tested: an answer that normalises to the empty string scores 0 on
every normalised metric (the reference scores an empty prediction 0 before calling the metric;
SQuAD would call "" == "" a match); an empty gold list is an error, not a silent 0; ROUGE-L
tokenises on Unicode word characters instead of rouge-score's ASCII-only default, which would
turn non-Latin text into nothing.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Sequence

from memagent.agent.answer import extract_boxed
from memagent.errors import MemAgentError
from memagent.tasks.rouge_longbench import rouge_l_longbench_one

__all__ = [
    "METRICS",
    "METRIC_ALIASES",
    "MetricError",
    "boxed_reward",
    "exact_match",
    "f1_score",
    "first_line",
    "get_metric",
    "multi_value_fraction",
    "normalize_answer",
    "qa_f1",
    "rouge_l",
    "rouge_l_longbench",
    "string_match_all",
    "string_match_part",
    "sub_em",
]

_PUNCT = frozenset(string.punctuation)  # ASCII only, as SQuAD: "café." -> "café"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_WORD = re.compile(r"\w+")  # Unicode-aware word characters (ROUGE tokeniser)
_YES_NO = ("yes", "no", "noanswer")


class MetricError(MemAgentError, ValueError):
    """A metric was called with inputs it cannot score (no gold answers, wrong types)."""


def normalize_answer(text: str | None) -> str:
    """SQuAD normalisation: lower case, drop punctuation, drop articles, fold white space."""
    if text is None:
        return ""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        raise MetricError(f"golds must be a list of answers, got the string {golds!r}; wrap it: [{golds!r}]")
    golds = list(golds)
    if not golds:
        raise MetricError("no gold answers given; a sample needs at least one answer in `answers`")
    for gold in golds:
        if not isinstance(gold, str):
            raise MetricError(f"gold answers must be strings, got {type(gold).__name__}: {gold!r}")
    return golds


def _best(pred: str | None, golds: Sequence[str], one: Callable[[str, str], float]) -> float:
    golds = _golds(golds)
    if pred is None:
        return 0.0
    return max(one(pred, gold) for gold in golds)


# ---------------------------------------------------------------- normalised QA metrics
def _em_one(pred: str, gold: str) -> float:
    p = normalize_answer(pred)
    return float(bool(p) and p == normalize_answer(gold))


def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    return _best(prediction, golds, _em_one)


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _hotpot_f1_one(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if (p in _YES_NO or g in _YES_NO) and p != g:
        return 0.0  # HotpotQA: "yes" must not earn partial credit against "yes it is"
    return _token_f1(p.split(), g.split())


def f1_score(prediction: str | None, golds: Sequence[str]) -> float:
    """HotpotQA token F1 over normalised words (yes/no/noanswer only match exactly)."""
    return _best(prediction, golds, _hotpot_f1_one)


def _sub_em_one(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p or not g:
        return 0.0  # "" is contained in everything; an empty answer earns nothing
    return float(g in p or p in g)


def sub_em(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction contains a normalised gold answer or the reverse.

    This is the accuracy of the paper's RULER-HotpotQA table. Substring, not word, containment,
    as in the reference ("1998" matches "19").
    """
    return _best(prediction, golds, _sub_em_one)


def _qa_f1_one(pred: str, gold: str) -> float:
    return _token_f1(normalize_answer(pred).split(), normalize_answer(gold).split())


def qa_f1(prediction: str | None, golds: Sequence[str]) -> float:
    """LongBench QA F1: token F1 of the normalised words, best over golds (no yes/no rule)."""
    return _best(prediction, golds, _qa_f1_one)


# ---------------------------------------------------------------- RULER scorers
def _found(prediction: str | None, golds: Sequence[str]) -> list[bool]:
    """Whether each gold string is in the prediction (case-insensitive substring); none for an empty prediction."""
    golds = _golds(golds)
    text = (prediction or "").lower()
    return [bool(prediction) and gold.lower() in text for gold in golds]


def string_match_all(prediction: str | None, golds: Sequence[str]) -> float:
    """RULER: fraction of the gold strings found in the prediction (case-insensitive substring)."""
    found = _found(prediction, golds)
    return sum(found) / len(found)


def string_match_part(prediction: str | None, golds: Sequence[str]) -> float:
    """RULER: 1.0 when any gold string is found in the prediction (case-insensitive substring)."""
    return float(any(_found(prediction, golds)))


# ---------------------------------------------------------------- training rewards
def multi_value_fraction(prediction: str | None, golds: Sequence[str]) -> float:
    """Multi-value reward: fraction of the gold values found in the answer.

    The answer is the last `\\boxed{}` of the prediction when it has one, else the whole text
    (so the same function scores a raw rollout and an already extracted answer). A value counts
    as found when it occurs case-insensitively; each gold is a separate value, not alternatives.
    """
    golds = _golds(golds)
    if not prediction:
        return 0.0
    boxed = extract_boxed(prediction)
    return string_match_all(prediction if boxed is None else boxed, golds)


def boxed_reward(prediction: str | None, golds: Sequence[str]) -> float:
    """Training verifier: 1.0 when the last `\\boxed{}` of the prediction, lower-cased and
    stripped of surrounding white space, equals a gold answer treated the same way; 0.0 when
    the prediction has no box."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    boxed = extract_boxed(prediction)
    if boxed is None:
        return 0.0
    answer = boxed.strip().lower()
    return float(any(answer == gold.strip().lower() for gold in golds))


# ---------------------------------------------------------------- summaries
class _UnicodeWords:
    """rouge-score tokeniser: lower-cased Unicode word runs (its default drops non-ASCII)."""

    def tokenize(self, text: str) -> list[str]:
        return _WORD.findall(text.lower())


_ROUGE_MEASURES = {"f": "fmeasure", "recall": "recall", "precision": "precision"}


def rouge_l(prediction: str | None, golds: Sequence[str], measure: str = "f") -> float:
    """ROUGE-L (longest common subsequence) of the prediction against each gold, best over golds.

    measure: "f" (F-measure, LongBench's summarisation score), "recall" or "precision".
    """
    from rouge_score import rouge_scorer  # lazy: rouge_score

    golds = _golds(golds)
    if measure not in _ROUGE_MEASURES:
        raise MetricError(f"unknown ROUGE measure {measure!r}; choose one of: {', '.join(_ROUGE_MEASURES)}")
    if not prediction or not prediction.strip():
        return 0.0
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_UnicodeWords())
    field = _ROUGE_MEASURES[measure]
    return max(getattr(scorer.score(gold, prediction)["rougeL"], field) for gold in golds)


def rouge_l_longbench(prediction: str | None, golds: Sequence[str]) -> float:
    """LongBench's ROUGE-L: the `rouge` package's rouge-l F (case-sensitive white-space tokens,
    summary-level LCS over "."-split sentences), best over golds; no prediction scores 0."""
    return _best(prediction, golds, rouge_l_longbench_one)


def first_line(prediction: str | None) -> str | None:
    """LongBench's cut for samsum, trec, triviaqa and lsht: leading newlines dropped, then the first line."""
    return None if prediction is None else prediction.lstrip("\n").split("\n")[0]


def _rouge_l_longbench_first_line(prediction: str | None, golds: Sequence[str]) -> float:
    return rouge_l_longbench(first_line(prediction), golds)


def _qa_f1_first_line(prediction: str | None, golds: Sequence[str]) -> float:
    return qa_f1(first_line(prediction), golds)


def _rouge_l_recall(prediction: str | None, golds: Sequence[str]) -> float:
    return rouge_l(prediction, golds, measure="recall")


# ---------------------------------------------------------------- registry
METRICS: dict[str, Callable[[str | None, Sequence[str]], float]] = {
    "em": exact_match,
    "f1": f1_score,
    "sub_em": sub_em,
    "qa_f1": qa_f1,
    "string_match_all": string_match_all,
    "string_match_part": string_match_part,
    "multi_value": multi_value_fraction,
    "boxed": boxed_reward,
    "rouge_l": rouge_l,
    "rouge_l_recall": _rouge_l_recall,
    "rouge_l_longbench": rouge_l_longbench,
    "rouge_l_longbench_first_line": _rouge_l_longbench_first_line,  # LongBench samsum
    "qa_f1_first_line": _qa_f1_first_line,  # LongBench triviaqa
}


METRIC_ALIASES = {"exact_match": "em"}  # other names data files use for a registered metric (`memagent data toy`)


def get_metric(name: str) -> Callable[[str | None, Sequence[str]], float]:
    """The metric registered under `name` (or an alias of it); an unknown name lists the valid ones."""
    try:
        return METRICS[METRIC_ALIASES.get(name, name)]
    except KeyError:
        raise MetricError(f"unknown metric {name!r}; choose one of: {', '.join(METRICS)}") from None


# ---------------------------------------------------------------- training rewards
RewardFn = Callable[[str | None, Sequence[str]], float]  # (final reply text or None, gold answers) -> reward

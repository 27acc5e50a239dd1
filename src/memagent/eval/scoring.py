"""How a prediction is scored against its golds: the options that differ between evaluation protocols,
and the functions that apply them to one sample and to a cell of the results table.

The metrics themselves (`memagent.tasks.metrics`) are pure `metric(prediction, golds) -> float`; these options
say which golds they see, what an empty prediction is worth and whether failed samples count.

`empty`:
- "zero" (ours): a prediction that is missing, or empty once normalised (".", "the"), scores 0 on every metric.
- "text" (the official MemAgent evaluation): a missing or empty reply ("", None) scores 0, but any other text
  is scored by the raw rules, so a prediction that normalises to "" is a substring of every gold: sub_em 1.0
  (em 1.0 only against a gold that normalises to "" too; f1 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from memagent.errors import MemAgentError
from memagent.tasks.metrics import METRIC_ALIASES, get_metric, normalize_answer

__all__ = ["EMPTY", "FAILED", "GOLDS", "METRIC_ALIASES", "ScoreOptions", "ScoringError", "canonical_metric",
           "cell_stats", "failed_score", "score_metric", "score_sample"]

GOLDS = ("all", "first")
EMPTY = ("zero", "text")
FAILED = ("wrong", "skip")

_QA = ("em", "f1", "sub_em")
_RULER = ("string_match_all", "string_match_part")


class ScoringError(MemAgentError, ValueError):
    """A scoring option has a value no protocol uses."""


@dataclass(frozen=True)
class ScoreOptions:
    golds: str = "all"  # "all": best over every gold answer; "first": the first gold only (official RULER-HQA eval)
    empty: str = "zero"  # "zero": empty after normalisation scores 0; "text": scored as text (module docstring)
    failed: str = "wrong"  # a sample whose model calls failed: "wrong" counts 0 in means; "skip" leaves it out

    def __post_init__(self) -> None:
        for name, allowed in (("golds", GOLDS), ("empty", EMPTY), ("failed", FAILED)):
            value = getattr(self, name)
            if value not in allowed:
                raise ScoringError(f"scoring.{name} must be one of {', '.join(allowed)}; got {value!r}")


def canonical_metric(name: str) -> str:
    """The registered metric name for `name` (aliases resolved); an unknown name raises MetricError."""
    name = METRIC_ALIASES.get(name, name)
    get_metric(name)
    return name


def _raw_text_score(name: str, golds: Sequence[str]) -> float | None:
    """The official raw rule for a non-empty prediction that normalises to "": None when `name` has none."""
    if name == "sub_em":
        return 1.0  # "" in gold: the substring test of the reference is true for every gold
    if name == "em":
        return float(any(normalize_answer(g) == "" for g in golds))
    return None


def score_metric(name: str, prediction: str | None, golds: Sequence[str], options: ScoreOptions) -> float:
    """One metric of one prediction under `options` (golds first/all, empty zero/text)."""
    name = canonical_metric(name)
    if options.golds == "first":
        golds = list(golds)[:1]
    if options.empty == "text" and prediction and not normalize_answer(prediction):
        raw = _raw_text_score(name, golds)
        if raw is not None:
            return raw
    return get_metric(name)(prediction, golds)


def score_sample(metric: str, prediction: str | None, golds: Sequence[str],
                 options: ScoreOptions) -> tuple[float, dict[str, float]]:
    """(the sample's own metric, the metric family em/f1/sub_em or string_match_all/part, plus the metric)."""
    metric = canonical_metric(metric)
    family = _RULER if metric.startswith("string_match") else _QA
    scores = {name: score_metric(name, prediction, golds, options) for name in dict.fromkeys((*family, metric))}
    return scores[metric], scores


def failed_score(options: ScoreOptions) -> float | None:
    """The score of a sample whose model calls failed: 0.0 ("wrong") or None (left out of means, "skip")."""
    return 0.0 if options.failed == "wrong" else None


def cell_stats(scores: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, standard error of the mean, n) over the scores that count (None left out).

    The standard error is the sample standard deviation (n - 1) over sqrt(n); None when n < 2.
    Mean None when nothing counts.
    """
    xs = [float(s) for s in scores if s is not None]
    n = len(xs)
    if n == 0:
        return None, None, 0
    mean = sum(xs) / n
    if n < 2:
        return mean, None, n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var / n), n

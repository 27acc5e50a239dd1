"""ScoreOptions applied (eval/scoring.py): hand-worked scores for every option, and the table's cell statistics."""
from __future__ import annotations

import math

import pytest

from memagent.eval.scoring import (ScoreOptions, ScoringError, canonical_metric, cell_stats, failed_score,
                                   score_metric, score_sample)
from memagent.tasks.metrics import MetricError

ZERO, TEXT = ScoreOptions(), ScoreOptions(empty="text")


@pytest.mark.parametrize("prediction, zero, text", [
    (".", 0.0, 1.0),  # normalises to "": the official raw rule finds "" inside every gold
    ("the", 0.0, 1.0),  # the article is dropped: "" again
    (" ", 0.0, 1.0),  # white space is text to the official `if pred` test
    ("", 0.0, 0.0),  # an empty reply: the official evaluation scores it 0 before calling the metric
    (None, 0.0, 0.0),  # no box at all: 0 under both rules
    ("in Paris", 1.0, 1.0),  # ordinary predictions are unchanged
])
def test_sub_em_of_empty_predictions_under_both_rules(prediction, zero, text):
    assert score_metric("sub_em", prediction, ["Paris"], ZERO) == zero
    assert score_metric("sub_em", prediction, ["Paris"], TEXT) == text


def test_em_and_f1_of_a_prediction_empty_once_normalised():
    assert score_metric("em", "the", ["Paris"], TEXT) == 0.0  # "" == "paris" is false
    assert score_metric("em", "the", ["Paris", "a"], TEXT) == 1.0  # "a" normalises to "" too
    assert score_metric("em", "the", ["Paris", "a"], ZERO) == 0.0
    assert score_metric("f1", "the", ["Paris"], TEXT) == 0.0  # no common token
    # RULER's substring scorer is not normalised: "." contains no gold under either rule
    assert score_metric("string_match_all", ".", ["x"], TEXT) == 0.0


def test_first_gold_against_all_golds():
    first = ScoreOptions(golds="first")
    assert score_metric("em", "Lyon", ["Paris", "Lyon"], ScoreOptions()) == 1.0
    assert score_metric("em", "Lyon", ["Paris", "Lyon"], first) == 0.0
    # string_match_all: fraction of golds found; against the first gold only, 1 of 1
    assert score_metric("string_match_all", "alpha beta", ["alpha", "gamma"], ScoreOptions()) == 0.5
    assert score_metric("string_match_all", "alpha beta", ["alpha", "gamma"], first) == 1.0
    # f1 of "New York City" against "York" (P 1/3, R 1) and "New York City" (1.0)
    assert score_metric("f1", "New York City", ["York", "New York City"], first) == pytest.approx(0.5)
    assert score_metric("f1", "New York City", ["York", "New York City"], ScoreOptions()) == 1.0


def test_score_sample_families_and_the_toy_metric_name():
    score, scores = score_sample("exact_match", "v17", ["v17"], ScoreOptions())  # `memagent data toy` writes it
    assert score == 1.0 and scores == {"em": 1.0, "f1": 1.0, "sub_em": 1.0}
    score, scores = score_sample("string_match_part", "a and b", ["a", "c"], ScoreOptions())
    assert score == 1.0 and scores == {"string_match_all": 0.5, "string_match_part": 1.0}
    assert canonical_metric("exact_match") == "em"
    with pytest.raises(MetricError, match="unknown metric 'accuracy'"):
        canonical_metric("accuracy")


def test_failed_samples_wrong_or_skipped_change_the_mean():
    assert failed_score(ScoreOptions()) == 0.0 and failed_score(ScoreOptions(failed="skip")) is None
    scores = [1.0, 1.0]
    wrong = cell_stats(scores + [failed_score(ScoreOptions())])
    skip = cell_stats(scores + [failed_score(ScoreOptions(failed="skip"))])
    assert wrong[0] == pytest.approx(2 / 3) and wrong[2] == 3
    assert skip == (1.0, 0.0, 2)


def test_cell_stats_hand_worked():
    # [1, 0, 1]: mean 2/3, sample variance ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3, stderr sqrt(1/3 / 3) = 1/3
    mean, se, n = cell_stats([1.0, 0.0, 1.0, None])
    assert (mean, n) == (pytest.approx(2 / 3), 3) and se == pytest.approx(1 / 3)
    assert cell_stats([0.5]) == (0.5, None, 1)  # one value: no standard error
    assert cell_stats([None]) == (None, None, 0)
    assert cell_stats([0.25, 0.75])[1] == pytest.approx(math.sqrt(0.125 / 2))


def test_bad_option_values_are_refused():
    for field in ("golds", "empty", "failed"):
        with pytest.raises(ScoringError, match=f"scoring.{field} must be one of"):
            ScoreOptions(**{field: "some"})

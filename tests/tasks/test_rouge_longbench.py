"""LongBench's ROUGE-L against hand-worked cases and against the `rouge` package itself."""
from __future__ import annotations

import random

import pytest

from memagent.tasks.metrics import METRICS, MetricError, rouge_l, rouge_l_longbench
from memagent.tasks.rouge_longbench import longbench_sentences


def _f(p: float, r: float) -> float:
    return 2.0 * p * r / (p + r + 1e-8)


@pytest.mark.parametrize(
    "prediction, golds, expected",
    [
        # m = |{the, cat, dog}| = 3, n = 2; LCS words {the} | {the, dog} = 2: R = 2/3, P = 1
        ("the dog", ["the cat. the dog"], _f(1.0, 2 / 3)),
        # case-sensitive: only "dog" is shared: R = P = 1/2
        ("The dog", ["the dog"], _f(0.5, 0.5)),
        # distinct words: n = |{a}| = 1, m = 2, LCS {a}: P = 1, R = 1/2
        ("a a a", ["a b"], _f(1.0, 0.5)),
        # the backtrack steps along the prediction on a tie: "a b" vs "b a" pools {b}, then "a" pools {a}
        ("b a", ["a b. a"], _f(1.0, 1.0)),
        # punctuation other than "." stays on the word: "dog," != "dog"
        ("dog, cat", ["dog cat"], _f(0.5, 0.5)),
        # best over golds
        ("x y", ["p q", "x y"], _f(1.0, 1.0)),
        # no sentence at all: the package raises, LongBench scores 0
        ("", ["a b"], 0.0),
        ("...", ["a b"], 0.0),
        (None, ["a b"], 0.0),
        ("a b", ["."], 0.0),
    ],
)
def test_hand_worked(prediction, golds, expected):
    assert rouge_l_longbench(prediction, golds) == pytest.approx(expected, abs=1e-12)


def test_sentences_follow_the_package():
    assert longbench_sentences("A  b. C\nd.. ") == ["A b", "C d", ""]  # " " becomes an empty sentence
    assert longbench_sentences("...") == []


def test_differs_from_rouge_score_version():
    # rouge-score's LCS over the whole text counts "the" twice: R = 2/4, P = 2/2 -> 0.667
    assert rouge_l("the dog", ["the cat. the dog"]) == pytest.approx(2 / 3)
    assert rouge_l_longbench("the dog", ["the cat. the dog"]) == pytest.approx(0.8, abs=1e-7)
    assert rouge_l("The dog", ["the dog"]) == 1.0 and rouge_l_longbench("The dog", ["the dog"]) < 0.51


def test_registered_and_checks_golds():
    assert METRICS["rouge_l_longbench"] is rouge_l_longbench
    # samsum's variant scores the first line only (after leading newlines), as LongBench cuts it
    assert METRICS["rouge_l_longbench_first_line"]("\n\na b\nc d", ["a b"]) == pytest.approx(1.0, abs=1e-7)
    assert METRICS["rouge_l_longbench"]("\n\na b\nc d", ["a b"]) == pytest.approx(_f(0.5, 1.0), abs=1e-12)
    assert METRICS["qa_f1_first_line"]("Paris\nor Lyon", ["Paris"]) == 1.0
    assert METRICS["qa_f1_first_line"](None, ["Paris"]) == 0.0
    with pytest.raises(MetricError):
        rouge_l_longbench("a", [])


_VOCAB = ["the", "The", "cat", "dog", "a", "b", "sat", "on", "mat,", "x"]


def _random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        parts.append("." if r < 0.15 else " " if r < 0.2 else "\n" if r < 0.23 else rng.choice(_VOCAB))
    sep = rng.choice([" ", "  ", " . "])
    return sep.join(parts)


def test_equals_the_rouge_package_on_many_cases():
    rouge = pytest.importorskip("rouge")
    scorer = rouge.Rouge()
    rng = random.Random(13)
    checked = 0
    for _ in range(1500):
        pred, golds = _random_text(rng), [_random_text(rng) for _ in range(rng.randint(1, 3))]
        expected = 0.0
        for gold in golds:  # LongBench: best over golds, 0 where the package raises
            try:
                expected = max(expected, scorer.get_scores([pred], [gold], avg=True)["rouge-l"]["f"])
            except Exception:  # noqa: BLE001 - LongBench's bare except
                pass
        assert rouge_l_longbench(pred, golds) == pytest.approx(expected, abs=1e-12), (pred, golds)
        checked += expected > 0
    assert checked > 300  # most cases overlap, so the comparison is not all zeros

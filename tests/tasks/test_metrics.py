"""Metrics against hand-worked cases and their edge cases."""
from __future__ import annotations

import pytest

from memagent.tasks.metrics import (
    METRICS,
    MetricError,
    boxed_reward,
    exact_match,
    f1_score,
    get_metric,
    multi_value_fraction,
    normalize_answer,
    qa_f1,
    rouge_l,
    string_match_all,
    string_match_part,
    sub_em,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an apple, a pear", "apple pear"),
        ("Theatre", "theatre"),  # "the" only as a whole word
        ("U.S.A.", "usa"),
        ("  \tA\n", ""),
        ("Café «Noir»", "café «noir»"),  # non-ASCII letters kept, lower-cased; non-ASCII punctuation kept (SQuAD)
        ("ÉCOLE", "école"),
        (None, ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match():
    assert exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["eiffel tower"]) == 0.0
    assert exact_match("Paris", ["London", "paris"]) == 1.0  # best over golds
    assert exact_match("", [""]) == 0.0  # empty prediction never scores
    assert exact_match("the", ["a"]) == 0.0  # both normalise to ""
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("Zürich", ["zürich"]) == 1.0


def test_f1_score_hand_worked():
    # pred tokens: barack obama jr ; gold: barack obama -> P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # repeated tokens count with multiplicity: pred "new new york" vs "new york": P 2/3, R 1
    assert f1_score("new new york", ["New York"]) == pytest.approx(0.8)
    assert f1_score("London", ["Paris"]) == 0.0
    assert f1_score("Paris France", ["London", "Paris"]) == pytest.approx(2 / 3)


def test_f1_yes_no_rule_differs_from_longbench():
    assert f1_score("yes", ["yes it is"]) == 0.0  # HotpotQA: yes/no must match exactly
    assert qa_f1("yes", ["yes it is"]) == pytest.approx(0.5)  # LongBench: P 1, R 1/3
    assert f1_score("no", ["no"]) == 1.0


def test_sub_em():
    assert sub_em("It was in 1998, I think", ["1998"]) == 1.0  # gold inside prediction
    assert sub_em("Obama", ["Barack Obama"]) == 1.0  # prediction inside gold
    assert sub_em("Bush", ["Barack Obama"]) == 0.0
    assert sub_em("", ["Barack Obama"]) == 0.0  # "" is in everything, still 0
    assert sub_em("...", ["Barack Obama"]) == 0.0  # normalises to ""
    assert sub_em("anything", ["The"]) == 0.0  # a gold that normalises to "" matches nothing


def test_string_match_all_and_part():
    pred = "The numbers are 1234 and 5678."
    assert string_match_all(pred, ["1234", "5678", "9999"]) == pytest.approx(2 / 3)
    assert string_match_part(pred, ["9999", "5678"]) == 1.0
    assert string_match_part(pred, ["9999"]) == 0.0
    assert string_match_all("ALPHA beta", ["alpha", "Beta"]) == 1.0  # case-insensitive
    assert string_match_all("", ["a"]) == 0.0
    assert string_match_all(None, ["a"]) == 0.0


def test_multi_value_fraction_uses_boxed_when_present():
    assert multi_value_fraction("values: 11, 22 \\boxed{11, 33}", ["11", "22", "33", "44"]) == 0.5
    assert multi_value_fraction("11 and 22", ["11", "22", "33", "44"]) == 0.5  # no box: whole text
    assert multi_value_fraction("\\boxed{}", ["11"]) == 0.0


def test_boxed_reward():
    assert boxed_reward("so the answer is \\boxed{ Paris }", ["paris"]) == 1.0
    assert boxed_reward("\\boxed{London} then \\boxed{Paris}", ["Paris"]) == 1.0  # last box wins
    assert boxed_reward("\\boxed{Paris} then \\boxed{London}", ["Paris"]) == 0.0
    assert boxed_reward("Paris", ["Paris"]) == 0.0  # no box, no reward
    assert boxed_reward("\\boxed{The Paris}", ["Paris"]) == 0.0  # no article stripping in the verifier
    assert boxed_reward("\\boxed{f(x)={1}}", ["f(x)={1}"]) == 1.0  # nested braces
    assert boxed_reward("\\boxed{Paris", ["Paris"]) == 0.0  # unclosed
    assert boxed_reward("\\boxed{ÉCOLE}", ["école", "x"]) == 1.0
    assert boxed_reward(None, ["x"]) == 0.0


def test_qa_f1_hand_worked():
    # pred: "john smith was born" gold: "john smith" -> P 2/4, R 1 -> F1 = 2/3
    assert qa_f1("John Smith was born", ["John Smith"]) == pytest.approx(2 / 3)
    assert qa_f1("", ["x"]) == 0.0


def test_rouge_l_f_and_recall():
    # LCS("the cat sat on mat", "the cat is on the mat") = the cat on mat = 4 tokens
    pred, gold = "the cat sat on mat", "the cat is on the mat"
    assert rouge_l(pred, [gold], measure="recall") == pytest.approx(4 / 6)
    p, r = 4 / 5, 4 / 6
    assert rouge_l(pred, [gold]) == pytest.approx(2 * p * r / (p + r))
    assert rouge_l("", [gold]) == 0.0
    # Unicode text is tokenised (rouge-score's default tokeniser would drop it)
    assert rouge_l("日本 東京", ["東京"], measure="recall") == 1.0
    assert rouge_l("crème brûlée", ["Crème brûlée"]) == 1.0
    with pytest.raises(MetricError, match="unknown ROUGE measure"):
        rouge_l("a", ["a"], measure="bleu")


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_metric_rejects_bad_golds(name):
    metric = get_metric(name)
    with pytest.raises(MetricError, match="no gold answers"):
        metric("x", [])
    with pytest.raises(MetricError, match="wrap it"):
        metric("x", "paris")
    with pytest.raises(MetricError, match="must be strings"):
        metric("x", [3])


def test_registry_scores_and_unknown_name():
    assert get_metric("sub_em")("Paris", ["paris"]) == 1.0
    assert get_metric("rouge_l_recall")("a b", ["a b c d"]) == pytest.approx(0.5)
    with pytest.raises(MetricError, match="choose one of: em, f1"):
        get_metric("accuracy")

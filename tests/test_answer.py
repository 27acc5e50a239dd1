import pytest

from memagent.agent.answer import extract_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is \\boxed{Paris}.", "Paris"),
        ("\\boxed{a} then \\boxed{b}", "b"),  # the last box wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{ {x} and {y} }", "{x} and {y}"),
        ("\\boxed{}", ""),
        ("no box here", None),
        ("", None),
        ("\\boxed{done} and \\boxed{unclosed", "done"),  # an unclosed last box falls back to a closed one
        ("\\boxed{unclosed", None),
        ("\\fbox{42}", "42"),
        ("\\boxed{München 東京}", "München 東京"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected

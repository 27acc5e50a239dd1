"""The one-message prompt rule (memagent.split_prompt), by hand."""
from __future__ import annotations

import pytest

from memagent.split_prompt import PromptSplitError, SplitRule, parse_rule, split_prompt
from memagent.errors import InputError

LONGBENCH = "Answer briefly.\n\nPassage one.\nPassage two.\n\nQuestion: Who wrote it?\nAnswer:\n"
RULER = "Some magic numbers are hidden.\nline a\n\nline b\nWhat is the magic number for x?"


@pytest.mark.parametrize("rule, document, question", [
    ("paragraph", "Answer briefly.\n\nPassage one.\nPassage two.", "Question: Who wrote it?\nAnswer:"),
    ("auto", "Answer briefly.\n\nPassage one.\nPassage two.", "Question: Who wrote it?\nAnswer:"),
    ("line", "Answer briefly.\n\nPassage one.\nPassage two.\n\nQuestion: Who wrote it?", "Answer:"),
    ("separator:Question:", "Answer briefly.\n\nPassage one.\nPassage two.\n\n", "Who wrote it?\nAnswer:"),
])
def test_longbench_style_prompt(rule, document, question):
    assert split_prompt(LONGBENCH, parse_rule(rule)) == (document, question)


def test_ruler_style_prompt_needs_the_line_rule():
    assert split_prompt(RULER, parse_rule("line")) == ("Some magic numbers are hidden.\nline a\n\nline b",
                                                       "What is the magic number for x?")
    # the paragraph rule takes the last paragraph: a line of the document comes with the question
    assert split_prompt(RULER, parse_rule("paragraph"))[1] == "line b\nWhat is the magic number for x?"


def test_a_run_of_blank_lines_and_crlf_are_one_break():
    assert split_prompt("doc\r\n \r\n\r\n  q?  ", SplitRule("paragraph")) == ("doc", "q?")


@pytest.mark.parametrize("prompt, rule, words", [
    ("one paragraph only", "paragraph", "no blank line"),
    ("doc\n\n   \n", "paragraph", "no blank line"),  # trailing blank lines are ignored: no break left
    ("\n\nq?", "paragraph", "nothing comes before"),
    ("doc text\nq?", "separator:Q:", "no 'Q:'"),
    ("doc Q:", "separator:Q:", "nothing follows"),
    ("Q: what?", "separator:Q:", "nothing comes before"),
])
def test_prompts_that_cannot_be_split(prompt, rule, words):
    with pytest.raises(PromptSplitError, match=words):
        split_prompt(prompt, parse_rule(rule))


def test_rule_names():
    assert str(parse_rule("separator:</text>")) == "separator:</text>"
    assert parse_rule("separator:a:b").separator == "a:b"
    for bad in ("para", "separator:", "", None, 3):
        with pytest.raises(InputError, match="choose one of: auto, messages, paragraph, line, separator:TEXT"):
            parse_rule(bad)
    with pytest.raises(PromptSplitError, match="messages"):
        split_prompt("a\n\nb", SplitRule("messages"))

"""Where the question is in a one-message prompt (document and question together, as evaluation harnesses
send them: lm-eval, Inspect, RULER, LongBench and BABILong templates put the question last).

A rule is one of:
- `auto`: in a chat, `messages` when the document comes separately (earlier messages or a `document` /
  `document_id` field), else `paragraph`; for a lone prompt (`ask --prompt`) it is `paragraph`.
- `messages`: the last user message is the question, the messages before it the document (no split).
- `paragraph`: the question is the text after the prompt's last blank line (LongBench, RULER QA).
- `line`: the question is the text after the prompt's last line break (RULER NIAH, BABILong).
- `separator:TEXT`: the question is the text after the last occurrence of TEXT (TEXT itself dropped),
  e.g. `separator:</text>` for LongBench v2.

The prompt's trailing whitespace is ignored; the question is stripped; the document is the text before
the break (the break dropped). A prompt with no break, nothing after it or nothing before it cannot be
split: `PromptSplitError`. Whether the question fits the question budget is the caller's check.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from memagent.errors import InputError

RULES = ("auto", "messages", "paragraph", "line", "separator:TEXT")
_BREAKS = {"paragraph": re.compile(r"(?:\r?\n[ \t]*){2,}"), "line": re.compile(r"\r?\n")}
_WHERE = {"paragraph": "after the last blank line", "line": "after the last line break"}


class PromptSplitError(InputError):
    """A prompt the rule cannot split into document and question (the message says why, not what to do)."""


@dataclass(frozen=True)
class SplitRule:
    kind: str  # auto | messages | paragraph | line | separator
    separator: str = ""  # for kind == "separator"

    def __str__(self) -> str:
        return f"separator:{self.separator}" if self.kind == "separator" else self.kind

    def describe(self) -> str:
        """In words: where this rule finds the question."""
        if self.kind == "separator":
            return f"the text after the last {self.separator!r}"
        if self.kind == "messages":
            return "the last user message"
        return "the text " + _WHERE["paragraph" if self.kind == "auto" else self.kind]


def parse_rule(text: object) -> SplitRule:
    """'paragraph' -> SplitRule('paragraph'); 'separator:Q:' -> SplitRule('separator', 'Q:'); InputError else."""
    if isinstance(text, str):
        if text in ("auto", "messages", "paragraph", "line"):
            return SplitRule(text)
        if text.startswith("separator:") and len(text) > len("separator:"):
            return SplitRule("separator", text[len("separator:"):])
    raise InputError(f"unknown prompt split rule {text!r}; choose one of: {', '.join(RULES)}")


def split_prompt(prompt: str, rule: SplitRule) -> tuple[str, str]:
    """(document, question) of a one-message prompt under `rule` (`auto` is `paragraph` here)."""
    kind = "paragraph" if rule.kind == "auto" else rule.kind
    if kind == "messages":
        raise PromptSplitError("the rule 'messages' takes the whole last user message as the question")
    text = prompt.rstrip()
    if kind == "separator":
        at = text.rfind(rule.separator)
        start, end = (at, at + len(rule.separator)) if at >= 0 else (-1, -1)
        where = f"{rule.separator!r}"
    else:
        found = list(_BREAKS[kind].finditer(text))
        start, end = (found[-1].start(), found[-1].end()) if found else (-1, -1)
        where = "blank line" if kind == "paragraph" else "line break"
    if start < 0:
        raise PromptSplitError(f"the prompt has no {where} to find the question after (rule {rule})")
    document, question = text[:start], text[end:].strip()
    if not question:
        raise PromptSplitError(f"nothing follows the last {where} (rule {rule}): no question")
    if not document.strip():
        raise PromptSplitError(f"nothing comes before the last {where} (rule {rule}): no document")
    return document, question

"""Answer extraction (paper: "The workflow", step 4) and think-block handling.

Two final-answer protocols, chosen per run as the reference evaluation does:
- `boxed`: the content of the last closed `\\boxed{...}` (or `\\fbox{...}`) of the reply;
- `phrase`: the text after the last "the answer is" (asterisks removed first, then surrounding
  whitespace and periods stripped), for final prompts that ask for "... the answer is X".

Reasoning models write a `<think> ... </think>` block before their reply; `strip_think` drops
everything up to the last `</think>`, as the reference evaluation does before extracting.
Every function here is linear in the length of the reply (a reply of 200 KB of unclosed
`\\boxed{` is a few milliseconds, not seconds).
"""
from __future__ import annotations

import re

from memagent.config import ANSWER_PROTOCOLS, THINK_MODES

_MARKER = re.compile(r"\\(?:boxed|fbox)\{")
_THINK_END = "</think>"
_PHRASE = "the answer is"


def _brace_matches(text: str) -> dict[int, int]:
    """Position of each `{` that is closed -> position of its `}`, in one left-to-right pass.

    Stack matching gives each `{` the first `}` after it at which the brace depth counted from it
    returns to zero, which is what a scan from that `{` alone would find.
    """
    stack: list[int] = []
    match: dict[int, int] = {}
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            match[stack.pop()] = m.start()
    return match


def extract_boxed(text: str) -> str | None:
    """Return the content of the LAST closed `\\boxed{...}` in `text`, or None when there is none.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`). An unclosed box
    (`\\boxed{abc` at the end of a reply cut by the token limit) counts as no answer, and an
    earlier closed box is used instead. `\\fbox{}` is accepted too, as the reference verifier does.
    """
    opens = [m.end() - 1 for m in _MARKER.finditer(text)]  # positions of the markers' "{"
    if not opens:
        return None
    match = _brace_matches(text)
    for open_at in reversed(opens):
        close = match.get(open_at)
        if close is not None:
            return text[open_at + 1 : close].strip()
    return None


def extract_phrase(text: str) -> str | None:
    """The text after the last "the answer is" (case-sensitive), or None when the phrase is absent.

    Asterisks (Markdown bold) are removed first; then whitespace, then periods, then whitespace
    are stripped from both ends: "**Therefore, the answer is Paris.**" -> "Paris".
    """
    text = text.replace("*", "")
    at = text.rfind(_PHRASE)
    if at < 0:
        return None
    return text[at + len(_PHRASE) :].strip().strip(".").strip()


def extract_answer(text: str, protocol: str = "boxed") -> str | None:
    """The final answer of a reply under `protocol` ("boxed" | "phrase"); None when it has none."""
    if protocol == "boxed":
        return extract_boxed(text)
    if protocol == "phrase":
        return extract_phrase(text)
    raise ValueError(f"unknown answer protocol {protocol!r}; choose one of: {', '.join(ANSWER_PROTOCOLS)}")


def strip_think(text: str) -> tuple[str, bool]:
    """(`text` without everything up to and including its last `</think>`, whether there was one).

    The rest is stripped of surrounding whitespace. A reply with no `</think>` (a model that did
    not think, or one cut off while thinking) comes back unchanged.
    """
    at = text.rfind(_THINK_END)
    if at < 0:
        return text, False
    return text[at + len(_THINK_END) :].strip(), True


def final_answer(text: str, protocol: str = "boxed", think: str = "strip") -> tuple[str | None, bool]:
    """(answer, think_removed): the think block cut out (when `think == "strip"`), then extracted."""
    removed = False
    if think == "strip":
        text, removed = strip_think(text)
    elif think != "keep":
        raise ValueError(f"unknown think mode {think!r}; choose one of: {', '.join(THINK_MODES)}")
    return extract_answer(text, protocol), removed

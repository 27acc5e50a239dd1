"""Answer extraction: the content of the last `\\boxed{...}` of a reply (paper: "The workflow", step 4)."""
from __future__ import annotations

_MARKERS = ("\\boxed{", "\\fbox{")


def extract_boxed(text: str) -> str | None:
    """Return the content of the LAST `\\boxed{...}` in `text`, or None when there is none.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`). An unclosed box
    (`\\boxed{abc` at the end of a reply cut by the token limit) counts as no answer.
    `\\fbox{}` is accepted too, as the reference verifier does.
    """
    start = max(text.rfind(m) for m in _MARKERS)
    while start >= 0:
        open_at = text.index("{", start)
        depth = 0
        for i in range(open_at, len(text)):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[open_at + 1 : i].strip()
        # unclosed: look for an earlier, closed box
        start = max(text.rfind(m, 0, start) for m in _MARKERS)
    return None

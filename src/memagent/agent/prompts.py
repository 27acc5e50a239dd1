"""Prompt templates of the read-write loop (paper: "The workflow", steps 3 and 4).

Templates are plain strings with named placeholders: `{question}`, `{memory}` and `{chunk}` for a
memory update, `{question}` and `{memory}` for the final answer. Placeholders are substituted in a
single pass, so a document that itself contains the text "{memory}" is left alone, and braces
elsewhere (`\\boxed{}`) need no escaping.
"""
from __future__ import annotations

import re

from memagent.errors import MemAgentError

# The paper's shape (our wording): instruction, <problem>, <memory>, <section>, "Updated memory:".
PAPER_MEMORY_TEMPLATE = """You are given a problem, a section of a long article that may hold part of the answer, and your memory of the sections read so far. Read the section carefully and write an updated memory that keeps every detail from the old memory that helps answer the problem and adds any new helpful information from the section. The updated memory replaces the old one.

<problem>
{question}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""

PAPER_FINAL_TEMPLATE = """You are given a problem and your memory of a long article. Answer the problem from the memory and put the final answer in \\boxed{}.

<problem>
{question}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""

MEMORY_FIELDS = ("question", "memory", "chunk")
FINAL_FIELDS = ("question", "memory")
_PLACEHOLDER = re.compile(r"\{(question|memory|chunk)\}")


class TemplateError(MemAgentError, ValueError):
    """A prompt template is missing a placeholder or has one it must not have."""


def check_template(template: str, fields: tuple[str, ...], name: str) -> None:
    """Raise TemplateError unless `template` holds each of `fields` and no other placeholder."""
    found = set(_PLACEHOLDER.findall(template))
    missing = [f for f in fields if f not in found]
    if missing:
        raise TemplateError(
            f"the {name} template lacks the placeholder(s) "
            + ", ".join("{" + f + "}" for f in missing)
            + "; it must contain " + ", ".join("{" + f + "}" for f in fields)
        )
    extra = sorted(found - set(fields))
    if extra:
        raise TemplateError(
            f"the {name} template has placeholder(s) {', '.join('{' + f + '}' for f in extra)} "
            f"that it cannot fill; allowed: {', '.join('{' + f + '}' for f in fields)}"
        )


def render(template: str, **values: str) -> str:
    """Fill the placeholders of `template` in one pass (substituted text is never re-scanned)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)

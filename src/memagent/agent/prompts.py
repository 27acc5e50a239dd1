"""Prompt templates of the read-write loop (paper: "The workflow", steps 3 and 4).

Templates are plain strings with named placeholders: `{question}`, `{memory}` and `{chunk}` for a
memory update, `{question}` and `{memory}` for the final answer. Placeholders are substituted in a
single pass, so a document that itself contains the text "{memory}" is left alone, and braces
elsewhere (`\\boxed{}`) need no escaping. The paper's templates and the placeholder check are
declared in `memagent.config` (the config's defaults and validation) and re-exported here.
"""
from __future__ import annotations

from memagent.config import (
    FINAL_FIELDS,
    MEMORY_FIELDS,
    PAPER_FINAL_TEMPLATE,
    PAPER_MEMORY_TEMPLATE,
    PLACEHOLDER,
    ConfigError,
    check_template,
)

TemplateError = ConfigError  # the error a bad template raises

__all__ = ["FINAL_FIELDS", "MEMORY_FIELDS", "PAPER_FINAL_TEMPLATE", "PAPER_MEMORY_TEMPLATE", "TemplateError",
           "check_template", "render"]


def render(template: str, **values: str) -> str:
    """Fill the placeholders of `template` in one pass (substituted text is never re-scanned)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


# -- the `lookup` workflow (memagent.agent.lookup): the model writes a search query after the last chunk ----------
# Our wording. Placeholders {question} and {memory}; the reply is searched as plain words (memagent.agent.index).
LOOKUP_QUERY_TEMPLATE = """You have read a long article section by section and kept only the memory below. Before you answer the problem you can look back into the article: write a search query, a few keywords (names, numbers, rare terms) that the sections you need to read again contain. Write only the keywords.

<problem>
{question}
</problem>

<memory>
{memory}
</memory>

Search query:
"""

"""Prompt templates of the read-write loop (paper: "The workflow", steps 3 and 4), in our wording.

Templates are plain strings with named placeholders: `{question}`, `{memory}` and `{chunk}` for a
memory update, `{question}` and `{memory}` for the final answer. Placeholders are substituted in a
single pass, so a document that itself contains the text "{memory}" is left alone, and braces
elsewhere (`\\boxed{}`) need no escaping.

A leaf module (it imports nothing from memagent), placed in the base layer: `memagent.config.AgentConfig`
takes the paper's templates as its defaults, and `memagent.config.check_template` (which raises `ConfigError`)
checks a template's placeholders.
"""
from __future__ import annotations

import re

__all__ = ["FINAL_FIELDS", "LOOKUP_QUERY_TEMPLATE", "MEMORY_FIELDS", "PAPER_FINAL_TEMPLATE", "PAPER_MEMORY_TEMPLATE",
           "PLACEHOLDER", "render"]

# The paper's shape (our wording): instruction, <problem>, <memory>, <section>, "Updated memory:". Every prompt
# here is an instruction line, then the question and the memory in these two blocks, then its own ending.
PROBLEM_AND_MEMORY = "\n\n<problem>\n{question}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n"
PAPER_MEMORY_TEMPLATE = (
    "You are given a problem, a section of a long article that may hold part of the answer, and your memory of the sections read so far. Read the section carefully and write an updated memory that keeps every detail from the old memory that helps answer the problem and adds any new helpful information from the section. The updated memory replaces the old one."
    + PROBLEM_AND_MEMORY + "<section>\n{chunk}\n</section>\n\nUpdated memory:\n")

PAPER_FINAL_TEMPLATE = (
    "You are given a problem and your memory of a long article. Answer the problem from the memory and put the final answer in \\boxed{}."
    + PROBLEM_AND_MEMORY + "Your answer:\n")

MEMORY_FIELDS = ("question", "memory", "chunk")
FINAL_FIELDS = ("question", "memory")
PLACEHOLDER = re.compile(r"\{(question|memory|chunk)\}")


def render(template: str, **values: str) -> str:
    """Fill the placeholders of `template` in one pass (substituted text is never re-scanned)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


# -- the `lookup` workflow (memagent.agent.lookup): the model writes a search query after the last chunk ----------
# Our wording. Placeholders {question} and {memory}; the reply is searched as plain words (memagent.documents.index).
LOOKUP_QUERY_TEMPLATE = (
    "You have read a long article section by section and kept only the memory below. Before you answer the problem you can look back into the article: write a search query, a few keywords (names, numbers, rare terms) that the sections you need to read again contain. Write only the keywords."
    + PROBLEM_AND_MEMORY + "Search query:\n")

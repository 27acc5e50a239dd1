"""Configuration of the read-write loop. Defaults follow the paper (docs/paper.md, "The workflow").

The values a config is checked against live here too: `check_template` (the paper's templates, the defaults,
and their placeholders are declared in `memagent.agent.prompts`, a leaf module, and stay importable from
here), the answer protocols and think modes (applied by `memagent.agent.answer`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from memagent.agent.prompts import FINAL_FIELDS, MEMORY_FIELDS, PAPER_FINAL_TEMPLATE, PAPER_MEMORY_TEMPLATE, PLACEHOLDER
from memagent.errors import MemAgentError


class ConfigError(MemAgentError, ValueError):
    """A configuration value is invalid; the message says which and what to do."""


ANSWER_PROTOCOLS = ("boxed", "phrase")
THINK_MODES = ("strip", "keep")  # strip: drop everything up to the last </think>; keep: use the reply as is

def check_template(template: str, fields: tuple[str, ...], name: str) -> None:
    """Raise ConfigError unless `template` holds each of `fields` and no other placeholder."""
    found = set(PLACEHOLDER.findall(template))
    missing = [f for f in fields if f not in found]
    if missing:
        raise ConfigError(
            f"the {name} template lacks the placeholder(s) "
            + ", ".join("{" + f + "}" for f in missing)
            + "; it must contain " + ", ".join("{" + f + "}" for f in fields)
        )
    extra = sorted(found - set(fields))
    if extra:
        raise ConfigError(
            f"the {name} template has placeholder(s) {', '.join('{' + f + '}' for f in extra)} "
            f"that it cannot fill; allowed: {', '.join('{' + f + '}' for f in fields)}"
        )


@dataclass
class AgentConfig:
    """How MemAgent reads a document.

    The paper's window budget: query 1024 + chunk 5000 + memory 1024 + output 1024 + template,
    about 8K tokens, constant whatever the document's length.
    """

    chunk_tokens: int = 5000  # C: tokens of document per memory call (paper: 5000)
    memory_tokens: int = 1024  # M: hard cap on the memory, in tokens of the model's tokenizer
    answer_tokens: int = 1024  # max new tokens of the final answer call
    query_tokens: int = 1024  # budget of the question; a longer question is an error
    memory_template: str = PAPER_MEMORY_TEMPLATE
    final_template: str = PAPER_FINAL_TEMPLATE
    empty_memory: str = "No previous memory"  # the memory before the first chunk (reference code)
    temperature: float = 0.0  # 0 = greedy (evaluation); the paper's rollouts use 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_batch_docs: int = 16  # documents in flight at once; their prompts share one backend batch
    answer_protocol: str = "boxed"  # final answer: "boxed" (last \\boxed{}) or "phrase" (after the last "the answer is")
    think: str = "strip"  # "strip": cut each reply up to its last </think> before the memory cap and the answer; "keep"
    document_tokens: int | None = None  # cut longer documents in the middle to this many tokens (reference eval: 120000)

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens", "max_batch_docs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.document_tokens is not None and (not isinstance(self.document_tokens, int) or self.document_tokens <= 0):
            raise ConfigError(f"document_tokens must be a positive integer or None, got {self.document_tokens!r}")
        if self.answer_protocol not in ANSWER_PROTOCOLS:
            raise ConfigError(f"answer_protocol must be one of {', '.join(ANSWER_PROTOCOLS)}; got {self.answer_protocol!r}")
        if self.think not in THINK_MODES:
            raise ConfigError(f"think must be one of {', '.join(THINK_MODES)}; got {self.think!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        check_template(self.memory_template, MEMORY_FIELDS, "memory")
        check_template(self.final_template, FINAL_FIELDS, "final")

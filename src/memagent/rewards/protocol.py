"""What a reward sees and returns: the one `Reward` protocol, of two kinds.

- An *outcome* reward scores a rollout's final answer: `score(items: Sequence[Answered]) -> list[float]`,
  one value per item. Today's `boxed` verifier, EM, F1, sub-EM (memagent.tasks.metrics) and the judge
  (memagent.rewards.judge) are outcome rewards. This is the paper's only reward (docs/paper.md,
  "Multi-Conv DAPO": the reward is computed on the final answer).
- A *step* reward scores one conversation of a rollout given its sample: `score(items: Sequence[Update])
  -> list[float | None]`. None means "this reward does not score this conversation" (a final answer, a
  lookup query, a sample without gold evidence); that row keeps the outcome advantage
  (memagent.rl.step_rewards). NOT in the paper: ReMemR1 / IGPO-style credit per memory update.

Both are batched (a list in, a list out) so a reward that asks a model (the judge, `answer-likelihood`)
makes one call per rollout batch, not one per item. A reward is built by name from the registry
(memagent.rewards.registry) as `factory(**options)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

KINDS = ("outcome", "step")


@dataclass(frozen=True)
class Answered:
    """One final answer to score (outcome rewards)."""

    question: str
    reply: str | None  # the final reply's text as the model wrote it (None: no reply)
    answers: tuple[str, ...]  # the gold answers


@dataclass(frozen=True)
class Update:
    """One conversation of a rollout, with what its sample knows (step rewards).

    For a memory update (`kind == "memory"`) `before` is the memory the call read and `after` the memory it
    wrote; for any other kind both are the memory at that call (`after` is the reply for a final answer)."""

    question: str
    answers: tuple[str, ...]  # gold answers
    evidence: tuple[str, ...] | None  # gold supporting strings; None: the sample carries none
    kind: str  # "memory" | "final" | a workflow's own ("query", ...)
    step: int  # the conversation's step index (chunk index of a memory update)
    before: str  # the memory before the call
    after: str  # the memory after the call (the reply of a final answer)
    chunk: str | None = None  # the chunk read, when the caller has it (memagent's memory updates)


@runtime_checkable
class Reward(Protocol):
    """A reward: `kind` "outcome" (scores Answered items) or "step" (scores Update items, None = not scored)."""

    name: str
    kind: str

    def score(self, items: Sequence[Any]) -> list[Any]:
        ...

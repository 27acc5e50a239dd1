"""How a prediction is scored against its golds: the options that differ between evaluation protocols.

The metrics themselves (`memagent.tasks.metrics`) are pure `metric(prediction, golds) -> float`; these options
say which golds they see, what a missing prediction is worth and whether failed samples count.
"""
from __future__ import annotations

from dataclasses import dataclass

from memagent.errors import MemAgentError

GOLDS = ("all", "first")
EMPTY = ("zero", "text")
FAILED = ("wrong", "skip")


class ScoringError(MemAgentError, ValueError):
    """A scoring option has a value no protocol uses."""


@dataclass(frozen=True)
class ScoreOptions:
    golds: str = "all"  # "all": best over every gold answer; "first": the first gold only (official RULER-HQA eval)
    empty: str = "zero"  # no/empty prediction: "zero" scores 0; "text" scores "" as text (substring rules then match)
    failed: str = "wrong"  # a sample whose model calls failed: "wrong" counts 0 in means; "skip" leaves it out

    def __post_init__(self) -> None:
        for name, allowed in (("golds", GOLDS), ("empty", EMPTY), ("failed", FAILED)):
            value = getattr(self, name)
            if value not in allowed:
                raise ScoringError(f"scoring.{name} must be one of {', '.join(allowed)}; got {value!r}")

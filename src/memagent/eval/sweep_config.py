"""The settings of an evaluation sweep (`SweepConfig`): which methods, the agent's budgets, the baselines'
window and prompt, how many samples and repeats, the scoring, the workflows' own options.

Every field not listed in `memagent.eval.records.NON_RESULT` is in the records' settings fingerprint, so a
changed setting computes anew and an unchanged one resumes. A SweepConfig is frozen and checked as it is built;
what is derived from it (each method's records fingerprint, each workflow bound to its options) is computed once,
on first use, and passed down with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

from memagent.agent.registry import BoundWorkflow, bind_workflow, workflow_names
from memagent.config import AgentConfig, WorkflowChoice
from memagent.eval.baselines import BASELINE_TEMPLATE, EvalError
from memagent.eval.records import fingerprint
from memagent.eval.scoring import ScoreOptions
from memagent.eval.workflow_runs import BASELINES, check_methods, is_workflow, method_fingerprint

__all__ = ["BASELINES", "METHODS", "SweepConfig", "refuse_unknown_methods"]

METHODS = ("memagent", "full-context", "rag-bm25")  # the default; any workflow name is a method too


def refuse_unknown_methods(methods: Sequence[str], flag: str = "") -> None:
    """EvalError for an empty list or a name that is neither a baseline nor a known workflow (`flag`: the option
    that named them, e.g. `--methods`, said first in the message)."""
    unknown = check_methods(methods)
    if unknown or not methods:
        raise EvalError(f"{flag + ': ' if flag else ''}unknown method(s) {unknown}; choose from the baselines "
                        f"{', '.join(BASELINES)} or the workflows {', '.join(workflow_names())}")


@dataclass(frozen=True)
class SweepConfig:
    model_name: str  # the row label of the table (a model id or path)
    methods: Sequence[str] = METHODS  # baselines and workflows (memagent.agent.registry) by name
    agent: AgentConfig = field(default_factory=AgentConfig)  # MemAgent's budget; answer_tokens for all
    window: int | None = None  # the baselines' context window (default: the backend's)
    baseline_answer_tokens: int | None = None  # the baselines' max new tokens (default: agent.answer_tokens)
    baseline_template: str = BASELINE_TEMPLATE  # the baselines' prompt: {question} and {context}
    passage_tokens: int = 512  # rag-bm25 passage size
    limit: int | None = None  # at most this many samples of each data file
    repeats: int = 1  # runs of each sample, repeat r with seed agent.seed + r (base 0 when None)
    scoring: ScoreOptions = field(default_factory=ScoreOptions)
    backend_settings: dict[str, Any] = field(default_factory=dict)  # backend kind, dtype ...: they change replies
    workflows: tuple[WorkflowChoice, ...] = ()  # the workflows' own options, `{name, options}` each (a workflow of
    #   `methods` not listed has none); in that workflow's record fingerprint (eval.workflow_runs.method_fingerprint)
    rewards: tuple[str, ...] = ()  # rewards each record keeps the value of (the profile's reward and step_reward;
    #   memagent.eval.rewards): read off the replies, not a setting of them (NON_RESULT)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workflows", tuple(self.workflows))
        refuse_unknown_methods(self.methods)
        if not isinstance(self.repeats, int) or isinstance(self.repeats, bool) or self.repeats < 1:
            raise EvalError(f"repeats must be a positive integer, got {self.repeats!r}")
        for name in ("limit", "window", "passage_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise EvalError(f"{name} must be a positive integer, got {value!r}")

    def options(self, method: str) -> dict[str, Any]:
        """The own options of workflow `method` ({} for a baseline or a workflow without any)."""
        return next((dict(w.options) for w in self.workflows if w.name == method), {})

    @cached_property
    def fingerprints(self) -> dict[str, str]:
        """{method: the settings fingerprint of its records}: the sweep's own (`memagent.eval.records.fingerprint`,
        computed once) with a workflow's name and options folded in (eval.workflow_runs.method_fingerprint)."""
        base = fingerprint(self)
        return {"": base, **{m: method_fingerprint(base, m, self.options(m)) for m in self.methods}}

    @cached_property
    def bound(self) -> dict[str, BoundWorkflow]:
        """{workflow method: the workflow bound to its own options} (memagent.agent.registry.bind_workflow: looked
        up and checked once, before any model is loaded)."""
        return {m: bind_workflow(m, self.options(m)) for m in self.methods if is_workflow(m)}

    def seed(self, repeat: int) -> int:
        """The sampling seed of repeat `repeat`: agent.seed (0 when None) + repeat."""
        return (self.agent.seed or 0) + repeat

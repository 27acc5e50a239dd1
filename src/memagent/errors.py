"""The exceptions that mean "the user must change something"; the CLI prints them as one line."""
from __future__ import annotations

from memagent.agent.chunking import DocumentError
from memagent.agent.prompts import TemplateError
from memagent.agent.workflow import BudgetError
from memagent.backends.base import BackendError
from memagent.config import ConfigError
from memagent.eval.baselines import EvalError
from memagent.eval.flops import FlopsError
from memagent.tasks.metrics import MetricError
from memagent.tasks.schema import DataError


class InputError(ValueError):
    """A malformed input file or argument (JSONL line, missing field, ...)."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    DocumentError, TemplateError, BudgetError, BackendError, ConfigError, InputError, FileNotFoundError, FileExistsError,
    DataError, MetricError, FlopsError, EvalError,
)

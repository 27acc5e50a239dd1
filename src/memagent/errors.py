"""The base of every error that means "the user must change something".

A leaf module: it imports nothing from memagent, and each layer subclasses `MemAgentError` for its own
errors (`DocumentError`, `BudgetError`, `BackendError`, `ConfigError`, `DataError`, `EvalError`, ...).
The CLI catches the base and prints one `error: ...` line with exit code 2.
"""
from __future__ import annotations


class MemAgentError(Exception):
    """A failure the user can fix; the message says what to do."""


class InputError(MemAgentError, ValueError):
    """A malformed input file or argument (JSONL line, missing field, ...)."""

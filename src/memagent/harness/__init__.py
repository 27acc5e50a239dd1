"""Evaluation harnesses as clients of MemAgent: an lm-evaluation-harness model (`memagent.harness.lm_eval`,
registered as `memagent`) and an Inspect AI model API (`memagent.harness.inspect`, `--model memagent/...`).

Only these modules import `lm_eval` / `inspect_ai` (the `harness` extra); `runner` is the part they share:
options to a backend and config, one-message prompts through the read-write loop, continuation scores.
"""
from __future__ import annotations

import importlib.util

from memagent.errors import InputError


def require(package: str, extra: str = "harness") -> None:
    """Raise a clear MemAgentError when an optional harness package is not installed."""
    if importlib.util.find_spec(package) is None:
        raise InputError(f"{package} is not installed; pip install 'memagent[{extra}]' (lm-eval and inspect-ai)")

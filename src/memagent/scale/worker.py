"""The Ray actor: one backend (an endpoint's client or an in-process engine), built once, that runs units of
`ask` (a batch of questions) or `eval` (a unit of the sweep: samples of one method and repeat) and returns their
results to the driver; it writes no file.
"""
from __future__ import annotations

import functools
import io
import os
import socket
from typing import Any, Callable, Sequence

from memagent.agent.registry import DEFAULT_WORKFLOW, build_workflow, run_workflow
from memagent.errors import MemAgentError
from memagent.progress import quiet_libraries
from memagent.eval.sweep_config import SweepConfig
from memagent.eval.unit_run import check_settings, run_unit
from memagent.eval.units import Unit
from memagent.protocol.profile import open_backend
from memagent.scale.pool import Raised
from memagent.tasks.schema import ParagraphCache

__all__ = ["ShardWorker"]


def _returns_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """A MemAgentError raised by `method` is returned as `Raised` (the driver raises it)."""

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except MemAgentError as e:
            return Raised(e)

    return run


class ShardWorker:
    """Built by Ray in its own process: `model` through `backend` (BackendOptions) with `profile`'s
    chat-template arguments and YaRN factor. A failure to build is kept and raised by `ready()`, so the
    driver reports it as the error it is rather than as a lost actor."""

    def __init__(self, model: str, backend: Any, profile: Any) -> None:
        self.error: BaseException | None = None
        self.backend: Any = None
        self.docs = ParagraphCache()  # lazy samples' paragraphs, read once per actor
        self.runners: dict[str, Any] = {}  # the sweep's workflows on this backend, built once (check_eval)
        quiet_libraries()  # no weight-loading bars from every actor in the driver's log
        try:
            self.backend = open_backend(model, backend, profile)
        except Exception as e:  # noqa: BLE001  (given back by ready())
            self.error = e

    @_returns_errors
    def ready(self) -> str:
        """'host:pid' of this actor once its backend is built; the build's error otherwise."""
        if self.error is not None:
            raise self.error
        return f"{socket.gethostname()}:{os.getpid()}"

    @_returns_errors
    def ask(self, items: Sequence[Any], config: Any, errors: str, trace: bool, trace_chunks: bool,
            workflow: str = DEFAULT_WORKFLOW, workflow_options: dict | None = None) -> tuple[list[Any], str]:
        """(results of `items` (AgentInput) in input order, their trace as JSONL text, '' without one); read by
        the workflow named `workflow` (memagent.agent.registry) with its own options."""
        buf = io.StringIO() if trace else None
        agent = build_workflow(workflow, self.backend, config, trace_path=buf, errors=errors,
                               trace_chunks=trace_chunks, failures="record",  # a failed document is a result
                               **(workflow_options or {}))
        results = run_workflow(agent, list(items))
        for r in results:
            r.conversations = []  # token ids stay here: the driver writes only the text fields
        return results, buf.getvalue() if buf is not None else ""

    @_returns_errors
    def check_eval(self, cfg: SweepConfig) -> None:
        """The sweep's settings against this backend's window (a run no sample can pass fails at once)."""
        self.runners = check_settings(self.backend, cfg)

    @_returns_errors
    def eval_unit(self, cfg: SweepConfig, unit: Unit) -> list[dict]:
        """The records of one unit of the sweep, as the local sweep makes them (`memagent.eval.unit_run.run_unit`)."""
        return run_unit(self.backend, cfg, unit, self.docs, self.runners)

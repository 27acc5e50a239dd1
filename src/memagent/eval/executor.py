"""Where a sweep's units run: the `Executor` protocol and `LocalExecutor` (in this process, on one backend).

An executor takes the sweep's settings and its pending units (`memagent.eval.units.plan_units`, lazy) and
calls `emit(records)` with the records of each unit as it finishes (in finishing order; a streaming executor
may emit one sample's record at a time). `emit` writes them to the results file and may raise (the failure
cap) to stop the run; the executor then stops and lets the error through. Executors write no file. The Ray
executor (`memagent.scale.executor.RayExecutor`) runs units on Ray actors.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from memagent.agent.scheduler import concurrent
from memagent.eval.sweep_config import SweepConfig
from memagent.eval.unit_run import check_settings, run_stream, run_unit
from memagent.eval.units import Unit
from memagent.eval.workflow_runs import is_workflow
from memagent.tasks.schema import ParagraphCache

__all__ = ["Emit", "Executor", "LocalExecutor"]

Emit = Callable[[list[dict]], None]  # the records of a finished unit (or of one streamed sample) to write


@runtime_checkable
class Executor(Protocol):
    """Runs a sweep's units somewhere."""

    def run_units(self, cfg: SweepConfig, units: Iterable[Unit], emit: Emit, progress: bool = False) -> None:
        """Check `cfg` against the backend (before any model call, `check_settings`), then run every unit of
        `units` (drawn lazily), calling `emit` with each one's records (a list of record dicts, one per work)
        as it finishes. `progress`: the sweep shows a line per record (an executor may add its own)."""
        ...


class LocalExecutor:
    """The units run here, one after another, on `backend` (a `memagent.backends.base.Backend`). A workflow on
    a concurrent (HTTP) backend runs each method-and-repeat's units as one stream (no batches: a sample starts
    as another finishes, each record emitted as its sample finishes); everything else unit by unit."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.docs = ParagraphCache()  # lazy samples' paragraphs, read once per sweep

    def run_units(self, cfg: SweepConfig, units: Iterable[Unit], emit: Emit, progress: bool = False) -> None:
        runners = check_settings(self.backend, cfg)  # each workflow built once; a unit binds its own run
        stream = concurrent(self.backend)
        for (method, _), same in itertools.groupby(units, key=lambda u: (u.method, u.repeat)):
            if stream and is_workflow(method):
                held = list(same) if progress else same  # the progress line needs the number before the first
                total = sum(len(u) for u in held) if progress else None
                run_stream(self.backend, cfg, held, self.docs, emit, total, runners[method])
                continue
            for unit in same:
                emit(run_unit(self.backend, cfg, unit, self.docs, runners))

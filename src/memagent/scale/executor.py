"""`RayExecutor`: the sweep's units (`memagent.eval.units.Unit`) run on Ray actors, one backend each.

It is an `memagent.eval.executor.Executor`: `memagent.eval.sweep.sweep(RayExecutor(...), ...)` is the same sweep
as the local one (the same pending units, records and resume), its units spread over the actors by a
`ShardPool`; the driver process alone writes the results file, in the order units finish. No actor (nor model)
is started when no unit is pending. Ray itself is imported only when the pool connects.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable

from memagent.eval.executor import Emit
from memagent.eval.sweep_config import SweepConfig
from memagent.eval.units import Unit
from memagent.scale.options import RayOptions
from memagent.scale.runs import PoolHook, open_pool

__all__ = ["RayExecutor", "ray_executor"]


class RayExecutor:
    """Units of the sweep on the actors of `ray_opts` (`--ray`, `--ray-workers`), each actor building `model`
    through `backend` (BackendOptions) with `profile`'s chat-template arguments and YaRN factor. `hook(pool, n)`
    is called once every actor is ready (n = 0) and after each finished unit (n = units so far): tests kill an
    actor there."""

    def __init__(self, model: str, backend: Any, profile: Any, ray_opts: RayOptions,
                 hook: PoolHook | None = None) -> None:
        self.model, self.backend, self.profile, self.ray_opts, self.hook = model, backend, profile, ray_opts, hook

    def run_units(self, cfg: SweepConfig, units: Iterable[Unit], emit: Emit, progress: bool = False) -> None:
        """Start the actors (only when a unit is pending), check `cfg` on one of them, run every unit on them
        (at most `ShardPool.depth` queued on an actor; a lost actor's units go to the others), `emit` each
        unit's records as it comes back; the actors end when this returns or raises."""
        units = iter(units)
        first = next(units, None)
        if first is None:  # everything is done: no actor (nor model) is started
            return
        pool = open_pool(self.model, self.backend, self.profile, self.ray_opts)
        try:
            if self.hook:
                self.hook(pool, 0)  # every actor ready
            pool.call_one("check_eval", cfg)
            for n, (_, records) in enumerate(pool.run(itertools.chain([first], units), "eval_unit",
                                                      lambda unit: (cfg, unit)), 1):
                emit(records)
                if self.hook:
                    self.hook(pool, n)
        finally:
            pool.close()


def ray_executor(model: str, backend: Any, ray_opts: RayOptions) -> Callable[[Any], RayExecutor]:
    """The executor `memagent eval --ray` runs with, once its profile is resolved: profile -> RayExecutor."""
    return lambda profile: RayExecutor(model, backend, profile, ray_opts)

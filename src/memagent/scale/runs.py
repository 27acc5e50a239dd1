"""The Ray runner's pool of actors (`open_pool`) and the driver of `ask --input` on it (`ray_ask`). The driver
hands the actors units of work through a `ShardPool` and is the only writer of the run's output (through the
caller's `on_result`), so a rerun resumes exactly as after the plain runner. Unit = the plain runner's batch:
`--batch-docs` questions. `eval --ray` is the plain sweep with a `memagent.scale.executor.RayExecutor`.
"""
from __future__ import annotations

import sys
from typing import IO, Any, Callable, Iterator, Optional, Sequence

from memagent.config import DEFAULT_WORKFLOW
from memagent.scale.options import RayOptions, plan_workers
from memagent.scale.pool import ShardPool, cluster_gpus, connect
from memagent.scale.worker import ShardWorker

__all__ = ["PoolHook", "open_pool", "ray_ask"]

PoolHook = Callable[[ShardPool, int], None]  # (pool, units finished): 0 once every actor is ready, then after each unit


def open_pool(model: str, backend: Any, profile: Any, ray_opts: RayOptions) -> ShardPool:
    """Connect to Ray, start the actors of the run and wait until each has built its backend."""
    backend.kwargs()  # a flag of another backend fails here, before Ray starts
    ray = connect(ray_opts.address or "local")
    specs = plan_workers(backend, ray_opts.workers, cluster_gpus(ray))
    pool = ShardPool(ray, ShardWorker, specs, lambda s: (model, s.backend, profile))
    try:
        pool.ready()
    except BaseException:
        pool.close()
        raise
    return pool


def _batches(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def ray_ask(model: str, backend: Any, profile: Any, config: Any, items: Sequence[Any],
            on_result: Callable[[Any], None], trace: Optional[IO[str]], ray_opts: RayOptions, *,
            errors: str = "strict", trace_chunks: bool = False, progress: bool = False,
            hook: PoolHook | None = None, workflow: str = DEFAULT_WORKFLOW,
            workflow_options: dict[str, Any] | None = None) -> int:
    """Answer `items` (AgentInput) on Ray actors, `config.max_batch_docs` questions a unit, read by `workflow` with
    its own `workflow_options`; each result goes to `on_result` and its trace records to `trace` as its unit
    finishes. Returns the number answered."""
    pool = open_pool(model, backend, profile, ray_opts)
    done = 0
    try:
        if hook:
            hook(pool, 0)  # every actor ready
        units = _batches(items, config.max_batch_docs)
        args = lambda unit: (unit, config, errors, trace is not None, trace_chunks, workflow,  # noqa: E731
                             workflow_options)
        for n, (unit, (results, trace_text)) in enumerate(pool.run(units, "ask", args), 1):
            for r in results:
                on_result(r)
            if trace is not None:
                trace.write(trace_text)
                trace.flush()
            done += len(results)
            if progress:
                print(f"ray: {done}/{len(items)} questions answered", file=sys.stderr)
            if hook:
                hook(pool, n)
    finally:
        pool.close()
    return done

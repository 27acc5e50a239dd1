"""The two drivers of the Ray runner. Each plans its actors, hands them units of work through a `ShardPool`,
and is the only writer of the run's results file: `ask --input`'s --output (through the caller's
`on_result`) and `eval`'s results.jsonl, appended and flushed as each unit comes back, so a rerun resumes
exactly as after the plain runner. Unit = the plain runner's batch: `--batch-docs` questions (ask), or one
sweep group of `--batch-docs` samples of one method and repeat (eval).
"""
from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, Sequence

from memagent.scale.options import RayOptions, plan_workers
from memagent.scale.pool import ShardPool, cluster_gpus, connect
from memagent.scale.worker import ShardWorker

__all__ = ["open_pool", "ray_ask", "ray_sweep"]

PoolHook = Callable[[ShardPool, int], None]  # (pool, units finished): 0 once every actor is ready, then after each unit


def open_pool(model: str, backend: Any, profile: Any, ray_opts: RayOptions) -> ShardPool:
    """Connect to Ray, start the actors of the run and wait until each has built its backend."""
    ray_opts.check()
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
            hook: PoolHook | None = None, workflow: str = "memagent") -> int:
    """Answer `items` (AgentInput) on Ray actors, `config.max_batch_docs` questions a unit; each result goes
    to `on_result` and its trace records to `trace` as its unit finishes. Returns the number answered."""
    pool = open_pool(model, backend, profile, ray_opts)
    done = 0
    try:
        if hook:
            hook(pool, 0)  # every actor ready
        units = _batches(items, config.max_batch_docs)
        args = lambda unit: (unit, config, errors, trace is not None, trace_chunks, workflow)  # noqa: E731
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


def ray_sweep(model: str, backend: Any, profile: Any, datas: Sequence[Any], out: Path, cfg: Any,
              ray_opts: RayOptions, progress: bool, retry_failed: bool, max_failures: Optional[int],
              hook: PoolHook | None = None) -> Path:
    """`memagent.eval.sweep.sweep` with the groups run on Ray actors: the same pending samples, groups,
    records and resume; records are written by this process alone, in the order groups finish."""
    from memagent.eval.baselines import EvalError
    from memagent.eval.records import failures_message, latest, load_records, rescore_stale
    from memagent.eval.sweep import _bar, _fp, _groups, _pending, _progress_line

    results = out / "results.jsonl"
    done = latest(load_records(results))
    rescore_stale(results, done, cfg.scoring)
    bar = _bar(progress)
    failed: list[dict] = []
    units = ((method, group) for method in cfg.methods for repeat in range(cfg.repeats)  # each method its fingerprint
             for group in _groups(_pending(cfg, method, repeat, datas, done, retry_failed, _fp(cfg, method)),
                                  cfg.agent.max_batch_docs))
    first = next(units, None)
    if first is None:  # everything is done: no actor (nor model) is started
        return results
    units = itertools.chain([first], units)
    pool = open_pool(model, backend, profile, ray_opts)
    try:
        if hook:
            hook(pool, 0)  # every actor ready
        pool.call_one("check_eval", cfg)
        with open(results, "a", encoding="utf-8") as fh:
            args = lambda unit: (cfg, unit[0], unit[1], _fp(cfg, unit[0]))  # noqa: E731
            for n, (_, records) in enumerate(pool.run(units, "eval_group", args), 1):
                for rec in records:
                    _append(fh, rec)
                    if bar:
                        bar(_progress_line(rec))
                    if rec["status"] == "error":
                        failed.append(rec)
                if hook:
                    hook(pool, n)
                if max_failures is not None and len(failed) >= max_failures:
                    raise EvalError(failures_message(failed, max_failures, results))
    finally:
        pool.close()
    return results


def _append(fh: IO[str], rec: dict) -> None:
    """One record, on disk before the next (a crash loses at most a torn last line, dropped on resume)."""
    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())

"""The actor pool of the Ray runner: it starts one actor per `WorkerSpec`, hands each at most `depth`
units of work at a time, yields results as they finish (finishing order), and when an actor is lost
(killed, its node gone) puts the units it still held back at the front of the queue for the others:
a unit's result is yielded once, by the one actor that finished it.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from memagent.errors import MemAgentError
from memagent.scale.options import WorkerSpec

log = logging.getLogger(__name__)

__all__ = ["Raised", "RayRunError", "ShardPool", "connect"]


class RayRunError(MemAgentError, RuntimeError):
    """Ray is missing, cannot be reached, or every actor of the run was lost."""


class Raised:
    """What an actor returns instead of raising a MemAgentError (bad input, a backend that gave up): the
    driver raises it as the one-line error it is, and Ray logs no traceback for it."""

    def __init__(self, error: MemAgentError) -> None:
        self.error = error


def connect(address: str) -> Any:
    """The `ray` module, connected: the running instance when this process already has one, else
    `ray.init(address)` (`local`: a new instance on this machine; `auto`: the cluster of `ray start`)."""
    try:
        import ray  # lazy: ray
    except ImportError:
        raise RayRunError("--ray needs Ray: pip install 'memagent[ray]' (or pip install ray)") from None
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayRunError(f"--ray {address}: cannot reach a Ray instance ({e}); start one with `ray start "
                          "--head` and give --ray auto, or give --ray alone for a local instance") from None
    return ray


def cluster_gpus(ray: Any) -> float:
    """GPUs the connected Ray cluster has in all."""
    return float(ray.cluster_resources().get("GPU", 0.0))


class ShardPool:
    """Actors of class `worker_cls` (one per spec), built with `make_args(spec)`; `run` spreads work."""

    def __init__(self, ray: Any, worker_cls: type, specs: Sequence[WorkerSpec],
                 make_args: Callable[[WorkerSpec], tuple], depth: int = 2) -> None:
        self.ray = ray
        self.depth = depth  # units queued on one actor: the next is there the moment one finishes
        remote = ray.remote(worker_cls)
        self.actors = [remote.options(num_cpus=s.num_cpus, num_gpus=s.num_gpus, max_concurrency=1)
                       .remote(*make_args(s)) for s in specs]
        self.lost = 0  # actors lost during the run
        self.requeued = 0  # units given again to another actor

    def ready(self) -> list[str]:
        """Wait until every actor has built its backend (an error there is raised here, as itself)."""
        try:
            return [self._get(ref) for ref in [a.ready.remote() for a in self.actors]]
        except self.ray.exceptions.RayActorError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RayRunError(f"a Ray actor could not start ({first}); memagent must be installed (pip install "
                              "'memagent[ray]') in the Python environment of every Ray node") from None

    def call_one(self, method: str, *args: Any) -> Any:
        """`method(*args)` on one actor, its result (e.g. a check of the settings before the run)."""
        return self._get(getattr(self.actors[0], method).remote(*args))

    def run(self, units: Iterable[Any], method: str, args: Callable[[Any], tuple] = lambda u: (u,)
            ) -> Iterator[tuple[Any, Any]]:
        """(unit, actor.method(*args(unit))) for every unit, in finishing order; units are drawn from
        `units` only as actors have room, so a long iterator is never held whole."""
        source, retry = iter(units), deque()
        live = list(self.actors)
        inflight: dict[Any, tuple[Any, Any]] = {}  # object ref -> (actor, unit)
        exhausted = False
        while True:
            for actor in list(live):
                while sum(a is actor for a, _ in inflight.values()) < self.depth:
                    unit = retry.popleft() if retry else None
                    if unit is None and not exhausted:
                        unit = next(source, None)
                        exhausted = unit is None
                    if unit is None:
                        break
                    inflight[getattr(actor, method).remote(*args(unit))] = (actor, unit)
            if not inflight:
                if retry or not exhausted:
                    raise RayRunError(f"every Ray actor of the run was lost ({self.lost}); the results so far "
                                      "are saved: run the command again to resume")
                return
            (ref,), _ = self.ray.wait(list(inflight), num_returns=1)
            actor, unit = inflight.pop(ref)
            try:
                result = self._get(ref)
            except self.ray.exceptions.RayActorError as e:
                if any(a is actor for a in live):
                    live.remove(actor)
                    self.lost += 1
                    log.warning("a Ray actor was lost (%s); its unfinished work goes to the others",
                                str(e).splitlines()[0] if str(e) else type(e).__name__)
                retry.appendleft(unit)
                self.requeued += 1
                continue
            yield unit, result

    def _get(self, ref: Any) -> Any:
        """ray.get, with an error raised inside an actor re-raised as itself (a MemAgentError is one line)."""
        try:
            value = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, MemAgentError):
                raise cause from None
            raise
        if isinstance(value, Raised):
            raise value.error
        return value

    def close(self) -> None:
        """End the actors (their backends and engines go with them)."""
        for actor in self.actors:
            self.ray.kill(actor)

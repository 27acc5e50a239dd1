"""The actor pool's bookkeeping against a fake Ray (fast, no Ray): work of a lost actor goes to another, each
unit's result comes back once, every actor lost is an error, an error inside an actor is raised as itself."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from memagent.errors import InputError
from memagent.scale.options import WorkerSpec
from memagent.scale.pool import Raised, RayRunError, ShardPool


class _ActorError(Exception):
    pass


class _TaskError(Exception):
    pass


class FakeRay:
    """Refs resolve in submission order; a killed actor's refs raise the actor error, as Ray's do."""

    exceptions = SimpleNamespace(RayActorError=_ActorError, RayTaskError=_TaskError)

    def remote(self, cls):
        return SimpleNamespace(options=lambda **kw: SimpleNamespace(remote=lambda *a: _Actor(cls(*a))))

    def wait(self, refs, num_returns=1):
        return refs[:1], refs[1:]

    def get(self, ref):
        actor, method, args = ref
        if actor.dead:
            raise _ActorError("actor died")
        return getattr(actor.obj, method)(*args)

    def kill(self, actor):
        actor.dead = True


class _Actor:
    def __init__(self, obj):
        self.obj, self.dead = obj, False

    def __getattr__(self, method):
        return SimpleNamespace(remote=lambda *args: (self, method, args))


class Times10:
    def __init__(self, *args):
        pass

    def ready(self):
        return "ok"

    def work(self, x):
        return Raised(InputError(f"bad unit {x}")) if x < 0 else x * 10


def _pool(n):
    return ShardPool(FakeRay(), Times10, [WorkerSpec(None, 1.0, 0.0)] * n, lambda s: ())


def test_a_lost_actors_units_go_to_the_other_once_each():
    pool = _pool(2)
    assert pool.ready() == ["ok", "ok"]
    got = []
    for unit, result in pool.run(range(7), "work"):
        got.append((unit, result))
        if len(got) == 1:  # actor 0 (units 0, 1) finished unit 0; it is given unit 4 before its loss shows
            pool.ray.kill(pool.actors[0])
    assert sorted(got) == [(u, 10 * u) for u in range(7)]  # nothing lost, nothing twice
    assert pool.lost == 1 and pool.requeued == 2  # units 1 and 4, done by actor 1


def test_every_actor_lost_is_an_error_and_an_actors_error_is_itself():
    pool = _pool(2)
    with pytest.raises(RayRunError, match=r"every Ray actor of the run was lost \(2\)"):
        for _ in pool.run(range(5), "work"):
            pool.close()  # kills both: the units they held have nowhere to go
    with pytest.raises(InputError, match="bad unit -1"):
        list(_pool(1).run([3, -1], "work"))


def test_an_actor_that_cannot_start_says_what_to_install():
    pool = _pool(2)
    pool.ray.kill(pool.actors[1])  # as an actor whose process could not import memagent
    with pytest.raises(RayRunError, match=r"a Ray actor could not start \(actor died\); memagent must be installed"):
        pool.ready()

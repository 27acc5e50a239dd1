"""Rewards by name: the built-ins, and third-party ones registered through the entry-point group
`memagent.rewards` (the way memagent.agent.registry finds workflows).

A factory builds a reward as `factory(**options)`; the result follows memagent.rewards.protocol.Reward (a
`name`, a `kind` "outcome" or "step", a batched `score`). Built-ins are named by "module:attribute" and imported
only when asked for; an entry point's value is "module:factory"
(`[project.entry-points."memagent.rewards"] mine = "pkg.mod:build"`).

Outcome built-ins: every answer metric of memagent.tasks.metrics (`boxed` the paper's verifier, `em`, `f1`,
`sub_em`, ...) and `judge` (a model grades the answer, memagent.rewards.judge). Step built-ins: `evidence`,
`evidence-chain`, `answer-recall`, `answer-likelihood` (memagent.rewards.step).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from memagent.errors import MemAgentError
from memagent.plugins import Registry, import_target
from memagent.rewards.protocol import KINDS, Answered, Reward
from memagent.tasks.metrics import METRICS, RewardFn

ENTRY_POINT_GROUP = "memagent.rewards"
DEFAULT_REWARD = "boxed"  # the paper's verifier

RewardFactory = Callable[..., Reward]

# name -> "module:attribute" (step rewards and the judge); the metrics are added below, one factory each
BUILTINS: dict[str, str] = {
    "evidence": "memagent.rewards.step:EvidenceReward",
    "evidence-chain": "memagent.rewards.step:EvidenceChainReward",
    "answer-recall": "memagent.rewards.step:AnswerRecallReward",
    "answer-likelihood": "memagent.rewards.step:AnswerLikelihoodReward",
    "judge": "memagent.rewards.judge:JudgeReward",
}


class UnknownReward(MemAgentError, ValueError):
    """A reward name that is neither built in, registered, nor an installed entry point (or of the wrong kind)."""


class MetricReward:
    """An outcome reward from a metric `fn(prediction, golds) -> float` (memagent.tasks.metrics), or from any
    plain `RewardFn` (what `train(reward_fn=...)` takes)."""

    kind = "outcome"

    def __init__(self, name: str, fn: RewardFn) -> None:
        self.name, self.fn = name, fn

    def score(self, items: Sequence[Answered]) -> list[float]:
        return [float(self.fn(it.reply, it.answers)) for it in items]


def _metric_factory(name: str) -> RewardFactory:
    def build(**options: Any) -> MetricReward:
        if options:
            raise UnknownReward(f"reward {name!r} takes no options, got {', '.join(sorted(options))}")
        return MetricReward(name, METRICS[name])
    return build


_REGISTRY = Registry(ENTRY_POINT_GROUP, "reward")


def register_reward(name: str, factory: RewardFactory) -> None:
    """Make `factory` the reward called `name` in this process (it replaces a built-in or entry point)."""
    _REGISTRY.register(name, factory)


def unregister_reward(name: str) -> None:
    _REGISTRY.unregister(name)


def refresh_entry_points() -> None:
    """Read the installed entry points again on the next lookup."""
    _REGISTRY.refresh()


def reward_names() -> list[str]:
    """Every reward name known (sorted): metrics, built-ins, registered, installed entry points."""
    return sorted(set(METRICS) | set(BUILTINS) | set(_REGISTRY.factories) | set(_REGISTRY.installed()))


def get_reward_factory(name: str) -> RewardFactory:
    """The factory of reward `name`; UnknownReward (listing the valid names) when there is none."""
    if name in _REGISTRY.factories:
        return _REGISTRY.factories[name]
    if name in BUILTINS:
        return _load(name, BUILTINS[name], "built-in")
    if name in METRICS:
        return _metric_factory(name)
    ep = _REGISTRY.installed().get(name)
    if ep is not None:
        return _load(name, ep.value, f"entry point {ep.group}")
    raise UnknownReward(f"unknown reward {name!r}; valid rewards: {', '.join(reward_names())}")


def _load(name: str, target: str, where: str) -> RewardFactory:
    try:
        obj = import_target(target)
    except (ImportError, AttributeError) as exc:
        raise UnknownReward(f"reward {name!r} ({where}, {target}) cannot be loaded: {exc}; install the package that "
                            f"provides it or choose one of: {', '.join(reward_names())}") from None
    if not callable(obj):
        raise UnknownReward(f"reward {name!r} ({where}, {target}) is not callable; it must be a factory "
                            "(**options) -> Reward")
    return obj


def build_reward(name: str, kind: str | None = None, **options: Any) -> Reward:
    """`get_reward_factory(name)(**options)`, checked to be a Reward of `kind` (when given)."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    try:
        reward = get_reward_factory(name)(**options)
    except (TypeError, ValueError) as e:  # an option the factory does not take, or a value it refuses
        raise UnknownReward(f"reward {name!r}: {e}") from None
    if not isinstance(reward, Reward) or reward.kind not in KINDS:
        raise UnknownReward(f"reward {name!r} did not build a Reward (name, kind 'outcome' or 'step', score)")
    if not getattr(reward, "name", None):
        reward.name = name
    if kind is not None and reward.kind != kind:
        raise UnknownReward(f"reward {name!r} is {_an(reward.kind)} reward, not {_an(kind)} reward; "
                            f"{kind} rewards: {', '.join(reward_names_of(kind))}")
    return reward


def _kind_of(name: str) -> str | None:
    """The kind of a reward name without building it (metrics: outcome; classes: their `kind`)."""
    if name in METRICS and name not in _REGISTRY.factories:
        return "outcome"
    try:
        factory = get_reward_factory(name)
    except UnknownReward:
        return None
    return getattr(factory, "kind", None)


def reward_names_of(kind: str) -> list[str]:
    """The known rewards of `kind` (those whose kind can be told without building them)."""
    return [n for n in reward_names() if _kind_of(n) == kind]


def check_reward_name(name: str, kind: str, field: str) -> None:
    """UnknownReward naming `field` and listing the valid rewards of `kind` when `name` is not one of them
    (checked without building it)."""
    got = _kind_of(name)
    if got == kind:
        return
    if got is None:
        try:
            get_reward_factory(name)  # a plug-in's factory without a declared kind: built (and checked) later
            return
        except UnknownReward:
            pass
        raise UnknownReward(f"{field}: unknown reward {name!r}; valid {kind} rewards: {', '.join(reward_names_of(kind))}")
    raise UnknownReward(f"{field}: {name!r} is {_an(got)} reward; valid {kind} rewards: "
                        f"{', '.join(reward_names_of(kind))}")


def _an(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def as_outcome_reward(reward: Reward | RewardFn | None, name: str = DEFAULT_REWARD) -> Reward:
    """An outcome Reward from a Reward, a plain `(prediction, golds) -> float` function, or None (`name`)."""
    if reward is None:
        return build_reward(name, "outcome")
    if isinstance(reward, Reward):
        if reward.kind != "outcome":
            raise UnknownReward(f"reward {reward.name!r} is {_an(reward.kind)} reward; an outcome reward scores the answer")
        return reward
    return MetricReward(getattr(reward, "__name__", "reward"), reward)

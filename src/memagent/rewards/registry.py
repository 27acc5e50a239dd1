"""Rewards by name: the built-ins, and third-party ones registered through the entry-point group
`memagent.rewards` (the way memagent.agent.registry finds workflows).

A factory builds a reward as `factory(**options)`; the result follows memagent.rewards.protocol.Reward (a
`name`, a `kind` "outcome" or "step", a batched `score`). Built-ins are named by "module:attribute" and imported
only when asked for; an entry point's value is "module:factory"
(`[project.entry-points."memagent.rewards"] mine = "pkg.mod:build"`).

A reward from a plug-in (a factory defined outside the memagent package) is used behind `GuardedReward` (issue 48,
class 2): what its import, factory or `score` raises (or a `sys.exit` there) is one `RewardError` naming the plug-in;
`score` must give one finite number per item (a step reward: a finite number or None), checked before training or
eval uses it; a `score` that runs on past `SCORE_WARN_S` is said (a warning), past `SCORE_TIMEOUT_S` it is an
error. A plug-in that breaks as it is imported is left out of the lists of valid names (so a typo in another name
still gets its own line), and named when it is asked for.

Outcome built-ins: every answer metric of memagent.tasks.metrics (`boxed` the paper's verifier, `em`, `f1`,
`sub_em`, ...) and `judge` (a model grades the answer, memagent.rewards.judge). Step built-ins: `evidence`,
`evidence-chain`, `answer-recall`, `answer-likelihood` (memagent.rewards.step).
"""
from __future__ import annotations

import logging
import math
import numbers
import threading
from typing import Any, Callable, Sequence

from memagent.errors import MemAgentError
from memagent.plugins import Registry, is_plugin, short_error
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


log = logging.getLogger(__name__)

SCORE_WARN_S = 60.0  # a plug-in's score that runs longer is said once (a judge over a large batch may)
SCORE_TIMEOUT_S = 1800.0  # ... and stopped with a RewardError past this (a score that never returns)


class UnknownReward(MemAgentError, ValueError):
    """A reward name that is neither built in, registered, nor an installed entry point (or of the wrong kind)."""


class RewardError(MemAgentError, ValueError):
    """A reward plug-in that failed (at import, as it was built, scoring) or gave values that are not scores."""


_FAULT = "this is a fault of the plug-in, not of memagent: report it to its authors or choose another reward"


class GuardedReward:
    """A plug-in's reward whose `score` is checked (module docstring); every other attribute is its own."""

    def __init__(self, inner: Any, name: str, module: str) -> None:
        self.inner, self.plugin_module = inner, module
        self.name, self.kind = name, inner.kind

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def _where(self) -> str:
        return f"reward {self.name!r} (a plug-in, module {self.plugin_module})"

    def score(self, items: Sequence[Any]) -> list[Any]:
        n = len(items)
        values = self._timed_score(items)
        if not isinstance(values, (list, tuple)):
            raise RewardError(f"{self._where()} scored {n} items with {type(values).__name__}, not a list of "
                              f"numbers; {_FAULT}")
        if len(values) != n:
            raise RewardError(f"{self._where()} gave {len(values)} values for {n} "
                              f"{'answers' if self.kind == 'outcome' else 'conversations'}: one value per item; "
                              f"{_FAULT}")
        out: list[Any] = []
        for i, v in enumerate(values):
            if v is None and self.kind == "step":
                out.append(None)
                continue
            if not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
                what = "a finite number or None" if self.kind == "step" else "a finite number"
                raise RewardError(f"{self._where()} gave {v!r}"[:300] + f" for item {i}, not {what}; {_FAULT}")
            out.append(float(v))
        return out

    def _timed_score(self, items: Sequence[Any]) -> Any:
        """inner.score(items) in a thread: a warning past SCORE_WARN_S, a RewardError past SCORE_TIMEOUT_S (the
        thread is left behind, a daemon); what it raises is a RewardError naming the plug-in."""
        done: dict[str, Any] = {}

        def work() -> None:
            try:
                done["values"] = self.inner.score(items)
            except BaseException as e:  # noqa: BLE001 - carried to the caller's thread
                done["error"] = e

        t = threading.Thread(target=work, name=f"reward-{self.name}", daemon=True)
        t.start()
        t.join(SCORE_WARN_S)
        if t.is_alive():
            log.warning("%s has been scoring %d items for %.0f s; it is stopped at %.0f s", self._where(), len(items),
                        SCORE_WARN_S, SCORE_TIMEOUT_S)
            t.join(max(SCORE_TIMEOUT_S - SCORE_WARN_S, 0.0))
        if t.is_alive():
            raise RewardError(f"{self._where()} did not finish scoring {len(items)} items in {SCORE_TIMEOUT_S:.0f} s; "
                              f"{_FAULT}")
        if "error" in done:
            e = done["error"]
            if isinstance(e, MemAgentError):
                raise e
            if isinstance(e, KeyboardInterrupt):
                raise e
            raise RewardError(f"{self._where()} failed scoring {len(items)} items: {short_error(e)}; {_FAULT}") from None
        return done.get("values")


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


_REGISTRY = Registry(ENTRY_POINT_GROUP, "reward", {**{m: _metric_factory(m) for m in METRICS}, **BUILTINS},
                     reward_names, UnknownReward, RewardError)


def get_reward_factory(name: str) -> RewardFactory:
    """The factory of reward `name`; UnknownReward (listing the valid names) when there is none, RewardError naming
    it when it fails as it is imported (memagent.plugins)."""
    return _REGISTRY.get(name)


def build_reward(name: str, kind: str | None = None, **options: Any) -> Reward:
    """`get_reward_factory(name)(**options)`, checked to be a Reward of `kind` (when given)."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    factory = get_reward_factory(name)
    plugin, module = is_plugin(factory), getattr(factory, "__module__", None) or "?"
    try:
        reward = factory(**options)
    except MemAgentError:
        raise
    except (TypeError, ValueError) as e:  # an option the factory does not take, or a value it refuses
        raise UnknownReward(f"reward {name!r}: {e}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001
        if not plugin:
            raise
        raise RewardError(f"reward {name!r} (a plug-in, module {module}) failed as it was built: "
                          f"{short_error(e)}; {_FAULT}") from None
    try:
        sound = isinstance(reward, Reward) and reward.kind in KINDS
    except Exception:  # noqa: BLE001 - a kind that cannot be compared
        sound = False
    if not sound:
        raise UnknownReward(f"reward {name!r} did not build a Reward (name, kind 'outcome' or 'step', score)")
    if plugin:
        reward = GuardedReward(reward, getattr(reward, "name", None) or name, module)
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
    kind = getattr(factory, "kind", None)
    return kind if isinstance(kind, str) else None


def _listed_kind(name: str) -> str | None:
    """`_kind_of(name)` for a list of valid names: a plug-in that breaks as it is imported is left out (None), so
    one broken package never turns another name's error into its own."""
    try:
        return _kind_of(name)
    except RewardError:
        return None


def reward_names_of(kind: str) -> list[str]:
    """The known rewards of `kind` (those whose kind can be told without building them; broken plug-ins left out)."""
    return [n for n in reward_names() if _listed_kind(n) == kind]


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

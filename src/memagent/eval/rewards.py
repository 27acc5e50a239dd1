"""The rewards of an eval record: what training would have paid each sample (docs/rewards.md).

A profile's `reward` and `step_reward` (memagent.protocol.profile) become `SweepConfig.rewards`; every ok record
then holds `rewards: {name: value}`: an outcome reward's value for the final reply, and a step reward's list of
values, one per memory update in order (null where it does not score the update, e.g. a sample without
evidence). A step reward needs the memories a workflow wrote (baselines have none: it is left out). Rewards that
cannot be built without options (the judge) or that ask the policy (`answer-likelihood`) are not computed here.
"""
from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any, Sequence

from memagent.errors import MemAgentError
from memagent.rewards.protocol import Answered, Reward, Update
from memagent.rewards.registry import RewardError, build_reward

__all__ = ["keep_memory", "record_rewards", "usable_reward"]

log = logging.getLogger(__name__)


@lru_cache(maxsize=64)
def usable_reward(name: str) -> Reward | None:
    """The reward `name` built without options, or None (logged once) when it needs options or the policy."""
    try:
        reward = build_reward(name)
    except RewardError:  # a broken plug-in: one error line naming it, not a reward quietly left out
        raise
    except (MemAgentError, ValueError, TypeError) as e:
        log.warning("eval records leave out reward %r: it needs options (%s)", name, e)
        return None
    if hasattr(reward, "attach"):
        log.warning("eval records leave out reward %r: it asks the policy being trained", name)
        return None
    return reward


def keep_memory(memories: list[str], call: dict) -> None:
    """Append a trace record's memory when it is a memory update (no `kind`, or "memory")."""
    if call.get("kind", "memory") == "memory" and isinstance(call.get("memory"), str):
        memories.append(call["memory"])


def memory_updates(sample: dict, memories: Sequence[str], start: str) -> list[Update]:
    """One Update per memory the workflow wrote, in order, each reading the one before (`start` first)."""
    evidence = sample.get("evidence") or None
    answers, out, before = tuple(sample["answers"]), [], start
    for step, after in enumerate(memories):
        out.append(Update(sample["question"], answers, tuple(evidence) if evidence else None, "memory", step,
                          before, after))
        before = after
    return out


def record_rewards(names: Sequence[str], sample: dict, raw: str | None, memories: Sequence[str] | None,
                   start_memory: str) -> dict[str, Any]:
    """{"rewards": {name: value}} of one sample (module doc); {} when no reward is named."""
    if not names:
        return {}
    out: dict[str, Any] = {}
    for name in names:
        reward = usable_reward(name)
        if reward is None:
            continue
        if reward.kind == "outcome":
            out[name] = float(reward.score([Answered(sample["question"], raw, tuple(sample["answers"]))])[0])
        elif memories is not None:
            values = reward.score(memory_updates(sample, memories, start_memory))
            out[name] = [None if v is None else float(v) for v in values]
    return {"rewards": out}

"""Periodic validation during training (`val.every`, `val.samples`, `val.data`).

After the update of every `val.every`-th step, each held-out question is answered twice through
the workflow with the rollout engine's backend: once greedily (temperature 0) and once sampled at
the rollouts' temperature. The accuracies (fraction of answers with reward >= 1, the rollouts'
`accuracy`) go into that step's metrics record as `val/greedy_acc` and `val/sampled_acc`.

The sampled pass is seeded by the run seed and the step only, so a resumed run validates a step
exactly as an uninterrupted one does. Under torchrun the questions are shared out over the ranks
(question j on rank j mod W) and the counts summed. With `rollout.seeding: sample` question j is
also sampled with its own seeds (seed key j, as rollouts are), so the sampled accuracy does not
depend on the number of processes either.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from memagent.agent.registry import DEFAULT_WORKFLOW, build_workflow, run_workflow
from memagent.backends.base import Backend
from memagent.config import AgentConfig
from memagent.rewards.protocol import Answered
from memagent.rewards.registry import as_outcome_reward
from memagent.rl.distributed import DistInfo, all_reduce
from memagent.rl.recipe import step_seed
from memagent.rl.samples import QASample, read_training_samples
from memagent.tasks.metrics import RewardFn

VAL_ROUND = 7  # the step_seed round of validation sampling (rollout rounds count from 0)


def is_val_step(step: int, every: int) -> bool:
    """Whether the record of `step` (1-based, after its update) carries validation metrics."""
    return every > 0 and step % every == 0


def load_val_samples(path: str, limit: int) -> list[QASample]:
    """The first `limit` samples of the held-out file (all when limit is 0)."""
    samples = read_training_samples(path)
    return samples[:limit] if limit else samples


def correct_answers(backend: Backend, agent: AgentConfig, samples: Sequence[QASample], reward_fn: RewardFn,
                    *, temperature: float, seed: int, keys: Sequence[int] | None = None,
                    workflow: str = DEFAULT_WORKFLOW, workflow_options: dict | None = None) -> int:
    """How many of `samples` the workflow (by name, with its own options) answers with reward >= 1 at
    `temperature`. keys: one seed key per sample (`AgentInput.seed_key`: its draws then depend on the key, not
    on its batch), or None."""
    if not samples:
        return 0
    items = [s.agent_input(f"val-{s.id}", None if keys is None else keys[j]) for j, s in enumerate(samples)]
    cfg = replace(agent, temperature=temperature, seed=seed, max_batch_docs=len(items))
    results = run_workflow(build_workflow(workflow, backend, cfg, **(workflow_options or {})), items)
    scores = as_outcome_reward(reward_fn).score([Answered(s.question, r.raw_answer, s.answers)
                                                 for r, s in zip(results, samples)])
    return sum(float(v) >= 1 for v in scores)


class Validator:
    """Held-out accuracy at the steps `is_val_step` names; `metrics(step, backend)` is {} elsewhere."""

    def __init__(self, samples: list[QASample], every: int, agent: AgentConfig, reward_fn: RewardFn,
                 seed: int, info: DistInfo, per_sample: bool = False, workflow: str = DEFAULT_WORKFLOW,
                 workflow_options: dict | None = None) -> None:
        self.samples, self.every, self.agent = samples, every, agent
        # the training workflow, passed on only when it is not the default (the paper's calls stay as they were)
        plain = workflow == DEFAULT_WORKFLOW and not workflow_options
        self.workflow = {} if plain else dict(workflow=workflow, workflow_options=workflow_options)
        self.reward_fn, self.seed, self.info = reward_fn, seed, info
        self.per_sample = per_sample  # rollout.seeding "sample": question j sampled with seed key j

    def metrics(self, step: int, backend: Backend) -> dict[str, float]:
        """{"val/greedy_acc", "val/sampled_acc"} in [0, 1] at a validation step, else {} (every rank calls it)."""
        if not is_val_step(step, self.every):
            return {}
        idx = list(range(self.info.rank, len(self.samples), self.info.world_size))
        mine, keys = [self.samples[j] for j in idx], (idx if self.per_sample else None)
        seed = step_seed(self.seed, step, VAL_ROUND, 0)
        greedy = correct_answers(backend, self.agent, mine, self.reward_fn, temperature=0.0, seed=seed,
                                 **self.workflow)
        sampled = correct_answers(backend, self.agent, mine, self.reward_fn,
                                  temperature=self.agent.temperature, seed=seed, keys=keys, **self.workflow)
        counts = all_reduce(torch.tensor([greedy, sampled], dtype=torch.float64), self.info)
        n = max(len(self.samples), 1)
        return {"val/greedy_acc": float(counts[0]) / n, "val/sampled_acc": float(counts[1]) / n}


def make_validator(val_data: str, every: int, limit: int, agent: AgentConfig, reward_fn: RewardFn, seed: int,
                   info: DistInfo, per_sample: bool = False, workflow: str = DEFAULT_WORKFLOW,
                   workflow_options: dict | None = None) -> Validator | None:
    """The run's Validator, or None when `every` is 0. per_sample: rollout.seeding is "sample"; workflow: the
    training config's (validated through the workflow it trains)."""
    if every == 0:
        return None
    return Validator(load_val_samples(val_data, limit), every, agent, reward_fn, seed, info, per_sample,
                     workflow, workflow_options)

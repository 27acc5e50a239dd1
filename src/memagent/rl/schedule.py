"""What a training run does when: data order, rollout seeds, the optimiser and its learning-rate schedule."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from memagent.rl.config import OptimConfig


class DataStream:
    """Dataset indices in a seeded random order, one permutation per epoch, resumable by position.

    position: how many indices were handed out so far (over all epochs); saved in checkpoints.
    """

    def __init__(self, size: int, seed: int, position: int = 0) -> None:
        if size <= 0:
            raise ValueError("the dataset is empty")
        self.size, self.seed, self.position = size, seed, position
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.size, generator=g)
        return self._perm

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, self.size)
            out.append(int(self._order(epoch)[i]))
            self.position += 1
        return out

    @property
    def epoch(self) -> int:
        return self.position // self.size


def step_seed(seed: int, step: int, round_: int, rank: int) -> int:
    """The sampling seed of one rollout round: distinct per run seed, step, round and rank."""
    return (seed * 1_000_000_007 + step * 100_003 + round_ * 1_009 + rank) % (2**31 - 1)


def lr_factor(step: int, warmup_steps: int, total_steps: int | None = None, schedule: str = "constant",
              min_ratio: float = 0.0) -> float:
    """The learning rate of optimiser step `step` (0-based) as a fraction of the peak.

    Linear warm-up: (step + 1) / warmup_steps for the first warmup_steps steps. Then "constant": 1;
    "cosine": min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2 with p = (step - warmup_steps) /
    (total_steps - warmup_steps), p clamped to [0, 1], so the last step (total_steps - 1) is just
    above min_ratio and any step past the end stays at min_ratio.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError("a cosine schedule needs total_steps")
    span = max(1, total_steps - warmup_steps)
    p = min(1.0, max(0.0, (step - warmup_steps) / span))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


def make_optimizer(model: nn.Module, cfg: OptimConfig, total_steps: int | None = None) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters and the `lr_factor` schedule (total_steps: the run's
    optimiser steps, needed by the cosine schedule)."""
    if cfg.schedule != "constant" and not total_steps:
        raise ValueError(f"optim.schedule {cfg.schedule!r} needs the run's total optimiser steps")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio))
    return opt, sched

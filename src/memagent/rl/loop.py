"""The parts of a training loop that are not the algorithm, shared by RL and supervised warm-up:
data order, optimiser + schedule, seeds, metrics files, progress bar."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memagent.config import ConfigError
from memagent.rl.checkpoint import TrainOutputError
from memagent.rl.config import OptimConfig
from memagent.rl.distributed import DistInfo

log = logging.getLogger(__name__)


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


class MetricsLog:
    """metrics.jsonl (one record a step) and optional TensorBoard scalars, written by rank 0.

    resume_step: records of later steps (written before a crash, after the checkpoint resumed
    from) are dropped, so the file reads as one uninterrupted run; a last line cut short by a
    crash is dropped too. The file is never rewritten in place: when lines go, the kept ones are
    written to a temporary file that replaces it (os.replace), else it is only appended to.
    A fresh run (resume_step 0) starts an empty file the same way.
    """

    def __init__(self, out_dir: Path, info: DistInfo, tensorboard: bool = False, resume_step: int = 0,
                 name: str = "metrics.jsonl") -> None:
        self.enabled = info.is_main
        self.path = Path(out_dir) / name
        self._tb = None
        if not self.enabled:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept, whole = kept_records(self.path, resume_step) if resume_step else ([], not self.path.exists())
            if not whole:
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
                os.replace(tmp, self.path)
        except OSError as e:
            raise TrainOutputError(f"cannot write {self.path}: {e}; free disk space or choose another out_dir") from None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError("tensorboard=true needs the tensorboard package: pip install 'memagent[tensorboard]'") from None
            self._tb = SummaryWriter(str(Path(out_dir) / "tb"))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise TrainOutputError(f"cannot append step {record.get('step')} to {self.path}: {e}; free disk space "
                                   "and resume (the last checkpoint is intact)") from None
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def kept_records(path: Path, resume_step: int) -> tuple[list[str], bool]:
    """(the lines of `path` of steps <= resume_step, whether the file already holds exactly those).

    A last line without its newline that is not JSON was cut short by a crash: dropped with a
    warning. Any other line that is not a JSON record is an error naming it."""
    if not path.is_file():
        return [], False
    data = path.read_bytes()
    lines = data.decode("utf-8", errors="replace").split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    kept = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            step = json.loads(line).get("step", 0)
        except (ValueError, AttributeError):
            raise ConfigError(f"{path}:{n} is not a metrics record; move the file away to resume") from None
        if step <= resume_step:
            kept.append(line)
    if torn.strip():
        try:
            if json.loads(torn).get("step", 0) <= resume_step:
                kept.append(torn)
        except (ValueError, AttributeError):
            log.warning("%s: dropped its last line, cut short by a crash: %r", path, torn[:80])
    return kept, not torn and len(kept) == sum(1 for line in lines if line.strip())


class Progress:
    """Training progress over steps showing the latest reward/loss (`memagent.progress.StepProgress`: a bar on a
    terminal, a plain line every 5% in a log); a no-op when disabled."""

    def __init__(self, total: int, done: int, enabled: bool, what: str = "train") -> None:
        from memagent.progress import StepProgress

        self._p = StepProgress(what, total, done) if enabled else None

    def advance(self, rec: dict[str, Any]) -> None:
        if self._p is None:
            return
        shown = [f"{k} {rec[k]:.3g}" for k in ("reward", "loss", "kl") if isinstance(rec.get(k), (int, float))]
        self._p.update(1, " ".join(shown))

    def close(self) -> None:
        if self._p is not None:
            self._p.close()

"""The training recipe shared by RL and supervised fine-tuning: setup, step, save, cleanup.

`Recipe.setup` finds the checkpoint to resume from, loads its weights into the model, wraps the
model for data parallelism, builds AdamW + the learning-rate schedule, restores the optimiser,
scheduler and RNG states (or seeds a fresh run), the data order and metrics.jsonl. `Recipe.run`
then calls an `Algorithm`'s `step` until `total_steps`, writing one metrics record a step,
advancing the progress bar, checkpointing every `save_every` steps and at the end, and always
releasing what it holds. What a step does is the algorithm's: Multi-Conv DAPO
(`memagent.rl.trainer`) or supervised fine-tuning (`memagent.rl.sft`); both take their gradient from
`memagent.rl.accumulate` over objectives of `memagent.rl.objectives`.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from memagent.config import ConfigError
from memagent.io import atomic_write_text
from memagent.rl.checkpoint import (finish_checkpoint, latest_checkpoint, load_checkpoint, load_model_weights,
                                    resume_checkpoint, save_checkpoint)
from memagent.rl.config import OptimConfig
from memagent.rl.distributed import DistInfo, clip_grad_norm, unwrap, wrap_model
from memagent.rl.metrics_log import MetricsLog, Progress
from memagent.rl.resume_guard import check_resume
from memagent.rl.schedule import DataStream, make_optimizer

log = logging.getLogger(__name__)

Callback = Callable[[int, dict[str, Any]], "bool | None"]  # (step, metrics) -> False stops the run


class TrainingDiverged(ConfigError):
    """The loss, a gradient or the weights went NaN/inf: the run stops before saving them (one error line)."""


@dataclass
class TrainResult:
    out_dir: Path
    checkpoint: Path | None  # the last checkpoint; `<checkpoint>/model` loads with from_pretrained
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one record per step run by this call
    model: nn.Module | None = None  # the trained policy (unwrapped), in memory


@dataclass(frozen=True)
class RunSpec:
    """What the loop needs to know about a run, whichever algorithm it trains with."""

    out_dir: Path  # checkpoints/, metrics.jsonl (and config.json when write_config)
    seed: int  # data order; torch / random / NumPy of a fresh run (+ rank)
    total_steps: int  # steps of the algorithm
    optimizer_steps: int  # nominal optimiser steps of the whole run (the cosine schedule's length)
    data_size: int  # items the data order permutes
    save_every: int  # checkpoint every N steps; 0 = only at the end
    keep_last: int  # checkpoints kept on disk; 0 = keep all
    resume: bool  # continue from the newest whole checkpoint in out_dir/checkpoints
    save_final: bool  # checkpoint at the end (and when a callback stops the run)
    strategy: str  # ddp or fsdp under torchrun
    optim: OptimConfig
    config: dict[str, Any]  # the run's config, written into each checkpoint
    state: dict[str, Any]  # extra trainer_state.json fields
    write_config: bool = False  # also write out_dir/config.json
    tensorboard: bool = False
    progress: bool = True
    what: str = "train"  # the progress bar's label
    wandb: dict[str, Any] | None = None  # LogConfig fields when Weights & Biases logging is on
    cpu_offload: Any = None  # FSDP2 OffloadPolicy of the wrapped model (memagent.rl.model_options) or None
    checkpoint_format: str = "safetensors"  # or "dcp": sharded training state (memagent.rl.dcp)
    async_save: bool = False  # dcp: write the shards in the background; published at the next save or the end


class Algorithm(Protocol):
    def step(self, run: "Recipe") -> dict[str, Any]:
        """One training step at `run.step` (not yet advanced): its metrics record, without "step"."""
        ...


def resume_point(spec: RunSpec) -> Path | None:
    """The checkpoint to resume from: the newest whole one (damaged newer ones are skipped with a warning)."""
    root = spec.out_dir / "checkpoints"
    latest = latest_checkpoint(root)
    if spec.resume:
        if latest is None:
            log.warning("resume=true but %s holds no checkpoint: starting from step 0", root)
        return resume_checkpoint(root)
    if latest is not None:
        raise ConfigError(f"{spec.out_dir} already holds checkpoints (latest {latest.name}); pass resume=true "
                          "to continue that run, or choose another out_dir")
    return None


class Recipe:
    """One run's state: the wrapped model, optimiser, schedule, step, data order, metrics file."""

    def __init__(self, spec: RunSpec, info: DistInfo, model: nn.Module, tokenizer: Any,
                 held: contextlib.ExitStack | None = None) -> None:
        self.spec, self.info, self.tokenizer = spec, info, tokenizer
        self.held = held or contextlib.ExitStack()  # released by cleanup()
        self.ckpt_root = spec.out_dir / "checkpoints"
        self.pending: Any = None  # an asynchronous save not yet published (memagent.rl.dcp.PendingCheckpoint)
        self.resumed_from = resume_point(spec)
        if self.resumed_from is not None:  # the same run, or a refusal naming what differs (rl/resume_guard.py)
            check_resume(self.resumed_from, spec.config, spec.state.get("data_sha256"))
            load_model_weights(model, self.resumed_from / "model")
        self.model = wrap_model(model.to(info.device), spec.strategy, info, spec.cpu_offload)
        self.optimizer, self.scheduler = make_optimizer(self.model, spec.optim, spec.optimizer_steps)
        self.step, position = 0, 0
        self.saved_world_size: int | None = None  # processes of the run that wrote the resumed checkpoint
        if self.resumed_from is not None:
            state = load_checkpoint(self.resumed_from, info, model=self.model, optimizer=self.optimizer,
                                    scheduler=self.scheduler)
            self.step, position = int(state["step"]), int(state["data_position"])
            self.saved_world_size = int(state.get("world_size", 1))
            if self.step > spec.total_steps:
                raise ConfigError(f"resume: the run in {spec.out_dir} has done {self.step} steps, more than "
                                  f"total_steps={spec.total_steps}; set total_steps >= {self.step} to go on")
            log.info("resumed from %s (step %d)", self.resumed_from, self.step)
        else:
            torch.manual_seed(spec.seed + info.rank)
            random.seed(spec.seed + info.rank)
            np.random.seed(spec.seed + info.rank)
        self.data = DataStream(spec.data_size, spec.seed, position)
        self.metrics = MetricsLog(spec.out_dir, info, spec.tensorboard, resume_step=self.step, wandb=spec.wandb,
                                  config=spec.config)  # first: a damaged metrics.jsonl refuses before any write
        if info.is_main and spec.write_config:
            spec.out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(spec.out_dir / "config.json", json.dumps(spec.config, indent=2) + "\n")

    def optimizer_step(self, grad_clip: float) -> dict[str, float]:
        """Clip the accumulated gradient, step AdamW and the schedule, clear the gradient.

        A non-finite gradient norm (NaN/inf loss or gradient) stops the run before the step can write NaN
        into the weights (`TrainingDiverged`)."""
        rec = {"grad_norm": float(clip_grad_norm(self.model, grad_clip)), "lr": self.optimizer.param_groups[0]["lr"]}
        if not math.isfinite(rec["grad_norm"]):
            raise self.diverged(self.step + 1, f"the gradient norm is {rec['grad_norm']}")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return rec

    def diverged(self, step: int, what: str) -> "TrainingDiverged":
        """The error that stops a run whose loss, gradient or weights went non-finite at the current step."""
        last = latest_checkpoint(self.ckpt_root)
        kept = f"the last checkpoint ({last.name}) is intact" if last is not None else "no checkpoint was written"
        return TrainingDiverged(
            f"training diverged at step {step}: {what}; stopped without saving it ({kept}); lower optim.lr, "
            "keep optim.grad_clip > 0 or check the data, then start again (or resume from the last checkpoint)")

    def check_finite(self, metrics: dict[str, Any]) -> None:
        """Stop on a non-finite loss or gradient norm in a step's metrics record."""
        for key in ("loss", "grad_norm"):
            value = metrics.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                raise self.diverged(self.step + 1, f"the {key.replace('_', ' ')} is {value}")

    def _check_weights(self) -> None:
        """Refuse to checkpoint weights holding NaN or inf (this rank's shards under FSDP)."""
        for name, p in self.model.named_parameters():
            if not bool(torch.isfinite(p.detach().to_local() if hasattr(p, "to_local") else p.detach()).all()):
                raise self.diverged(self.step, f"the weight {name} holds NaN or inf")

    def save(self) -> Path:
        """Checkpoint the current step; with async_save it is published later (`finish_save`).
        Weights that are not finite are never saved (`TrainingDiverged`)."""
        spec = self.spec
        self._check_weights()
        self.finish_save()
        out = save_checkpoint(self.ckpt_root, self.step, self.info, model=self.model, tokenizer=self.tokenizer,
                              optimizer=self.optimizer, scheduler=self.scheduler,
                              trainer_state={"data_position": self.data.position, **spec.state},
                              config=spec.config, keep_last=spec.keep_last, sharded=spec.checkpoint_format == "dcp",
                              asynchronous=spec.async_save)
        if isinstance(out, Path):
            return out
        self.pending = out
        return out.path

    def finish_save(self) -> None:
        """Wait for an asynchronous save still being written and publish it (collective)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            finish_checkpoint(pending, self.info)

    def run(self, algorithm: Algorithm, callback: Callback | None = None) -> TrainResult:
        """Steps until total_steps (or a callback answering False), checkpoints, then `cleanup`."""
        spec = self.spec
        result = TrainResult(spec.out_dir, self.resumed_from, model=unwrap(self.model))
        saved_at = self.step if self.resumed_from is not None else -1
        progress = Progress(spec.total_steps, self.step, enabled=spec.progress and self.info.is_main, what=spec.what)
        try:
            while self.step < spec.total_steps:
                metrics = algorithm.step(self)
                self.check_finite(metrics)
                self.step += 1
                rec = {"step": self.step, **metrics}
                self.metrics.write(rec)
                result.metrics.append(rec)
                progress.advance(rec)
                stop = callback is not None and callback(self.step, rec) is False
                ends = spec.save_final and (stop or self.step == spec.total_steps)
                if (spec.save_every and self.step % spec.save_every == 0) or ends:
                    result.checkpoint, saved_at = self.save(), self.step
                if stop:
                    break
            if spec.save_final and saved_at != self.step:
                result.checkpoint = self.save()
            self.finish_save()
        finally:
            progress.close()
            self.cleanup()
        return result

    def cleanup(self) -> None:
        """Close the metrics file and release what the run holds (its out_dir lock)."""
        self.metrics.close()
        self.held.close()


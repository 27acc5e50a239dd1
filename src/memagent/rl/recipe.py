"""The training recipe shared by RL and supervised fine-tuning: setup, step, save, cleanup.

`Recipe.setup` finds the checkpoint to resume from, loads its weights into the model, wraps the
model for data parallelism, builds AdamW + the learning-rate schedule, restores the optimiser,
scheduler and RNG states (or seeds a fresh run), the data order and metrics.jsonl. `Recipe.run`
then calls an `Algorithm`'s `step` until `total_steps`, writing one metrics record a step,
advancing the progress bar, checkpointing every `save_every` steps and at the end, and always
releasing what it holds. What a step does is the algorithm's: Multi-Conv DAPO
(`memagent.rl.trainer`) or supervised fine-tuning (`memagent.rl.sft`); both take their gradient from
`accumulate_gradients` over objectives (memagent.rl.objectives).

Below the loop, what it runs on: what a run does when (`DataStream`, the data order; `step_seed`, the
rollout seeds; `make_optimizer`, AdamW and its learning-rate schedule `lr_factor`) and what a run reports
(`MetricsLog`: metrics.jsonl, resumable, optional TensorBoard scalars and Weights & Biases run; `Progress`,
the progress bar).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from memagent.config import ConfigError
from memagent.io import atomic_write_text
from memagent.progress import StepProgress
from memagent.rl.checkpoint import (TrainOutputError, finish_checkpoint, latest_checkpoint, load_checkpoint,
                                    load_model_weights, resume_checkpoint, save_checkpoint)
from memagent.rl.config import OptimConfig
from memagent.rl.distributed import DistInfo, clip_grad_norm, unwrap, wrap_model
from memagent.rl.resume_guard import check_resume

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
    checkpoint_format: str = "safetensors"  # or "dcp": sharded training state (memagent.rl.checkpoint.sharded)
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
        self.pending: Any = None  # an asynchronous save not yet published (memagent.rl.checkpoint.sharded.PendingCheckpoint)
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


# -- what a run does when: data order, rollout seeds, the optimiser and its schedule -------------------------


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


# -- what a run reports: metrics.jsonl, TensorBoard, Weights & Biases, the progress bar ----------------------


class MetricsLog:
    """metrics.jsonl (one record a step) and optional TensorBoard scalars, written by rank 0.

    resume_step: records of later steps (written before a crash, after the checkpoint resumed
    from) are dropped, so the file reads as one uninterrupted run; a last line cut short by a
    crash is dropped too. The file is never rewritten in place: when lines go, the kept ones are
    written to a temporary file that replaces it (os.replace), else it is only appended to.
    A fresh run (resume_step 0) starts an empty file the same way.
    """

    def __init__(self, out_dir: Path, info: DistInfo, tensorboard: bool = False, resume_step: int = 0,
                 name: str = "metrics.jsonl", wandb: dict[str, Any] | None = None,
                 config: dict[str, Any] | None = None) -> None:
        self.enabled = info.is_main
        self.path = Path(out_dir) / name
        self._tb = None
        self._wandb = None
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
                from torch.utils.tensorboard import SummaryWriter  # lazy: torch (its tensorboard writer needs the optional tensorboard package)
            except ImportError:
                raise ImportError("tensorboard=true needs the tensorboard package: pip install 'memagent[tensorboard]'") from None
            self._tb = SummaryWriter(str(Path(out_dir) / "tb"))
        if wandb is not None:
            self._wandb = start_wandb(Path(out_dir), wandb, config or {}, fresh=resume_step == 0)

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
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"},
                            step=record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


WANDB_ID_FILE = "wandb_run_id.txt"


def start_wandb(out_dir: Path, opts: dict[str, Any], config: dict[str, Any], fresh: bool) -> Any:
    """A Weights & Biases run for `out_dir` (LogConfig fields in `opts`). Its id is kept in
    out_dir/wandb_run_id.txt, so a resumed training run goes on logging into the same W&B run."""
    try:
        import wandb  # lazy: wandb
    except ImportError:
        raise ConfigError("log.wandb=true needs the wandb package: pip install 'memagent[wandb]' "
                          "(then `wandb login`), or set log.wandb=false") from None
    id_file = out_dir / WANDB_ID_FILE
    run_id = None if fresh or not id_file.is_file() else id_file.read_text(encoding="utf-8").strip()
    if run_id is None:
        run_id = wandb.util.generate_id()
        id_file.write_text(run_id + "\n", encoding="utf-8")
    return wandb.init(project=opts.get("project") or "memagent", name=opts.get("name") or out_dir.resolve().name,
                      entity=opts.get("entity") or None, id=run_id, resume="allow", config=config,
                      dir=str(out_dir))


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
            record = json.loads(line)
        except ValueError:
            record = None
        if _step_of(record, path, n) <= resume_step:
            kept.append(line)
    if torn.strip():
        try:
            record = json.loads(torn)
        except ValueError:
            log.warning("%s: dropped its last line, cut short by a crash: %r", path, torn[:80])
        else:
            if _step_of(record, path, len(lines) + 1) <= resume_step:
                kept.append(torn)
    return kept, not torn and len(kept) == sum(1 for line in lines if line.strip())


def _step_of(record: Any, path: Path, n: int) -> int:
    """The integer step of metrics record `record` (line n of `path`; 0 when it has none), else a ConfigError."""
    if not isinstance(record, dict):
        raise ConfigError(f"{path}:{n} is not a metrics record; move the file away to resume")
    step = record.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise ConfigError(f"{path}:{n} is not a metrics record (its step is {str(step)[:40]!r}, not an integer); "
                          "move the file away to resume")
    return step


class Progress:
    """Training progress over steps showing the latest reward/loss (`memagent.progress.StepProgress`: a bar on a
    terminal, a plain line every 5% in a log); a no-op when disabled."""

    def __init__(self, total: int, done: int, enabled: bool, what: str = "train") -> None:
        self._p = StepProgress(what, total, done) if enabled else None

    def advance(self, rec: dict[str, Any]) -> None:
        if self._p is None:
            return
        shown = [f"{k} {rec[k]:.3g}" for k in ("reward", "loss", "kl") if isinstance(rec.get(k), (int, float))]
        self._p.update(1, " ".join(shown))

    def close(self) -> None:
        if self._p is not None:
            self._p.close()

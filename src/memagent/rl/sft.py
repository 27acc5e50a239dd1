"""Supervised fine-tuning on (prompt ids, response ids) rows, with the trainer's machinery.

Used for a format warm-up before RL (e.g. the demo's "workflow without RL" ablation): the loss is
the token mean of the cross-entropy of the RESPONSE tokens only, over the whole optimiser batch
(summed over micro-batches and data-parallel ranks, as in the RL update), with the same AdamW +
warm-up schedule, gradient clipping, DDP/FSDP2 wrapping, atomic safetensors checkpoints and
metrics JSONL as `memagent.rl.trainer`. Not in the paper (its base models are instruction-tuned).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from memagent.config import ConfigError
from memagent.rl.algos import loss_denominator, row_loss_weights, token_logprobs
from memagent.rl.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    resume_checkpoint,
    save_checkpoint,
)
from memagent.rl.config import OptimConfig, config_to_dict
from memagent.rl.distributed import DistInfo, all_reduce, clip_grad_norm, init_distributed, no_grad_sync, unwrap, wrap_model
from memagent.rl.forward import dummy_forward_loss, micro_batches, pack_rows, response_logits
from memagent.rl.loop import DataStream, MetricsLog, Progress, make_optimizer
from memagent.rl.trainer import TrainResult

Row = tuple[Sequence[int], Sequence[int]]  # (prompt ids [P], response ids [R])


@dataclass
class SFTConfig:
    """Supervised warm-up settings; the optimiser section is the RL trainer's `OptimConfig`."""

    out_dir: str = "runs/sft"  # checkpoints and metrics.jsonl
    seed: int = 0  # data order and dropout
    epochs: float = 1.0  # passes over the rows (fractions allowed); the number of steps follows
    batch_size: int = 16  # rows per optimiser step (over all processes)
    micro_batch_size: int = 16  # rows per forward/backward (memory bound, not the math)
    save_every: int = 0  # checkpoint every N optimiser steps; 0 = only at the end
    keep_last: int = 1  # checkpoints kept on disk; 0 = keep all
    save: bool = True  # write a checkpoint at the end (model/ loads with from_pretrained)
    resume: bool = False  # continue from the latest checkpoint in out_dir
    device: str = "auto"
    strategy: str = "ddp"  # with torchrun: ddp or fsdp
    progress: bool = True
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=0, weight_decay=0.0))

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.micro_batch_size <= 0 or self.epochs <= 0:
            raise ConfigError("SFTConfig: batch_size, micro_batch_size and epochs must be positive")
        if self.strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"SFTConfig.strategy must be 'ddp' or 'fsdp', got {self.strategy!r}")


def encode_conversation(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) exactly as the transformers backend would present them.

    The prompt is rendered with the tokenizer's chat template when it has one (as
    `TransformersBackend` does by default); the response gets the EOS id appended, so the
    model learns to stop.
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = tokenizer(prompt)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return list(prompt_ids), list(response_ids)


def check_rows(rows: Sequence[Any]) -> list[Row]:
    """Rows as (prompt_ids, response_ids) lists (or dicts of those keys); a ConfigError names a bad one."""
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, dict):
            r = (r.get("prompt_ids"), r.get("response_ids"))
        if not (isinstance(r, (tuple, list)) and len(r) == 2) or not r[0] or not r[1]:
            raise ConfigError(f"SFT row {i} must be (prompt_ids, response_ids) with both non-empty")
        out.append((list(r[0]), list(r[1])))
    if not out:
        raise ConfigError("no SFT rows given")
    return out


def sft_step_grads(model: nn.Module, rows: list[Row], *, micro_batch_size: int, pad_id: int, info: DistInfo,
                   scale: float = 1.0) -> dict[str, float]:
    """Accumulate the gradient of `scale` x the batch's token-mean response cross-entropy (all ranks).
    The returned loss is the unscaled cross-entropy."""
    prompts, responses = [r[0] for r in rows], [r[1] for r in rows]
    width = max([1] + [len(r) for r in responses])
    mask_all = torch.zeros(len(rows), width, dtype=torch.float64)
    for n, r in enumerate(responses):
        mask_all[n, : len(r)] = 1
    denom = all_reduce(loss_denominator(mask_all, "token-mean"), info)  # tokens of the whole batch
    weights = row_loss_weights(mask_all, "token-mean", denominator=denom)  # (N,)
    chunks = micro_batches(len(rows), micro_batch_size, info)
    total, correct = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    model.train()
    for k, idx in enumerate(chunks):
        with no_grad_sync(model, skip=k < len(chunks) - 1):
            if not idx:
                dummy_forward_loss(model, pad_id, info.device).backward()
                continue
            packed = pack_rows([prompts[i] for i in idx], [responses[i] for i in idx], pad_id).to(info.device)
            logits = response_logits(model, packed)  # (B, R, V)
            logp = token_logprobs(logits, packed.response_ids)  # (B, R)
            mask = packed.response_mask.to(logp.dtype)
            loss = -((logp * mask).sum(-1) * weights[idx].to(info.device, logp.dtype)).sum()
            (loss * (scale * info.grad_scale)).backward()
            total += loss.detach().double().cpu()
            correct += ((logits.argmax(-1) == packed.response_ids).to(mask.dtype) * mask).sum().double().cpu()
    t = all_reduce(torch.stack([total, correct]), info)
    return {"loss": float(t[0]), "token_accuracy": float(t[1] / denom.clamp_min(1)), "tokens": float(denom)}


def train_sft(
    config: SFTConfig,
    rows: Sequence[Row | dict[str, Any]],
    model: Any,
    tokenizer: Any,
    callback: Callable[[int, dict[str, Any]], "bool | None"] | None = None,
) -> TrainResult:
    """Fine-tune `model` (trained in place) on `rows` of (prompt_ids, response_ids).

    Rows are visited in a seeded random order, `batch_size` per optimiser step; under torchrun
    each rank takes every W-th row of the step's batch. callback(step, metrics) returning False
    stops the run. Returns a TrainResult (last checkpoint, metrics, model).
    """
    data = check_rows(rows)
    info = init_distributed(config.device)
    out = Path(config.out_dir)
    ckpt_root = out / "checkpoints"
    resume_from = resume_checkpoint(ckpt_root) if config.resume else None  # damaged newer ones skipped
    if not config.resume and latest_checkpoint(ckpt_root) is not None:
        raise ConfigError(f"{out} already holds checkpoints; pass resume=True or choose another out_dir")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if resume_from is not None:
        load_model_weights(model, resume_from / "model")
    wrapped = wrap_model(model.to(info.device), config.strategy, info)
    total_steps = max(1, int(np.ceil(config.epochs * len(data) / config.batch_size)))
    optimizer, scheduler = make_optimizer(wrapped, config.optim, total_steps)
    step, position = 0, 0
    if resume_from is not None:
        state = load_checkpoint(resume_from, info, model=wrapped, optimizer=optimizer, scheduler=scheduler)
        step, position = int(state["step"]), int(state["data_position"])
    else:
        torch.manual_seed(config.seed + info.rank)
        random.seed(config.seed + info.rank)
        np.random.seed(config.seed + info.rank)
    stream = DataStream(len(data), config.seed, position)
    metrics = MetricsLog(out, info, resume_step=step)
    progress = Progress(total_steps, step, enabled=config.progress and info.is_main, what="sft")
    result = TrainResult(out, resume_from, model=unwrap(wrapped))

    def save() -> Path:
        return save_checkpoint(ckpt_root, step, info, model=wrapped, tokenizer=tokenizer, optimizer=optimizer,
                               scheduler=scheduler, trainer_state={"data_position": stream.position, "kind": "sft"},
                               config=config_to_dict(config), keep_last=config.keep_last)

    saved_at = step if resume_from is not None else -1
    try:
        while step < total_steps:
            t0 = time.perf_counter()
            batch = stream.take(config.batch_size)
            mine = [data[i] for i in batch[info.rank :: info.world_size]]
            rec = sft_step_grads(wrapped, mine, micro_batch_size=config.micro_batch_size,
                                 pad_id=tokenizer.pad_token_id, info=info)
            rec["grad_norm"] = float(clip_grad_norm(wrapped, config.optim.grad_clip))
            rec["lr"] = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            rec = {"step": step, **rec, "epoch": stream.position / len(data), "step_s": time.perf_counter() - t0}
            metrics.write(rec)
            result.metrics.append(rec)
            progress.advance(rec)
            stop = callback is not None and callback(step, rec) is False
            if (config.save_every and step % config.save_every == 0) or (stop and config.save):
                result.checkpoint, saved_at = save(), step
            if stop:
                break
        if config.save and saved_at != step:
            result.checkpoint = save()
    finally:
        progress.close()
        metrics.close()
    return result

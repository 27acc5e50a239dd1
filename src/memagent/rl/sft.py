"""Supervised fine-tuning on (prompt ids, response ids) rows: the SFT configuration of the training recipe.

Used for a format warm-up before RL (e.g. the demo's "workflow without RL" ablation): one objective,
`sft` (the token mean of the cross-entropy of the RESPONSE tokens only, over the whole optimiser
batch, summed over micro-batches and data-parallel ranks), through the same recipe as Multi-Conv
DAPO (`memagent.rl.recipe`): AdamW + warm-up schedule, gradient clipping, DDP/FSDP2 wrapping,
atomic safetensors checkpoints and metrics JSONL. Not in the paper (its base models are instruction-tuned).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from torch import nn

from memagent.backends.chat import encode_prompt
from memagent.backends.tokenizer import ensure_pad_token
from memagent.config import ConfigError
from memagent.rl.config import ModelOptions, OptimConfig, config_to_dict
from memagent.rl.distributed import DistInfo, init_distributed
from memagent.rl.model_options import prepare_model
from memagent.rl.objectives import SFT, MiniBatch, Row, Term, accumulate_gradients, check_rows
from memagent.rl.recipe import Callback, Recipe, RunSpec, TrainResult

@dataclass
class SFTConfig:
    """Supervised warm-up settings; the optimiser section is the RL trainer's `OptimConfig`."""

    out_dir: str = "runs/sft"  # checkpoints and metrics.jsonl
    seed: int = 0  # data order and dropout
    epochs: float = 1.0  # passes over the rows (fractions allowed); the number of steps follows
    batch_size: int = 16  # rows per optimiser step (over all processes)
    micro_batch_size: int = 16  # rows per forward/backward (memory bound, not the math)
    # > 0: padding-free micro-batches of at most this many tokens (rows back to back, a longer row alone;
    # memagent.rl.packing) instead of micro_batch_size padded rows; 0 = padded. Same gradient either way.
    micro_batch_tokens: int = 0
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
        if self.micro_batch_tokens < 0:
            raise ConfigError(f"SFTConfig.micro_batch_tokens must be >= 0 (0 = padded micro-batches), "
                              f"got {self.micro_batch_tokens}")
        if self.strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"SFTConfig.strategy must be 'ddp' or 'fsdp', got {self.strategy!r}")


def encode_conversation(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) exactly as the transformers backend would present them.

    The prompt is rendered with the tokenizer's chat template when it has one (as
    `TransformersBackend` does by default: `memagent.backends.chat.encode_prompt`); the response
    gets the EOS id appended, so the model learns to stop.
    """
    prompt_ids = encode_prompt(tokenizer, prompt, bool(getattr(tokenizer, "chat_template", None)))
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return list(prompt_ids), list(response_ids)


def sft_step_grads(model: nn.Module, rows: list[Row], *, micro_batch_size: int, pad_id: int, info: DistInfo,
                   scale: float = 1.0, micro_batch_tokens: int = 0) -> dict[str, float]:
    """Accumulate the gradient of `scale` x the batch's token-mean response cross-entropy (all ranks).
    micro_batch_tokens > 0: padding-free micro-batches of that many tokens, else micro_batch_size padded rows.
    Returns loss (the unscaled cross-entropy), token_accuracy and tokens."""
    [out] = accumulate_gradients(model, [Term(SFT(), scale, MiniBatch.supervised(rows))],
                                 micro_batch_size=micro_batch_size, pad_id=pad_id, info=info,
                                 micro_batch_tokens=micro_batch_tokens)
    return out


class Supervised:
    """The SFT algorithm: each step takes `batch_size` rows in the data order (every W-th on this rank)."""

    def __init__(self, config: SFTConfig, rows: list[Row]) -> None:
        self.cfg, self.rows = config, rows

    def step(self, run: Recipe) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = run.data.take(self.cfg.batch_size)
        mine = [self.rows[i] for i in batch[run.info.rank :: run.info.world_size]]
        rec = sft_step_grads(run.model, mine, micro_batch_size=self.cfg.micro_batch_size,
                             pad_id=run.tokenizer.pad_token_id, info=run.info,
                             micro_batch_tokens=self.cfg.micro_batch_tokens)
        rec.update(run.optimizer_step(self.cfg.optim.grad_clip))
        return {**rec, "epoch": run.data.position / len(self.rows), "step_s": time.perf_counter() - t0}


def train_sft(
    config: SFTConfig,
    rows: Sequence[Row | dict[str, Any]],
    model: Any,
    tokenizer: Any,
    callback: Callback | None = None,
) -> TrainResult:
    """Fine-tune `model` (trained in place) on `rows` of (prompt_ids, response_ids).

    Rows are visited in a seeded random order, `batch_size` per optimiser step; under torchrun
    each rank takes every W-th row of the step's batch. callback(step, metrics) returning False
    stops the run. Returns a TrainResult (last checkpoint, metrics, model).
    """
    data = check_rows(rows)
    info = init_distributed(config.device)
    ensure_pad_token(tokenizer)
    if config.micro_batch_tokens > 0:  # packed rows: sdpa becomes per-row varlen attention, as in RL training
        prepare_model(model, ModelOptions(), packed=True)
    total_steps = max(1, int(np.ceil(config.epochs * len(data) / config.batch_size)))
    spec = RunSpec(out_dir=Path(config.out_dir), seed=config.seed, total_steps=total_steps,
                   optimizer_steps=total_steps, data_size=len(data), save_every=config.save_every,
                   keep_last=config.keep_last, resume=config.resume, save_final=config.save, strategy=config.strategy,
                   optim=config.optim, config=config_to_dict(config), state={"kind": "sft"},
                   progress=config.progress, what="sft")
    return Recipe(spec, info, model, tokenizer).run(Supervised(config, data), callback)

"""The supervised warm-up stage of the real-model recipe (`memagent warmup CONFIG`; docs/real_model.md).

Stage 1 of 3: the `sft` objective (memagent.rl.sft) on the demonstrations `memagent data warmup` writes from gold
evidence (memagent.tasks.demonstrations), with the same model loading, LoRA, out_dir guards, lock, checkpoints
and resume as `memagent train`. Stage 2 is `memagent train` (Multi-Conv DAPO) with `lora.init` set to this
stage's last checkpoint, so that RL continues the warm-up adapter; stage 3 merges (`memagent merge-lora`) or
ships the adapter. NOT in the paper: its instruction-tuned 7B/14B bases follow the prompts from the start.

Each demonstration row {id, kind, step, prompt, response} is encoded as the transformers backend presents a
prompt (its chat template) plus the response and EOS (`memagent.rl.sft.encode_conversation`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memagent.config import ConfigError
from memagent.io import atomic_write_text
from memagent.jsonl import iter_jsonl
from memagent.lock import run_lock
from memagent.rl.checkpoint import latest_checkpoint
from memagent.rl.config import (DTYPES, LoraConfig, ModelOptions, OptimConfig, TrainConfig, check_out_dir,
                                config_file_data, config_to_dict)
from memagent.rl.distributed import init_distributed
from memagent.rl.lora import apply_lora, load_initial_adapters
from memagent.rl.sft import SFTConfig, encode_conversation, train_sft
from memagent.rl.trainer import load_policy
from memagent.sections import build, deep_merge, parse_overrides, rule

__all__ = ["WarmupConfig", "load_warmup_config", "read_demonstrations", "run_warmup"]


@dataclass
class WarmupConfig:
    """Everything the warm-up stage needs (YAML + key=value overrides, as `memagent train`)."""

    model: str = ""  # the base policy: a folder, a Hugging Face id or a GGUF file
    data: str = ""  # demonstrations JSONL ({prompt, response} rows: memagent data warmup)
    out_dir: str = "runs/warmup"  # checkpoints, metrics.jsonl, config.json
    seed: int = 0  # data order
    epochs: float = field(default=1.0, metadata=rule(above=0))  # passes over the rows; the step count follows
    batch_size: int = field(default=8, metadata=rule(min=1))  # rows per optimiser step
    micro_batch_size: int = field(default=1, metadata=rule(min=1))  # rows per forward/backward (memory bound)
    micro_batch_tokens: int = field(default=0, metadata=rule(min=0))  # > 0: packed micro-batches of this many tokens
    stop_at: int = field(default=0, metadata=rule(min=0))  # > 0: stop after this step; the schedule stays the
    # whole run's, so the checkpoint is the one a run to the end would have written at that step
    save_every: int = field(default=10, metadata=rule(min=0))  # checkpoint every N optimiser steps (0: at the end)
    keep_last: int = field(default=2, metadata=rule(min=0))  # checkpoints kept (0: all)
    resume: bool = False  # continue from the latest checkpoint in out_dir
    force: bool = False  # write into an out_dir that holds a model or another run
    dtype: str = field(default="float32", metadata=rule(choices=DTYPES))
    device: str = "auto"
    progress: bool = True
    lora: LoraConfig = field(default_factory=lambda: LoraConfig(r=16, alpha=32.0))  # r = 0: the full model trains
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-4, warmup_steps=2, weight_decay=0.0))
    model_options: ModelOptions = field(default_factory=ModelOptions)

    def train_config(self) -> TrainConfig:
        """The TrainConfig fields that model loading and the out_dir guards read."""
        return TrainConfig(model=self.model, data=self.data, out_dir=self.out_dir, resume=self.resume, force=self.force,
                           dtype=self.dtype, device=self.device, model_options=self.model_options, lora=self.lora)


def load_warmup_config(path: str | Path | None, overrides: list[str] | None = None, *, resume: bool = False,
                       force: bool = False) -> WarmupConfig:
    """WarmupConfig from a YAML file plus `key=value` overrides (and --resume / --force)."""
    data = config_file_data(WarmupConfig, path)
    flags = [*(overrides or []), *(["resume=true"] if resume else []), *(["force=true"] if force else [])]
    return build(WarmupConfig, deep_merge(data, parse_overrides(flags, WarmupConfig)))


def read_demonstrations(path: str | Path, tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every row of a demonstrations file; a bad row is one error naming its line."""
    rows = []
    for n, row in iter_jsonl(Path(path), ConfigError):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not isinstance(row.get("response"), str):
            raise ConfigError(f"{path}:{n}: a demonstration is an object with string fields `prompt` and `response` "
                              "(memagent data warmup writes them)")
        rows.append(encode_conversation(tokenizer, row["prompt"], row["response"]))
    if not rows:
        raise ConfigError(f"{path} holds no demonstrations")
    return rows


def run_warmup(cfg: WarmupConfig) -> str:
    """Train the warm-up; returns the line to print (the last checkpoint)."""

    if not cfg.data or not Path(cfg.data).is_file():
        raise ConfigError(f"data file {cfg.data!r} does not exist; write one with memagent data warmup")
    tc = cfg.train_config()
    check_out_dir(tc)
    with run_lock(cfg.out_dir, "warm-up run", reenter=True):
        done = latest_checkpoint(Path(cfg.out_dir) / "checkpoints") if cfg.resume and cfg.stop_at else None
        if done is not None and int(done.name.split("_")[1]) >= cfg.stop_at:  # before the model is loaded
            return f"already stopped at {done.name} (stop_at={cfg.stop_at}); checkpoint: {done}"
        info = init_distributed(cfg.device)
        model, tokenizer = load_policy(tc, None, None, info.device)
        rows = read_demonstrations(cfg.data, tokenizer)
        if cfg.lora.r > 0:
            model = apply_lora(model, cfg.lora, seed=cfg.seed)
            load_initial_adapters(model, cfg.lora)
        sft = SFTConfig(out_dir=cfg.out_dir, seed=cfg.seed, epochs=cfg.epochs, batch_size=cfg.batch_size,
                        micro_batch_size=cfg.micro_batch_size, micro_batch_tokens=cfg.micro_batch_tokens,
                        save_every=cfg.save_every, keep_last=cfg.keep_last, resume=cfg.resume, device=cfg.device,
                        progress=cfg.progress, optim=cfg.optim)
        atomic_write_text(Path(cfg.out_dir) / "warmup_config.json",
                          json.dumps({**config_to_dict(cfg), "rows": len(rows)}, indent=2) + "\n")
        stop = (lambda step, _: step < cfg.stop_at) if cfg.stop_at else None  # False ends the run, checkpointed
        result = train_sft(sft, rows, model, tokenizer, callback=stop)
    return f"warmed up on {len(rows)} rows in {len(result.metrics)} step(s); checkpoint: {result.checkpoint}"

"""Multi-Conv DAPO training (docs/paper.md, "Multi-Conv DAPO") and supervised fine-tuning: one recipe
over pluggable per-row objectives.

    recipe.py       the loop both run: setup / step / save / cleanup; `TrainResult`; the data order, rollout seeds and
                    optimiser schedule (`DataStream`, `step_seed`, `make_optimizer`); metrics.jsonl, TensorBoard,
                    W&B and the progress bar (`MetricsLog`, `Progress`)
    trainer.py      Multi-Conv DAPO as a recipe algorithm (rollout, then optimiser steps); `train()`, `load_policy`;
                    `run_train`: `memagent train` as one library call (resume guard, lock, profile.yaml)
    sft.py          supervised fine-tuning as a recipe algorithm; `train_sft()`
    objectives.py   per-row losses registered by name: `dapo`, `sft`; `MiniBatch`; `accumulate_gradients`: one
                    optimiser step's gradient over [Term(objective, weight, rows)], split- and rank-invariant
    algos.py        pure tensor math: group advantages, broadcast, policy loss, KL, aggregation (registries)
    rollout.py      G runs of the workflow per question -> rows, rewards, dynamic sampling, advantages; the
                    `RolloutEngine` Protocol, the policy engine and `make_engine`
    vllm/           the vLLM rollout engines (engine.py: in-process and external server, the chunked weight push)
                    and the worker extension that receives the weights inside vLLM (worker.py)
    validation.py   periodic held-out validation: val/greedy_acc, val/sampled_acc
    samples.py      training questions (`QASample`) from `memagent.tasks.schema.read_samples`; `cap_chunks`
    packing.py      packing rows into micro-batches (padded, or padding-free by a token budget), log-probs; the
                    per-row ("varlen") attention for padding-free packing without flash-attention
    lora.py         LoRA adapters through peft: apply, the KL reference without them, merged weights, `merge_lora`
    distributed.py  torchrun: DDP / FSDP2 helpers
    checkpoint/     checkpoints without pickle: full.py (safetensors + JSON, atomic, resumable), sharded.py (DCP,
                    `checkpoint.format: dcp`), state.py (their errors, optimiser and RNG state)
    resume_guard.py what may change on resume: the checkpoint's config and data digest against the run's
    estimate.py     per-GPU memory and steps per epoch of a config, no GPU (`memagent train --dry-run`)
    config.py       TrainConfig and every section (data, rollout, loss, optim, val, log, vllm, lora, checkpoint; the
                    short spellings `data: FILE`, `model: {path: ID, KEY: ...}` declared on their fields), loaded by
                    `memagent.sections`; `build_train_config` (a YAML file + key=value overrides + a profile)
    model_options.py model.* memory settings: gradient checkpointing, FSDP2 CPU offload, attention kernel

Public entry points, imported lazily (so `import memagent.rl` stays cheap):
    train, TrainResult, TrainConfig, load_config, train_sft, SFTConfig, encode_conversation, boxed_reward,
    get_objective (rewards by name: memagent.rewards.registry)
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "train": "memagent.rl.trainer",
    "TrainResult": "memagent.rl.recipe",
    "TrainConfig": "memagent.rl.config",
    "load_config": "memagent.rl.config",
    "train_sft": "memagent.rl.sft",
    "SFTConfig": "memagent.rl.sft",
    "encode_conversation": "memagent.rl.sft",
    "boxed_reward": "memagent.tasks.metrics",
    "get_objective": "memagent.rl.objectives",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'memagent.rl' has no attribute {name!r}")


__all__ = list(_EXPORTS)

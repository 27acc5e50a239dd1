"""Multi-Conv DAPO training (docs/paper.md, "Multi-Conv DAPO") and supervised fine-tuning: one recipe
over pluggable per-row objectives.

    recipe.py       the loop both run: setup / step / save / cleanup; `TrainResult`
    trainer.py      Multi-Conv DAPO as a recipe algorithm (rollout, then optimiser steps); `train()`
    sft.py          supervised fine-tuning as a recipe algorithm; `train_sft()`
    objectives.py   per-row losses registered by name: `dapo`, `sft`; `MiniBatch`
    accumulate.py   one optimiser step's gradient over [(objective, weight, rows)], split- and rank-invariant
    algos.py        pure tensor math: group advantages, broadcast, policy loss, KL, aggregation (registries)
    rollout.py      G runs of the workflow per question -> rows, rewards, dynamic sampling, advantages
    engines.py      the `RolloutEngine` Protocol: the policy itself, in-process vLLM, or an external vLLM server
    weight_sync.py  pushing trained weights into vLLM in chunks (collective_rpc; NCCL broadcast to a server)
    vllm_worker.py  the vLLM worker extension that receives them (runs inside vLLM)
    validation.py   periodic held-out validation: val/greedy_acc, val/sampled_acc
    samples.py      training questions (`QASample`) from `memagent.tasks.schema.read_samples`
    packing.py      packing rows into micro-batches (padded, or padding-free by a token budget), log-probs
    model_options.py model.* memory settings: gradient checkpointing, FSDP2 CPU offload, attention kernel
    estimate.py     per-GPU memory and steps per epoch of a config, no GPU (`memagent train --dry-run`)
    schedule.py     data order, rollout seeds, optimiser + learning-rate schedule
    metrics_log.py  metrics.jsonl (resumable), TensorBoard, progress bar
    checkpoint.py   safetensors + JSON checkpoints, atomic, resumable
    config.py       TrainConfig (YAML + key=value overrides, validated): every loss setting, once
    config_aliases.py short keys of TrainConfig (data=FILE, model.KEY), one table for YAML and overrides
    run_options.py  TrainConfig sections data (max_chunks), val, log (W&B), vllm
    distributed.py  torchrun: DDP / FSDP2 helpers

Public entry points, imported lazily (so `import memagent.rl` stays cheap):
    train, TrainResult, TrainConfig, load_config, train_sft, SFTConfig, encode_conversation, boxed_reward,
    get_reward, get_objective
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
    "get_reward": "memagent.tasks.metrics",
    "get_objective": "memagent.rl.objectives",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'memagent.rl' has no attribute {name!r}")


__all__ = list(_EXPORTS)

"""Training checkpoints, without pickle, written atomically.

    full.py     the checkpoint directory (safetensors weights, optimiser, RNG, trainer_state.json): save, find the
                newest whole one, resume; the default `checkpoint.format`
    sharded.py  `checkpoint.format: dcp`: every rank's shards through torch.distributed.checkpoint, resumable
                under another number of processes; `checkpoint.async_save`
    state.py    what both formats share: their errors, the optimiser and generator (RNG) states as tensors + JSON

The names below are the ones the recipe and the CLI use; import them from here.
"""
from __future__ import annotations

from memagent.rl.checkpoint.full import (checkpoint_dir, checkpoint_problem, finish_checkpoint, latest_checkpoint,
                                         list_checkpoints, load_checkpoint, load_model_weights, resume_checkpoint,
                                         save_checkpoint, write_checkpoint)
from memagent.rl.checkpoint.sharded import PendingCheckpoint, is_sharded
from memagent.rl.checkpoint.state import CheckpointError, TrainOutputError

__all__ = ["CheckpointError", "PendingCheckpoint", "TrainOutputError", "checkpoint_dir", "checkpoint_problem",
           "finish_checkpoint", "is_sharded", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "load_model_weights", "resume_checkpoint", "save_checkpoint", "write_checkpoint"]

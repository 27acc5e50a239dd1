"""What `memagent train` runs: a dry run (the memory estimate) or the training itself, with its guards.

`run_train(cfg, profile_yaml)` refuses an out_dir that would destroy an input and a resume whose settings or data
differ from the run's, takes the run's lock, writes the protocol profile the run uses (rank 0) and trains; with
`dry_run=(gpus, samples)` it only reports the per-GPU memory estimate and the steps per epoch (no GPU, no
weights). The process's rank (torchrun's RANK) is read once, here.
"""
from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

from memagent.config import ConfigError
from memagent.io import atomic_write_text
from memagent.lock import run_lock
from memagent.rl.config import TrainConfig, check_out_dir, config_to_dict
from memagent.rl.estimate import dry_run_report
from memagent.rl.resume_guard import check_resume_dir, file_digest

PROFILE_FILE = "profile.yaml"  # the protocol profile a run uses, beside its config.json


def run_train(cfg: TrainConfig, profile_yaml: str, dry_run: tuple[int, int | None] | None = None) -> str:
    """Train `cfg` (or, with dry_run=(gpus, samples), estimate it); returns the line to print ("" on a rank
    other than 0). profile_yaml: the resolved protocol profile, written to out_dir/profile.yaml."""
    if dry_run is not None:
        return dry_run_report(cfg, *dry_run)
    check_out_dir(cfg)  # before anything is written there (the model's own folder is refused)
    if cfg.data and not Path(cfg.data).is_file():
        raise ConfigError(f"data file {cfg.data} does not exist; give a JSONL of {{id, question, answers, context}}")
    if cfg.resume:  # other settings or data than the run's: refused before profile.yaml is rewritten
        check_resume_dir(cfg.out_dir, config_to_dict(cfg), file_digest(cfg.data.path) if cfg.data else None)
    from memagent.rl.trainer import train  # lazy: torch

    main = int(os.environ.get("RANK", "0")) == 0
    with run_lock(cfg.out_dir, "training run", reenter=True) if main else nullcontext():  # before profile.yaml
        if main:
            atomic_write_text(Path(cfg.out_dir) / PROFILE_FILE, profile_yaml)
        result = train(cfg)  # the trainer takes the same lock again (re-entrant in this process)
    if result.checkpoint is None or not main:
        return ""
    return f"trained {len(result.metrics)} step(s); checkpoint: {result.checkpoint}"

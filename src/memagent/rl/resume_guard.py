"""What `resume=true` may change: a resumed run must be the run it continues.

Every checkpoint holds the run's config (config.json) and, in trainer_state.json, `data_sha256`: the
SHA-256 of the training data (the bytes of the `data` file, or of the samples given to `train()`).
Resuming compares the new settings with the checkpoint's, key by key, and the data digest, and refuses
with the keys that differ: other settings or other data would continue a different run under the old
one's name, its metrics and checkpoints mixed with the new ones, and rewrite its config.json.

May change on resume (RESUMABLE): how long the run goes and how often it saves (total_steps, save_every,
keep_last), where things live (out_dir, device, data.path when the data are the same), what it reports
(progress, tensorboard, log.*, val.*) and memory / placement knobs (strategy: ddp or fsdp, sharded checkpoints reshard) that do not change the gradient
beyond float rounding (model_options.*, vllm.*, checkpoint.async_save, agent.max_batch_docs,
rollout.max_batch_size, update.micro_batch_size, update.micro_batch_tokens), and rollout.seeding (how draws
are keyed: switching it changes the tokens drawn from then on, as resuming a rank-seeded run under another
world size does, and resuming warns of that). Everything else is the run.
A checkpoint written before these fields existed (no config.json, no data_sha256) is resumed unchecked.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any, Iterable

from memagent.config import ConfigDeprecation, workflow_choice_data
from memagent.rl.checkpoint import CheckpointError

RESUMABLE = ("total_steps", "save_every", "keep_last", "resume", "force", "out_dir", "device", "strategy", "data.path",
             "progress", "tensorboard", "log.", "val.", "vllm.", "model_options.", "checkpoint.async_save",
             "agent.max_batch_docs", "rollout.max_batch_size", "update.micro_batch_size",
             "update.micro_batch_tokens", "rollout.seeding")


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim.lr": 1e-6, ...} of a nested config dict."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resumable(key: str) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


def changed_settings(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The keys (dotted) outside RESUMABLE whose values differ, as "key (then -> now)". A checkpoint written before
    the workflow choice had one shape (`workflow: NAME`, `workflow_options`) is read in the new one, silently."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDeprecation)
        saved = workflow_choice_data(saved, "the checkpoint's config.json")
    old, new = flat(saved), flat(now)
    out = []
    for key in sorted(set(old) | set(new)):
        if resumable(key) or old.get(key) == new.get(key):
            continue
        out.append(f"{key} ({_show(old.get(key, '<unset>'))} then, {_show(new.get(key, '<unset>'))} now)")
    return out


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def samples_digest(samples: Iterable[Any]) -> str:
    """SHA-256 of samples given in memory (their reprs, in order)."""
    h = hashlib.sha256()
    for s in samples:
        h.update(repr(s).encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()


def check_resume(ckpt: Path, config: dict[str, Any], data_sha256: str | None) -> None:
    """Refuse to resume checkpoint `ckpt` with `config` (config_to_dict of the new run) or other data."""
    problems = []
    saved_config = _json(ckpt / "config.json")
    if isinstance(saved_config, dict):
        problems += changed_settings(saved_config, config)
    state = _json(ckpt / "trainer_state.json")
    saved_data = state.get("data_sha256") if isinstance(state, dict) else None
    if saved_data and data_sha256 and saved_data != data_sha256:
        problems.append("the training data (another file, or the same file changed)")
    if problems:
        raise CheckpointError(
            f"resume: {ckpt.parent.parent} was trained with other settings than these: {'; '.join(problems)}; "
            "resume with the run's own settings (its config.json) or start a new run in another out_dir "
            "(on resume only total_steps, save_every, keep_last, logging and placement may change: docs/training.md)")


def _json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or damaged (damage is the checkpoint loader's to report)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

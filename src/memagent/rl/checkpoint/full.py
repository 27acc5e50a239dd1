"""The default checkpoint format: a directory of safetensors + JSON, without pickle, written atomically.

Layout of `<out_dir>/checkpoints/step_000010/`:
    model/                    save_pretrained (safetensors) + tokenizer: loadable by transformers and vLLM
    optimizer.safetensors     optimiser state tensors, keyed "<param fqn>/<name>"
    optimizer.json            the optimiser's param groups and non-tensor state
    trainer_state.json        step, data position, scheduler state, anything else JSON-able
    rng_rank<r>.safetensors   torch CPU (and CUDA) generator states of rank r
    rng_rank<r>.json          Python `random` and NumPy generator states of rank r
    config.json               the TrainConfig of the run (when given)
A LoRA run's model/ holds its adapters (memagent.rl.lora); with `sharded` (checkpoint.format=dcp)
the optimiser files are replaced by every rank's DCP shards, dcp/ and dcp_state.json
(memagent.rl.checkpoint.sharded).

Atomicity: everything is written into `step_000010.tmp`, each file fsync'ed, then the directory is
renamed to `step_000010` and its parent fsync'ed. A run killed while saving leaves a `.tmp`
directory that `latest_checkpoint` ignores (and the next save removes), so the previous
checkpoint stays the latest. Loading uses safetensors and json only (nothing is unpickled).

Resuming (`resume_checkpoint`) takes the newest checkpoint whose files are whole: every JSON file
parses and every safetensors file is as long as its header says; a damaged one (a truncated
file, bad JSON) is skipped with a warning naming it, and the one before it is used. A save that
cannot write (disk full, read-only folder) is a `TrainOutputError`, its temporary directory removed.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from memagent.rl.checkpoint.sharded import PendingCheckpoint, load_sharded, save_sharded
from memagent.rl.checkpoint.state import (CheckpointError, TrainOutputError, load_optimizer_state, optimizer_state,
                                          optimizer_state_problem, rng_state, seed_all, set_rng_state)
from memagent.rl.distributed import DistInfo, barrier, full_state_dict, unwrap
from memagent.rl.lora import ADAPTER_CONFIG, is_lora, load_adapters, trainable_state_dict

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temporary directories are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found) if (p / "trainer_state.json").is_file()]


def latest_checkpoint(root: str | Path) -> Path | None:
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (header read, length checked; no tensor is loaded)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8:
                return f"{path.name} is truncated ({size} bytes)"
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{path.name} is not a safetensors file"
    if 8 + n + end != size:
        cut = " (truncated)" if size < 8 + n + end else ""
        return f"{path.name} is {size} bytes where its header says {8 + n + end}{cut}"
    return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why checkpoint `ckpt` cannot be resumed from (a file missing, truncated or not parseable), or None."""
    try:
        try:
            state = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return "trainer_state.json is not valid JSON"
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            return "trainer_state.json has no integer step"
        model_cfg = "adapter_config.json" if (ckpt / "model" / "adapter_config.json").is_file() else "config.json"
        needed = [f"model/{model_cfg}", *(f"rng_rank{r}.{ext}" for r in range(int(state.get("world_size", 1)))
                                        for ext in ("json", "safetensors"))]
        if (ckpt / "optimizer.json").exists() or (ckpt / "optimizer.safetensors").exists():
            needed += ["optimizer.json", "optimizer.safetensors"]
        missing = [name for name in needed if not (ckpt / name).is_file()]
        if missing:
            return f"{', '.join(missing)} missing"
        if not list((ckpt / "model").glob("*.safetensors")):
            return "model/ holds no *.safetensors"
        if (ckpt / "dcp_state.json").is_file() and not list((ckpt / "dcp").glob("*.safetensors")):
            return "dcp/ holds no *.safetensors"
        for f in sorted([*ckpt.glob("*.json"), *(ckpt / "model").glob("*.json")]):
            try:
                json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                return f"{f.relative_to(ckpt)} is not valid JSON"
        for f in sorted([*ckpt.glob("*.safetensors"), *(ckpt / "model").glob("*.safetensors"),
                         *(ckpt / "dcp").glob("*.safetensors")]):
            problem = safetensors_problem(f)
            if problem:
                return problem if f.parent == ckpt else f"{f.parent.name}/{problem}"
    except (OSError, ValueError) as e:
        return f"unreadable ({e})"
    return None


def resume_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root` whose files are whole; each damaged newer one is
    skipped with a warning naming it. None when there is none at all; an error when all are damaged."""
    ckpts = list_checkpoints(root)
    for ckpt in reversed(ckpts):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return ckpt
        log.warning("checkpoint %s is damaged (%s); resuming from an earlier one", ckpt, problem)
    if ckpts:
        raise CheckpointError(f"every checkpoint under {root} is damaged (see the warnings above); move "
                              f"{root} away to start the run over")
    return None


# -- low-level writers --------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")


# -- save / load ----------------------------------------------------------------------------------


def save_checkpoint(root: str | Path, step: int, info: DistInfo, **kw: Any) -> Any:
    """Write checkpoint `step` under `root` atomically; every rank must call this (collectives).

    Keyword arguments as `write_checkpoint`. A write that fails (disk full, file too large,
    read-only folder) removes the temporary directory and raises TrainOutputError; the earlier
    checkpoints are untouched. Returns the checkpoint's Path, or with `asynchronous` a
    `PendingCheckpoint` (memagent.rl.checkpoint.sharded) to `finish_checkpoint` later.
    """
    return _mapped(root, step, info, lambda: write_checkpoint(root, step, info, **kw))


def finish_checkpoint(pending: Any, info: DistInfo) -> Path:
    """Wait for an asynchronous save (`PendingCheckpoint`) and publish it; collective. Returns its Path."""
    return _mapped(pending.path.parent, int(pending.path.name[5:]), info, pending.wait)


def _mapped(root: str | Path, step: int, info: DistInfo, write: Any) -> Any:
    """write(), a failure to write a TrainOutputError (the temporary directory removed)."""
    try:
        return write()
    except (OSError, SafetensorError) as e:
        if info.is_main:
            shutil.rmtree(checkpoint_dir(root, step).with_name(f"step_{step:06d}.tmp"), ignore_errors=True)
        raise TrainOutputError(f"cannot write checkpoint step_{step:06d} under {root}: {e}. Free disk space (or "
                               "raise the file-size limit) or choose another out_dir, then resume; the earlier "
                               "checkpoints are intact") from None


def write_checkpoint(
    root: str | Path,
    step: int,
    info: DistInfo,
    *,
    model: nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    trainer_state: dict[str, Any],
    config: dict[str, Any] | None = None,
    keep_last: int = 0,
    sharded: bool = False,
    asynchronous: bool = False,
) -> Any:
    """Write checkpoint `step` under `root` atomically (no error mapping; see `save_checkpoint`).

    model: the trained model as wrapped for training (DDP, FSDP2 or plain).
    keep_last: delete older complete checkpoints beyond the newest `keep_last` (0 keeps all).
    sharded: the trainable weights and optimiser state also as DCP shards, each rank its own
        (memagent.rl.checkpoint.sharded);
        then rank 0 writes no optimizer.safetensors.
    asynchronous (with sharded): the shards are written in a background thread (DCP async_save) and a
        `PendingCheckpoint` is returned; the checkpoint is published by `finish_checkpoint`.
    """
    root = Path(root)
    final = checkpoint_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("step_*.tmp"):  # left by a run killed while saving
            shutil.rmtree(stale)
        tmp.mkdir()
    barrier(info)
    # the model/ export, collective under FSDP: the full weights (a LoRA run's adapters only) on rank 0
    weights = trainable_state_dict(model) if is_lora(model) else full_state_dict(model)
    if sharded:
        shards, pending = save_sharded(tmp, model, optimizer, info.rank, asynchronous)
        optimizer = None
    opt_tensors, opt_meta = optimizer_state(model, optimizer) if optimizer is not None else ({}, None)
    rng_tensors, rng_meta = rng_state()
    save_file(rng_tensors, tmp / f"rng_rank{info.rank}.safetensors")
    _write_json(tmp / f"rng_rank{info.rank}.json", rng_meta)
    written = [tmp / f"rng_rank{info.rank}.safetensors", tmp / f"rng_rank{info.rank}.json", *(shards if sharded else [])]
    if info.is_main:
        state = dict(trainer_state, step=step, world_size=info.world_size,
                     scheduler=scheduler.state_dict() if scheduler is not None else None)
        written += _write_main_files(tmp, model, weights, tokenizer, (opt_tensors, opt_meta) if optimizer is not None
                                     else None, state, config)
    finish = functools.partial(_finish, tmp, final, written, info, keep_last)
    if sharded and pending is not None:
        return PendingCheckpoint(final, pending, finish)
    return finish()


def _finish(tmp: Path, final: Path, written: list[Path], info: DistInfo, keep_last: int) -> Path:
    """Make this rank's files durable, then (all ranks done) publish `tmp` as `final`; collective."""
    for p in written:
        _fsync_file(p)
    barrier(info)
    if info.is_main:
        _publish(tmp, final, keep_last)
    barrier(info)
    return final


def _write_main_files(tmp: Path, model: nn.Module, weights: dict[str, torch.Tensor], tokenizer: Any,
                      optimizer: tuple[dict[str, torch.Tensor], Any] | None, state: dict[str, Any],
                      config: dict[str, Any] | None) -> list[Path]:
    """Rank 0's files of a checkpoint in `tmp`: model/, optimizer, config, trainer_state.json (last)."""
    written: list[Path] = []
    unwrap(model).save_pretrained(tmp / "model", state_dict=weights, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    written += [p for p in (tmp / "model").iterdir() if p.is_file()]
    if optimizer is not None:
        save_file(optimizer[0], tmp / "optimizer.safetensors")
        _write_json(tmp / "optimizer.json", optimizer[1])
        written += [tmp / "optimizer.safetensors", tmp / "optimizer.json"]
    if config is not None:
        _write_json(tmp / "config.json", config)
        written.append(tmp / "config.json")
    _write_json(tmp / "trainer_state.json", state)  # written last: marks the directory complete
    written.append(tmp / "trainer_state.json")
    return written


def _publish(tmp: Path, final: Path, keep_last: int) -> None:
    """Rename the finished `tmp` to `final` (durably), then drop checkpoints beyond the newest keep_last."""
    for sub in ("model", "dcp"):
        _fsync_dir(tmp / sub)
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. a resumed run ending where it began)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if keep_last:
        for old in list_checkpoints(final.parent)[:-keep_last]:
            shutil.rmtree(old)


def load_model_weights(model: nn.Module, model_dir: Path) -> None:
    """Load a save_pretrained directory's safetensors into an existing (unwrapped) model.

    Missing keys are allowed only for tied parameters (e.g. lm_head tied to the embeddings).
    """
    if (Path(model_dir) / ADAPTER_CONFIG).is_file():  # a LoRA run's adapters
        return load_adapters(model, Path(model_dir))
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {model_dir}; is it a save_pretrained directory?")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(_read(f, load_file))
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    other = [f"{k} {tuple(v.shape)} (the model's: {shapes[k]})" for k, v in state.items()
             if k in shapes and tuple(v.shape) != shapes[k]]
    if other:  # checked here: load_state_dict would raise a RuntimeError listing every tensor
        raise CheckpointError(f"{model_dir} holds weights of other shapes than the model: {', '.join(other[:3])}"
                              f"{f' and {len(other) - 3} more' if len(other) > 3 else ''}; it is another model's "
                              "checkpoint: resume with the run's own model, or move the checkpoint away")
    result = model.load_state_dict(state, strict=False)
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    tied = {n for names in by_id.values() if len(names) > 1 for n in names}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"{model_dir} does not match the model: missing {missing[:5]}, "
                              f"unexpected {result.unexpected_keys[:5]}")


def load_checkpoint(
    ckpt: Path,
    info: DistInfo,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore optimiser, scheduler and this rank's RNG from `ckpt`; returns trainer_state.json.

    The weights are not touched here: build the model from `ckpt/model` (from_pretrained) or call
    `load_model_weights`. model: the model as wrapped for training (DDP/FSDP2/plain), needed with
    `optimizer` to map the saved parameter names; create the optimiser after wrapping.
    """
    ckpt = Path(ckpt)
    state_file = ckpt / "trainer_state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{ckpt} is not a complete checkpoint (no trainer_state.json); "
                              "resume from an earlier step_* directory")
    state = _read(state_file, _load_json)
    sharded = (ckpt / "dcp_state.json").is_file()  # resumable under another number of processes
    if restore_rng and state.get("world_size", 1) != info.world_size and not sharded:
        raise CheckpointError(f"{ckpt} was written by {state.get('world_size')} process(es); resume it with "
                              f"the same --nproc-per-node (got {info.world_size})")
    if optimizer is not None:
        if model is None:
            raise CheckpointError("loading optimizer state needs the model it optimises")
        if sharded:
            load_sharded(ckpt, model, optimizer)
        else:
            tensors, meta = _read(ckpt / "optimizer.safetensors", load_file), _read(ckpt / "optimizer.json", _load_json)
            problem = optimizer_state_problem(model, tensors, meta)
            if problem is not None:
                raise CheckpointError(f"{ckpt}: the optimizer files do not fit the model ({problem}); they are "
                                      "another run's or damaged: move the checkpoint away to resume from an earlier one")
            load_optimizer_state(model, optimizer, tensors, meta)
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng and info.rank >= state.get("world_size", 1):  # a rank the saving run did not have
        seed_all(int(state.get("seed", 0)) + info.rank)
    elif restore_rng:
        tensors = _read(ckpt / f"rng_rank{info.rank}.safetensors", load_file)
        meta = _read(ckpt / f"rng_rank{info.rank}.json", _load_json)
        set_rng_state(tensors, meta)
    return state


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _read(path: Path, reader: Any) -> Any:
    """reader(path), a damaged or missing file a CheckpointError naming it."""
    try:
        return reader(path)
    except (OSError, ValueError, SafetensorError) as e:
        raise CheckpointError(f"cannot read {path}: {e}; the checkpoint is damaged: move it away to resume "
                              "from an earlier one") from None

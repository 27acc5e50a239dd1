"""Sharded training state through torch.distributed.checkpoint (DCP), in safetensors files, without pickle.

With `checkpoint.format: dcp` a checkpoint holds, beside the files of `memagent.rl.checkpoint.full`:
    dcp/shard-<k>-model-00001-of-00001.safetensors   the tensors rank k-1 wrote
    dcp_state.json                                   the optimiser's param groups and non-tensor state
The tensors are the trainable parameters (keys "model/<fqn>"; only the adapters under LoRA) and
the optimiser's tensors ("optim/<fqn>/<name>"; 0-d ones such as AdamW's `step` stored as shape
(1,)). Each rank writes its own file: under FSDP2 its shards of every tensor, under DDP
(replicated tensors) a share of the whole tensors, spread over the ranks by DCP's deduplication.

Where each piece lies is recorded in each file's safetensors header (DCP's "DCP_SHARDING_INFO",
JSON), which `HuggingFaceStorageReader` reads: DCP's default `.metadata` file, which torch writes
and reads with pickle, is neither written nor read, so loading unpickles nothing. Loading asks
for the pieces each rank holds under its current sharding, so N processes' checkpoint resumes
under M. The model/ export (save_pretrained) is written as in the default format.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from memagent.rl.checkpoint.state import CheckpointError, join_optimizer_state, split_optimizer_state
from memagent.rl.distributed import unwrap

DCP_DIR = "dcp"
DCP_STATE = "dcp_state.json"


def _options(strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # lazy: torch

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's (sharded) model and optimiser state dicts, keyed by parameter name (FSDP/DDP prefixes gone).
    Reading the optimiser's state dict creates its state when it has none (so a fresh one can be loaded into)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict  # lazy: torch

    trainable = {n for n, p in unwrap(model).named_parameters() if p.requires_grad}
    msd = {k: v for k, v in get_model_state_dict(model, options=_options()).items() if k in trainable}
    osd = get_optimizer_state_dict(model, optimizer, options=_options()) if optimizer is not None else {}
    return msd, osd


def _flat(msd: dict[str, Any], osd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One flat {key: tensor} of both state dicts (views: loading into them fills msd/osd) and the
    JSON-able rest {param_groups, scalars}."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in msd.items():  # a tied weight (lm_head = embeddings) once: safetensors refuses shared storage
        local = v.to_local() if hasattr(v, "to_local") else v
        if isinstance(v, torch.Tensor) and not (local.numel() and local.data_ptr() in seen):
            tensors[f"model/{k}"] = v
            seen.add(local.data_ptr())
    optim, meta = split_optimizer_state(osd, "optim/", lambda t: t if t.dim() else t.view(1))
    tensors.update(optim)
    return tensors, meta


@dataclass
class PendingCheckpoint:
    """A checkpoint whose shards are still being written in the background (`checkpoint.async_save`)."""

    path: Path  # where it will be published
    future: Future  # DCP's upload: done when this rank's shards are on disk
    finish: Callable[[], Path]  # fsync, wait for every rank, publish (collective)

    def wait(self) -> Path:
        self.future.result()
        return self.finish()


def save_sharded(tmp: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, rank: int,
                 asynchronous: bool = False) -> tuple[list[Path], Future | None]:
    """Write this rank's shards into `tmp`/dcp (collective: every rank calls it) and, on rank 0, dcp_state.json.
    Returns the files this rank wrote that still need an fsync (DCP fsyncs its shard files itself) and, when
    `asynchronous`, the future of the shards' upload: the tensors are copied first (staged), so training may
    change them while the copy is written, by a background thread on a gloo group of its own."""
    import torch.distributed.checkpoint as dcp  # lazy: torch
    from torch.distributed.checkpoint import HuggingFaceStorageWriter  # lazy: torch

    tensors, meta = _flat(*_state(model, optimizer))
    writer = HuggingFaceStorageWriter(str(tmp / DCP_DIR), save_distributed=True, enable_consolidation=False)
    future = None
    with _quiet():
        if asynchronous:
            future = dcp.async_save(tensors, storage_writer=writer, process_group=_async_group(),
                                    no_dist=not _distributed())
        else:
            dcp.save(tensors, storage_writer=writer, no_dist=not _distributed())
    if rank != 0:
        return [], future
    (tmp / DCP_STATE).write_text(json.dumps(meta, indent=1) + "\n")
    return [tmp / DCP_STATE], future


_ASYNC_GROUP: list[Any] = []


def _async_group() -> Any:
    """A gloo process group for background saves (their collectives must not interleave with training's);
    created once, by every rank at its first asynchronous save. None when not distributed."""
    if not _distributed():
        return None
    if not _ASYNC_GROUP:
        import torch.distributed as dist  # lazy: torch

        _ASYNC_GROUP.append(dist.new_group(backend="gloo"))
    return _ASYNC_GROUP[0]


def load_sharded(ckpt: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load the trainable weights and the optimiser state of a dcp checkpoint into `model` (as wrapped for
    training) and `optimizer`, whatever number of processes wrote it (collective)."""
    import torch.distributed.checkpoint as dcp  # lazy: torch
    from torch.distributed.checkpoint import HuggingFaceStorageReader  # lazy: torch
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict  # lazy: torch

    msd, osd = _state(model, optimizer)
    tensors, _ = _flat(msd, osd)
    try:
        meta = json.loads((ckpt / DCP_STATE).read_text(encoding="utf-8"))
        with _quiet():
            dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(ckpt / DCP_DIR)), no_dist=not _distributed())
    except (OSError, ValueError, RuntimeError, KeyError, AssertionError) as e:
        raise CheckpointError(f"cannot load the sharded state in {ckpt / DCP_DIR}: {e}; the checkpoint is damaged "
                              "or from another model or lora setting: move it away to resume from an earlier one") from None
    set_model_state_dict(model, msd, options=_options(strict=False))  # the trainable weights only
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, join_optimizer_state(osd["state"], meta), options=_options())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's warning that one process saves or loads (intended: a run without torchrun)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _distributed() -> bool:
    import torch.distributed as dist  # lazy: torch

    return dist.is_available() and dist.is_initialized()


def is_sharded(ckpt: Path) -> bool:
    return (Path(ckpt) / DCP_STATE).is_file()

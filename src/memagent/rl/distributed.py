"""Data parallelism for the trainer: one process per device under `torchrun --nproc-per-node N`.

Strategies: "ddp" (DistributedDataParallel: every rank holds the whole model, gradients are
all-reduced) and "fsdp" (FSDP2 `fully_shard`: parameters, gradients and optimiser state are
sharded; for models that do not fit one device). gloo on CPU, NCCL on GPU. Without torchrun
everything here degrades to a single process and no collective is called.

Gradient scale: both wrappers AVERAGE gradients over ranks, while the trainer's loss is already
normalised by the mini-batch's global count (summed over ranks), so each rank multiplies its
loss by `world_size` (see `DistInfo.grad_scale`) to get the SUM the math asks for.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def grad_scale(self) -> float:
        return float(self.world_size)


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local if world > 1 else (dev.index or 0))
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world, local, dev)


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce(t: torch.Tensor, info: DistInfo, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce on a copy placed where the backend wants it; returns the reduced tensor."""
    if not info.enabled:
        return t
    work = t.detach().clone().to(info.device)
    dist.all_reduce(work, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return work.to(t.device)


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def wrap_model(model: nn.Module, strategy: str, info: DistInfo, offload: Any = None) -> nn.Module:
    """DDP or FSDP2 around `model` (already on info.device); the model itself when not distributed.
    offload: an FSDP2 OffloadPolicy for every shard (memagent.rl.model_options.offload_policy) or None."""
    if not info.enabled:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP  # lazy: torch

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DDP(model, device_ids=ids, broadcast_buffers=False)  # buffers (rotary tables) are constants
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard  # lazy: torch

        layers = getattr(getattr(model, "model", None), "layers", None)
        kw = {} if offload is None else {"offload_policy": offload}
        for layer in layers or []:  # shard each decoder layer, then the rest (embeddings, head)
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        return model
    raise ValueError(f"unknown strategy {strategy!r}; choose ddp or fsdp")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain Hugging Face model inside a DDP wrapper (FSDP2 modifies the model in place)."""
    return getattr(model, "module", model)


def is_fsdp(model: nn.Module) -> bool:
    return hasattr(model, "set_requires_gradient_sync")


@contextlib.contextmanager
def no_grad_sync(model: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient all-reduce of this backward (gradient accumulation) when `skip`."""
    if not skip:
        yield
    elif hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
    elif is_fsdp(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def full_state_dict(model: nn.Module, all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """The whole model's parameters (unwrapped names). Collective under FSDP2.

    all_ranks=False: on CPU, and under FSDP2 only rank 0 receives it (others get {}), which is
    what checkpointing needs; all_ranks=True: every rank gets the full tensors on its device.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # lazy: torch

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks))


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global gradient norm (over all ranks' shards under FSDP), clipping to max_norm when > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
        norm = norm.full_tensor()
    return norm.detach().float().cpu()

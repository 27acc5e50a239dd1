"""What every checkpoint format shares: its errors, the optimiser state and the generator states.

    CheckpointError, TrainOutputError   a checkpoint that cannot be resumed from / a run that cannot write
    optimizer_state, load_optimizer_state   the whole optimiser state as safetensors tensors + JSON (the
                                        default format's optimizer.safetensors / optimizer.json)
    split_optimizer_state, join_optimizer_state   an optimiser state dict <-> (tensors, JSON-able rest); the
                                        sharded format (`memagent.rl.checkpoint.sharded`) uses them too
    rng_state, set_rng_state, seed_all  a process's generator states (torch CPU/CUDA, Python `random`, NumPy)
"""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from memagent.config import ConfigError
from memagent.errors import MemAgentError


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete or does not fit the run; the message says what to do.

    A ConfigError, so the CLI reports it as one line (resuming is a configuration choice).
    """


class TrainOutputError(MemAgentError):
    """A training run cannot write its files (disk full, file too large, read-only folder)."""


# -- optimiser state ------------------------------------------------------------------------------


def split_optimizer_state(osd: dict[str, Any], prefix: str = "",
                          tensor: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
                          ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimiser state dict (keyed by parameter name) as {prefix + "<fqn>/<name>": tensor(value)} and the
    JSON-able rest {param_groups (tuples as lists), scalars (the non-tensor state)}."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for fqn, entry in osd.get("state", {}).items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}{fqn}/{key}"] = tensor(value)
            else:
                scalars.setdefault(fqn, {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in osd.get("param_groups", [])]
    return tensors, {"param_groups": groups, "scalars": scalars}


def join_optimizer_state(state: dict[str, dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The optimiser state dict of `state` ({fqn: {name: tensor}}, updated in place with meta's scalars) and
    meta's param groups (betas back to a tuple): the inverse of `split_optimizer_state`."""
    for fqn, extra in meta["scalars"].items():
        state.setdefault(fqn, {}).update(extra)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The full optimiser state keyed by parameter name: (tensors, JSON-able rest). Collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict  # lazy: torch

    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return split_optimizer_state(osd, tensor=lambda t: t.detach().cpu().contiguous())


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         meta: dict[str, Any]) -> None:
    """Load what `optimizer_state` returned (read back from optimizer.safetensors / optimizer.json)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # lazy: torch

    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        fqn, _, name = key.rpartition("/")
        state.setdefault(fqn, {})[name] = value
    set_optimizer_state_dict(model, optimizer, join_optimizer_state(state, meta),
                             options=StateDictOptions(full_state_dict=True))


_WRAPPERS = ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def optimizer_state_problem(model: nn.Module, tensors: dict[str, torch.Tensor], meta: Any) -> str | None:
    """Why saved optimiser state does not fit `model` (None when it does): a file of another run or model
    would otherwise load, or fail later inside AdamW's first step with a shape error.

    Checks the layout of optimizer.json, that every tensor names a parameter of the model (names as
    `optimizer_state` writes them: without the DDP/FSDP/compile wrapper prefixes) and that the moment
    tensors have that parameter's shape."""
    if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list) \
            or not isinstance(meta.get("scalars"), dict):
        return "optimizer.json has no param_groups list and scalars mapping"
    shapes = {".".join(p for p in name.split(".") if p not in _WRAPPERS): tuple(param.shape)
              for name, param in model.named_parameters()}
    for key, value in tensors.items():
        fqn, _, name = key.rpartition("/")
        if fqn not in shapes:
            return f"optimizer.safetensors holds {key!r}, for a parameter the model does not have"
        if name != "step" and tuple(value.shape) != shapes[fqn]:
            return f"{key} has shape {tuple(value.shape)}, the parameter {shapes[fqn]}"
    return None


# -- generator states ------------------------------------------------------------------------------


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's generator states: tensors (torch) and JSON-able values (random, NumPy)."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    version, state, gauss = random.getstate()
    np_state = np.random.get_state()
    meta = {
        "python": [version, list(state), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return tensors, meta


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def seed_all(seed: int) -> None:
    """Seed torch, Python `random` and NumPy (a fresh run's rank, or a rank a resumed run did not have)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)

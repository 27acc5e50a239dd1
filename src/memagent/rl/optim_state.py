"""The whole optimiser state as safetensors tensors + JSON (the default checkpoint format's optimizer files)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The full optimiser state keyed by parameter name: (tensors, JSON-able rest). Collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for fqn, entry in osd.get("state", {}).items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{fqn}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(fqn, {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in osd.get("param_groups", [])]
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         meta: dict[str, Any]) -> None:
    """Load what `optimizer_state` returned (read back from optimizer.safetensors / optimizer.json)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        fqn, _, name = key.rpartition("/")
        state.setdefault(fqn, {})[name] = value
    for fqn, extra in meta["scalars"].items():
        state.setdefault(fqn, {}).update(extra)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))

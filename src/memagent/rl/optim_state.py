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

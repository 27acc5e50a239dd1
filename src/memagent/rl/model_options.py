"""Memory settings of the trained model (`model.*` of a TrainConfig): attention kernel, gradient
checkpointing, FSDP2 CPU offload.

    attn_implementation   "auto" picks flash_attention_2 on CUDA when the flash-attn package imports (its varlen
                          kernels then serve padding-free packing), else transformers' default (sdpa), which
                          `prepare_model` switches to "varlen" (memagent.rl.packing: per-row sdpa) when
                          update.packing is on; "varlen" asks for that switch explicitly
    gradient_checkpointing each decoder layer's activations are recomputed in the backward pass
                          (non-reentrant torch.utils.checkpoint): the same gradient, less memory, ~1/3 more compute
    cpu_offload           under strategy fsdp, FSDP2's CPUOffloadPolicy keeps parameter, gradient and optimiser
                          shards on the CPU, copying each layer's parameters in for its forward and backward
"""
from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import nn

from memagent.config import ConfigError
from memagent.rl.config import ModelOptions
from memagent.rl.packing import use_varlen


def load_kwargs(opts: ModelOptions, device: torch.device) -> dict[str, Any]:
    """Extra keyword arguments of `from_pretrained` for these options: {} or {"attn_implementation": ...}."""
    choice = opts.attn_implementation
    if choice == "auto":
        has_flash = device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None
        return {"attn_implementation": "flash_attention_2"} if has_flash else {}
    if choice == "varlen":  # loaded as transformers' default, then switched by prepare_model
        return {}
    if choice == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("model.attn_implementation=flash_attention_2 needs the flash-attn package (a CUDA GPU): "
                          "pip install flash-attn, or set model.attn_implementation=auto")
    return {"attn_implementation": choice}


def prepare_model(model: nn.Module, opts: ModelOptions, packed: bool = False) -> nn.Module:
    """Turn on gradient checkpointing when asked, and varlen attention when asked or when `packed`
    (padding-free micro-batches) leaves "auto" on sdpa (in place); returns the model."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if opts.attn_implementation == "varlen" or (packed and opts.attn_implementation == "auto" and current == "sdpa"):
        use_varlen(model)
    if opts.gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ConfigError(f"model.gradient_checkpointing: {type(model).__name__} does not support it; "
                              "set model.gradient_checkpointing=false")
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def offload_policy(opts: ModelOptions, strategy: str, device: str = "auto") -> Any | None:
    """FSDP2's CPUOffloadPolicy when model.cpu_offload is set (strategy fsdp, on GPUs), else None. `wrap_model`
    applies it under torchrun only (one process shards nothing). device: TrainConfig.device."""
    if not opts.cpu_offload:
        return None
    if strategy != "fsdp":
        raise ConfigError("model.cpu_offload needs strategy=fsdp (FSDP2 offloads its shards; DDP keeps whole copies)")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        raise ConfigError("model.cpu_offload needs GPUs (FSDP2 copies the offloaded shards to an accelerator); "
                          "on the CPU the parameters are in host memory already: set model.cpu_offload=false")
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy  # lazy: torch (FSDP2 only)
    except ImportError:
        raise ConfigError(f"model.cpu_offload: torch {torch.__version__} has no FSDP2 CPUOffloadPolicy; "
                          "set model.cpu_offload=false or upgrade torch") from None
    return CPUOffloadPolicy()

"""Per-row attention for padding-free packing without flash-attention ("varlen" attention).

A packed micro-batch (`rl/packing.pack_flat`) is one sequence of several rows back to back, position ids
restarting at 0 on each row:

    [prompt_1 response_1 | prompt_2 response_2 | ...]     (1, L),  L = l_1 + l_2 + ...

transformers' sdpa and eager paths read the restarts as separate sequences by building a dense (L, L)
block-diagonal mask, so attention still costs L^2 per head (and the masked kernel is slower than the causal
one). flash-attention's varlen kernels compute each row's causal attention only (sum of l_i^2), but exist on
CUDA with the flash-attn package only. This module gives the same per-row computation everywhere: an
attention implementation registered with transformers as `memagent_varlen` (`register()`), which

- for a packed forward (no mask, queries = keys, several rows): runs PyTorch's causal
  `scaled_dot_product_attention` on each row's slice and concatenates (same result as the block-diagonal
  mask, up to float rounding; row boundaries from `cu_seq_lens_q` when the caller passes them, else from
  the position-id restarts);
- for anything else (padding masks, a KV cache, one row): calls transformers' own sdpa function unchanged.

Its mask function skips the dense mask exactly when the forward has no padding mask, no cache offset and
as many queries as keys; it builds sdpa's mask otherwise. Models with sliding-window layers are refused
(`check_model`): a skipped mask would drop their window.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memagent.config import ConfigError

NAME = "memagent_varlen"


def row_bounds(position_ids: Tensor | None, cu_seq_lens: Tensor | None, length: int) -> list[int]:
    """Start offsets of the rows of one packed sequence plus its end: [0, s_1, ..., length].

    cu_seq_lens: (n + 1,) cumulative row lengths when given (the flash-attention convention); else a row starts
    wherever position_ids (1, L) restarts at 0 (or does not step by 1). Neither: one row."""
    if cu_seq_lens is not None:
        return [int(x) for x in cu_seq_lens.tolist()]
    if position_ids is None:
        return [0, length]
    pos = position_ids[0]
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1
    return [0, *starts.tolist(), length]


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, H_kv, L, D) -> (B, H_kv * groups, L, D), each key/value head repeated for its query heads."""
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def varlen_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query (B, H, L, D), key/value (B, H_kv, L_k, D) ->
    ((B, L, H, D), None). Per-row causal attention for a packed forward; transformers' sdpa otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: transformers

    if kwargs.get("sliding_window") is not None:
        raise ConfigError("model.attn_implementation=varlen does not support sliding-window attention")
    b, _, n, _ = query.shape
    packed = attention_mask is None and b == 1 and n == key.shape[2] and n > 1
    bounds = row_bounds(kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q"), n) if packed else []
    if len(bounds) <= 2:  # not packed, or a single row: exactly what sdpa would do
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    p = dropout if module.training else 0.0
    rows = [F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=p,
                                           is_causal=True, scale=scaling)
            for s, e in zip(bounds[:-1], bounds[1:])]  # each (1, H, l_i, D)
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None


def varlen_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' mask-function signature: no mask for a forward that has no padding mask, no cache offset
    and as many queries as keys (varlen_attention then splits the rows itself); sdpa's mask otherwise."""
    from transformers.masking_utils import sdpa_mask  # lazy: transformers

    names = ("batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function", "attention_mask")
    given = {**dict(zip(names, args)), **kwargs}
    plain = (given.get("attention_mask") is None and given.get("q_offset", 0) == 0 and given.get("kv_offset", 0) == 0
             and given.get("q_length") == given.get("kv_length"))
    return None if plain else sdpa_mask(*args, **kwargs)


def register() -> str:
    """Register the attention and mask functions with transformers (idempotent); returns their name."""
    from transformers import AttentionInterface  # lazy: transformers
    from transformers.masking_utils import AttentionMaskInterface  # lazy: transformers

    AttentionInterface.register(NAME, varlen_attention)
    AttentionMaskInterface.register(NAME, varlen_mask)
    return NAME


def check_model(model: nn.Module) -> None:
    """Refuse models varlen attention would compute wrongly: sliding-window layers, non-causal attention."""
    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"model.attn_implementation=varlen needs a transformers model, got {type(model).__name__}")
    layer_types = getattr(config, "layer_types", None) or []
    sliding = getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types)
    if sliding or not getattr(config, "is_causal", True):
        raise ConfigError("model.attn_implementation=varlen supports causal full-attention models only; this model has "
                          "sliding-window or non-causal layers: use sdpa or flash_attention_2")


def use_varlen(model: nn.Module) -> nn.Module:
    """Switch a loaded transformers model to varlen attention (in place); returns the model."""
    check_model(model)
    name = register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    return model


def is_varlen(model: nn.Module) -> bool:
    """Whether the model computes attention with this module (so packed forwards may pass row bounds)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME

"""The demo's tiny model: a stock LFM2 (transformers' `Lfm2ForCausalLM`), whose short causal
convolutions give every token a view of its predecessors (the "previous-token mixing" a 2-layer
attention-only model lacks for key -> value lookup). It loads with `AutoModelForCausalLM` like
any model; only its initialisation differs: each conv starts as a fixed mix of the current and
the two previous tokens instead of random, so copying a value after its key is learnable in
about a minute of CPU training.
"""
from __future__ import annotations

from typing import Any

import torch


def build_demo_model(vocab_size: int, pad_id: int, eos_id: int, *, hidden: int = 64, seed: int = 0,
                     layers: tuple[str, ...] = ("conv", "full_attention", "conv", "full_attention"),
                     heads: int = 4, max_positions: int = 4096) -> Any:
    from transformers import Lfm2Config, Lfm2ForCausalLM  # lazy: transformers

    torch.manual_seed(seed)
    cfg = Lfm2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                     num_hidden_layers=len(layers), layer_types=list(layers), num_attention_heads=heads,
                     num_key_value_heads=heads, max_position_embeddings=max_positions,
                     block_auto_adjust_ff_dim=False, conv_bias=True, pad_token_id=pad_id, eos_token_id=eos_id,
                     bos_token_id=eos_id, tie_word_embeddings=True, initializer_range=0.1)
    model = Lfm2ForCausalLM(cfg)
    with torch.no_grad():  # conv = [current | previous | two back] thirds of the channels, gates open
        for layer in model.model.layers:
            conv = getattr(layer, "conv", None)
            if conv is None:
                continue
            conv.in_proj.bias.zero_()
            conv.in_proj.bias[: 2 * hidden] = 1.0
            w = torch.zeros_like(conv.conv.weight)  # (hidden, 1, L)
            third = hidden // 3
            w[:third, 0, -1] = 1.0
            w[third : 2 * third, 0, -2] = 1.0
            w[2 * third :, 0, -3] = 1.0
            conv.conv.weight.copy_(w)
            conv.conv.bias.zero_()
            conv.out_proj.bias.zero_()
    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    return model

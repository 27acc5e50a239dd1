"""Prompt-lookup speculative decoding of one row with a transformers model (`memagent.backends.speculate`
says what is drafted, what is kept, and which sampling rules keep the distribution)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from memagent.backends.row_sampling import sample_rows
from memagent.backends.speculate import DRAFT_TOKENS, MAX_NGRAM, accept, lookup_draft


Pick = Callable[[Tensor, int], list[int]]  # (logits (K+1, V), decode position of row 0) -> K+1 token ids


@dataclass
class Speculated:
    """One row's reply: its tokens (EOS included when it stopped on one) and the draft tokens proposed / accepted."""

    token_ids: list[int]  # [T_out]
    proposed: int = 0
    accepted: int = 0
    finish_reason: str = "length"


def speculative_decode(model: Any, prompt_ids: Sequence[int], max_new_tokens: int, pick: Pick,
                       eos_ids: Sequence[int], num_draft: int = DRAFT_TOKENS, max_ngram: int = MAX_NGRAM) -> Speculated:
    """Decode one row with prompt-lookup drafts verified by `model` (a transformers causal LM with a KV cache).

    The cache always covers every token but the last one emitted; a step feeds [last] + draft (K+1 tokens),
    picks K+1 tokens from their logits, keeps `accept(draft, picked)` and crops the rejected drafts off the cache."""
    from transformers import DynamicCache  # lazy: transformers

    device = next(model.parameters()).device
    cache = DynamicCache()
    # the cache keyword: `cache` from transformers 5.x's rename on, `past_key_values` before it
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = list(prompt_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=device), **{key: cache}, use_cache=True).logits
    out = pick(logits[0, -1:].float(), 0)[:1]  # the first new token
    eos = set(eos_ids)
    proposed = accepted = 0
    while out[-1] not in eos and len(out) < max_new_tokens:
        context = ids + out
        draft = lookup_draft(context, min(num_draft, max_new_tokens - len(out) - 1), max_ngram)
        feed = torch.tensor([[out[-1], *draft]], device=device)  # (1, K+1)
        with torch.no_grad():
            logits = model(input_ids=feed, **{key: cache}, use_cache=True).logits[0].float()  # (K+1, V)
        kept = accept(draft, pick(logits, len(out)))
        proposed += len(draft)
        accepted += len(kept) - 1
        rejected = len(draft) + 1 - len(kept)  # fed and not kept: the cache keeps [last] + the accepted drafts
        if rejected:
            cache.crop(-rejected)  # a negative count removes that many (transformers 4 and 5 alike)
        for tok in kept:
            out.append(tok)
            if tok in eos or len(out) == max_new_tokens:
                break
    finish = "stop" if out[-1] in eos else "length"
    return Speculated(out, proposed, accepted, finish)


def greedy_pick(vocab_limit: int | None) -> Pick:
    """argmax of each position's logits, over the first `vocab_limit` ids (all when None)."""
    def pick(logits: Tensor, t: int) -> list[int]:
        return logits[:, :vocab_limit].argmax(-1).tolist()
    return pick


def row_pick(uniforms: Tensor, temperature: float, top_p: float, vocab_limit: int | None) -> Pick:
    """Per-row seeded sampling (`row_sampling.sample_rows`): position t draws at uniforms[t], as plain decoding does."""
    def pick(logits: Tensor, t: int) -> list[int]:
        u = uniforms[t : t + logits.shape[0]]
        return sample_rows(logits[: len(u), :vocab_limit], u, temperature, top_p).tolist()
    return pick


def sample_pick(generator: torch.Generator, temperature: float, top_p: float, vocab_limit: int | None) -> Pick:
    """Each position drawn from the model's distribution (temperature, top-p) with `generator`."""
    def pick(logits: Tensor, t: int) -> list[int]:
        u = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64)
        return sample_rows(logits[:, :vocab_limit], u, temperature, top_p).tolist()
    return pick

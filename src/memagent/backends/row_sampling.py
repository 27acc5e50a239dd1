"""Batch-invariant sampling for the transformers backend: every row draws with its own seed.

`generate(do_sample=True)` draws all rows of a batch from one global generator, so a row's tokens depend
on which rows share its batch and in what order. With per-row seeds (`SamplingParams.seeds`) the
backend instead runs `generate` greedily with a `RowSampler` among its logits processors: for each row
it applies the temperature and top-p itself, then picks the token by inverse CDF at that row's own
uniform draw u[r, t] (t: the decode position), and returns scores that are 0 at the picked token and
-inf elsewhere, so the greedy argmax takes exactly that token. The uniforms of a row are the first
max_new_tokens draws of a `torch.Generator` seeded with the row's seed, made before generation.

So a row's tokens depend only on its prompt, its seed and the model's logits for it: the same seed gives
the same tokens alone, in any batch and under any padding, as long as the logits themselves do not
move with the batch (float64/float32 on CPU: rounding only; low-precision GPU kernels can differ by
batch shape, and a draw that falls within that difference of a CDF boundary then picks a neighbour).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def row_uniforms(seeds: Sequence[int], steps: int) -> Tensor:
    """(B, steps) float64 in [0, 1): row r holds the first `steps` draws of a generator seeded seeds[r]."""
    out = torch.empty((len(seeds), steps), dtype=torch.float64)
    for r, seed in enumerate(seeds):
        out[r] = torch.rand(steps, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float64)
    return out


def sample_rows(scores: Tensor, u: Tensor, temperature: float, top_p: float) -> Tensor:
    """(B,) int64 token per row, drawn by inverse CDF at u (B,) from softmax(scores / temperature),
    restricted to the top-p nucleus (the most probable tokens whose mass first reaches top_p).

    scores: (B, V) logits (-inf: excluded). Token order is the vocabulary's, so the pick is a pure function
    of the row's scores and u."""
    probs = torch.softmax(scores.double() / temperature, dim=-1)  # (B, V)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)  # (B, V)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the tokens ranked above each
        keep_sorted = before < top_p  # the top token is always kept (before = 0)
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    cdf = torch.cumsum(probs, dim=-1)  # (B, V), not normalised
    target = (u.to(cdf.device, torch.float64) * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    picked = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # first index with cdf > target
    return picked.clamp(max=scores.shape[-1] - 1)


class RowSampler:
    """A transformers logits processor that samples each row with its own uniforms (see the module
    docstring). width: the (padded) prompt length, so decode position t = input length - width."""

    def __init__(self, uniforms: Tensor, temperature: float, top_p: float, width: int) -> None:
        self.uniforms, self.temperature, self.top_p, self.width = uniforms, temperature, top_p, width

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        t = input_ids.shape[1] - self.width
        picked = sample_rows(scores, self.uniforms[:, t], self.temperature, self.top_p)  # (B,)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, picked.unsqueeze(-1), 0.0)
        return out

"""Multi-Conv DAPO as pure tensor functions (docs/paper.md, "Multi-Conv DAPO").

Everything here is a function of tensors and named scalars; nothing reads a config object.

Shapes used throughout:
    S  samples (rollouts) in the batch; G of them share a group (one question)
    N  conversation rows; sample i contributes n_i rows (its memory updates and its final answer)
    T  response tokens per row (right padded; `mask` marks real tokens)

The algorithm, and where this module departs from the paper:
- `group_advantages`: A_i = R_i - mean(R of i's group), no division by the std (Dr. GRPO), as in
  the paper; dividing by the std is an option (plain GRPO).
- `broadcast_advantages`: A_i is copied to every conversation row of sample i, unchanged.
- `policy_loss`: PPO clipped ratio per token with DAPO's clip-higher (eps_low, eps_high) and
  dual-clip c for negative advantages. Aggregation is an explicit named mode; the paper's
  reference code uses `token-mean` over all tokens of all conversations of the mini-batch.
  `sample-mean` (each sample counts once, whatever its number of conversations) is our addition.
- `kl_penalty`: the k1/k2/k3 estimators of KL(policy || reference); k3 (the paper's, "low
  variance") is clamped to [-10, 10] as in the reference code; k1 and k2 are not clamped.

Split invariance. Every aggregation mode is a weighted sum of per-row token sums:
    loss = sum_n w_n * sum_t mask[n, t] * l[n, t]
with a per-row weight w_n = c_n / D, where c_n depends only on the row (or on its sample) and D
counts a unit of the whole mini-batch (tokens, rows or samples). `row_loss_weights` computes w_n;
passing the mini-batch's D (summed over micro-batches and data-parallel ranks) as `denominator`
makes the summed micro-batch losses equal the mini-batch loss for any split.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from memagent.errors import MemAgentError

AGG_MODES = (
    "token-mean",  # sum of token losses / tokens in the mini-batch (paper's reference code)
    "seq-mean-token-mean",  # mean over rows of each row's token mean
    "seq-mean-token-sum",  # mean over rows of each row's token sum
    "seq-mean-token-sum-norm",  # seq-mean-token-sum / horizon (Dr. GRPO's constant normaliser)
    "sample-mean",  # mean over samples of each sample's token mean over all its conversations
)

# Which unit the denominator D of each mode counts.
_AGG_UNIT = {
    "token-mean": "tokens",
    "seq-mean-token-mean": "rows",
    "seq-mean-token-sum": "rows",
    "seq-mean-token-sum-norm": "rows",
    "sample-mean": "samples",
}


class UnknownNameError(MemAgentError, ValueError):
    """A mode/kind name is not registered; the message lists the valid names."""


def _check_name(name: str, valid: tuple[str, ...] | list[str], what: str) -> None:
    if name not in valid:
        raise UnknownNameError(f"unknown {what} {name!r}; choose one of: {', '.join(valid)}")


# -- advantages ----------------------------------------------------------------------------


def group_advantages(
    rewards: Tensor, group_ids: Tensor, norm_by_std: bool = False, eps: float = 1e-6
) -> Tensor:
    """Per-sample advantage A_i = R_i - mean(R_group(i)) (Dr. GRPO, the paper's choice).

    rewards: (S,) float; group_ids: (S,) int, any values (samples with the same id share a group).
    norm_by_std: divide by (std of the group + eps), unbiased std, as plain GRPO does; a group
        of one sample gets std 1 (its advantage is 0 anyway).
    Returns (S,) float, same dtype as `rewards`.
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and group_ids must both be (S,), got {tuple(rewards.shape)} "
                         f"and {tuple(group_ids.shape)}")
    _, inv = torch.unique(group_ids, return_inverse=True)  # (S,) dense group index
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inv, torch.ones_like(rewards))
    total = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inv, rewards)
    mean = total / count  # (n_groups,)
    adv = rewards - mean[inv]  # (S,)
    if norm_by_std:
        sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inv, adv * adv)
        std = (sq / (count - 1).clamp_min(1)).sqrt()
        std = torch.where((count > 1) & (std > 0), std, torch.ones_like(sq))  # all-equal group: A = 0
        adv = adv / (std[inv] + eps)
    return adv


def broadcast_advantages(sample_adv: Tensor, sample_index: Tensor) -> Tensor:
    """One advantage per conversation row, copied from its sample.

    sample_adv: (S,) float; sample_index: (N,) int in [0, S), any number of rows per sample.
    Returns (N,) float.
    """
    if sample_index.numel() and (int(sample_index.min()) < 0 or int(sample_index.max()) >= sample_adv.numel()):
        raise ValueError(f"sample_index must lie in [0, {sample_adv.numel()}), got values in "
                         f"[{int(sample_index.min())}, {int(sample_index.max())}]")
    return sample_adv[sample_index]


def informative_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling: True for samples whose group's rewards are not all equal.

    rewards: (S,) float; group_ids: (S,) int. Returns (S,) bool.
    """
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    lo = torch.full((n_groups,), float("inf"), dtype=torch.float64).scatter_reduce(
        0, inv, rewards.double(), reduce="amin")
    hi = torch.full((n_groups,), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, inv, rewards.double(), reduce="amax")
    return (hi > lo)[inv]


# -- aggregation ---------------------------------------------------------------------------


def loss_denominator(mask: Tensor, agg: str, sample_index: Tensor | None = None) -> Tensor:
    """The count D that mode `agg` divides by, for these rows: tokens, rows or samples.

    mask: (N, T) 0/1; sample_index: (N,) int, needed by `sample-mean`. Returns a 0-d float64
    tensor (so it can be all-reduced and summed over micro-batches).
    """
    _check_name(agg, AGG_MODES, "aggregation mode")
    unit = _AGG_UNIT[agg]
    if unit == "tokens":
        return mask.sum().double()
    if unit == "rows":
        return torch.tensor(float(mask.shape[0]), dtype=torch.float64)
    if sample_index is None:
        raise ValueError("agg='sample-mean' needs sample_index (N,) to know which rows share a sample")
    return torch.tensor(float(torch.unique(sample_index).numel()), dtype=torch.float64)


def row_loss_weights(
    mask: Tensor,
    agg: str,
    sample_index: Tensor | None = None,
    horizon: int | None = None,
    denominator: Tensor | float | None = None,
) -> Tensor:
    """Per-row weight w_n so that the aggregated loss is sum_n w_n * sum_t mask * loss.

    mask: (N, T) 0/1; sample_index: (N,) int (for `sample-mean`, rows of one sample must all be
    present: the sample's token count is taken over these rows); horizon: the constant of
    `seq-mean-token-sum-norm` (default T); denominator: the mode's count D over the whole
    mini-batch (default: `loss_denominator` of these rows). Returns (N,) float64.
    """
    _check_name(agg, AGG_MODES, "aggregation mode")
    d = loss_denominator(mask, agg, sample_index) if denominator is None else denominator
    d = torch.as_tensor(d, dtype=torch.float64).clamp_min(1e-12)
    n_tok = mask.sum(-1).double()  # (N,)
    if agg in ("token-mean", "seq-mean-token-sum"):
        coef = torch.ones_like(n_tok)
    elif agg == "seq-mean-token-mean":
        coef = 1.0 / n_tok.clamp_min(1)
    elif agg == "seq-mean-token-sum-norm":
        coef = torch.full_like(n_tok, 1.0 / float(horizon if horizon is not None else mask.shape[-1]))
    else:  # sample-mean
        assert sample_index is not None  # loss_denominator raised otherwise
        _, inv = torch.unique(sample_index, return_inverse=True)
        per_sample = torch.zeros(int(inv.max()) + 1 if inv.numel() else 0, dtype=torch.float64)
        per_sample.index_add_(0, inv, n_tok)
        coef = 1.0 / per_sample[inv].clamp_min(1)
    return coef / d


def agg_loss(
    values: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
    *,
    sample_index: Tensor | None = None,
    horizon: int | None = None,
    row_weights: Tensor | None = None,
) -> Tensor:
    """Aggregate per-token values (N, T) to a scalar with mode `agg` (see `row_loss_weights`).

    row_weights: (N,) precomputed weights (mini-batch normalisation); default: these rows alone.
    """
    if row_weights is None:
        row_weights = row_loss_weights(mask, agg, sample_index, horizon)
    row_sums = (values * mask).sum(-1)  # (N,)
    return (row_sums * row_weights.to(values.dtype)).sum()


# -- policy loss ---------------------------------------------------------------------------


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_c: float,
    agg: str,
    *,
    sample_index: Tensor | None = None,
    horizon: int | None = None,
    row_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with clip-higher (DAPO) and dual-clip for negative advantages.

    Per token, with r = exp(logp - old_logp) and advantage A:
        l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        l = min(l, -A clip_c)   only where A < 0 (dual clip, bounds the loss when r is huge)
    then aggregated with mode `agg` (see `row_loss_weights`). The settings have no defaults here:
    they are declared once, in `memagent.rl.config.LossConfig`.

    logp, old_logp: (N, T) float, current and behaviour log-probs of the response tokens;
    advantages: (N,) per row, or (N, T) per token; mask: (N, T) 0/1.
    Returns the scalar loss and detached metrics (token means over `mask`): clip_frac_high
    (A > 0 and r > 1 + clip_high), clip_frac_low (A < 0 and r < 1 - clip_low), clip_frac
    (their sum), dual_clip_frac (A < 0 and r > clip_c), ratio_mean/min/max, approx_kl
    (mean of old_logp - logp).
    """
    _check_name(agg, AGG_MODES, "aggregation mode")
    if not (0 <= clip_low < 1 and clip_high >= 0 and clip_c > 1):
        raise ValueError(f"need 0 <= clip_low < 1, clip_high >= 0, clip_c > 1; got {clip_low}, {clip_high}, {clip_c}")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (N, 1) or (N, T)
    adv = adv.to(logp.dtype).expand_as(logp)  # (N, T)
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # (N, T); clamp keeps exp finite
    ratio = torch.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(loss1, loss2)
    dual = torch.minimum(clipped, -adv * clip_c)
    per_token = torch.where(adv < 0, dual, clipped)  # (N, T)
    loss = agg_loss(per_token, mask, agg, sample_index=sample_index, horizon=horizon, row_weights=row_weights)
    return loss, clip_metrics(adv, ratio, log_ratio, mask, clip_low, clip_high, clip_c)


@torch.no_grad()
def clip_metrics(adv: Tensor, ratio: Tensor, log_ratio: Tensor, mask: Tensor, clip_low: float, clip_high: float,
                 clip_c: float) -> dict[str, Tensor]:
    """Token means over `mask` of where the clipped surrogate is active (see `policy_loss`).

    adv, ratio, log_ratio, mask: (N, T). Returns 0-d tensors: clip_frac_high, clip_frac_low, clip_frac,
    dual_clip_frac, ratio_mean, ratio_min, ratio_max (over real tokens; 1 when there is none), approx_kl.
    """
    n = mask.sum().clamp_min(1)
    high = ((adv > 0) & (ratio > 1.0 + clip_high)).to(mask.dtype) * mask
    low = ((adv < 0) & (ratio < 1.0 - clip_low)).to(mask.dtype) * mask
    dual_active = ((adv < 0) & (ratio > clip_c)).to(mask.dtype) * mask
    real = mask.bool()
    any_real = bool(real.any())
    return {
        "clip_frac_high": high.sum() / n,
        "clip_frac_low": low.sum() / n,
        "clip_frac": (high.sum() + low.sum()) / n,
        "dual_clip_frac": dual_active.sum() / n,
        "ratio_mean": (ratio * mask).sum() / n,
        "ratio_min": ratio[real].min() if any_real else torch.ones((), dtype=ratio.dtype),
        "ratio_max": ratio[real].max() if any_real else torch.ones((), dtype=ratio.dtype),
        "approx_kl": (-log_ratio * mask).sum() / n,
    }


# -- KL penalty ----------------------------------------------------------------------------


def _k1(log_ratio: Tensor) -> Tensor:
    return log_ratio


def _k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: Tensor) -> Tensor:
    # Schulman's unbiased, always >= 0 estimator: (q/p) - log(q/p) - 1 with q/p = ref/policy.
    neg = -log_ratio  # log(ref / policy)
    return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probs.

    logp, ref_logp: (N, T) float. kind: "k1" = logp - ref_logp; "k2" = (logp - ref_logp)^2 / 2;
    "k3" = exp(ref_logp - logp) - (ref_logp - logp) - 1, clamped to [-10, 10] (paper's choice,
    low variance). Returns (N, T).
    """
    _check_name(kind, tuple(KL_ESTIMATORS), "KL estimator")
    return KL_ESTIMATORS[kind](logp - ref_logp)


# -- log-probs and entropy from logits --------------------------------------------------------


def _upcast(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # fp32 or fp64 kept


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) at `token_ids`. logits (N, T, V), token_ids (N, T) -> (N, T)."""
    logits = _upcast(logits)
    logits = logits / temperature if temperature != 1.0 else logits
    picked = torch.gather(logits, -1, token_ids.unsqueeze(-1)).squeeze(-1)  # (N, T)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) per position. (N, T, V) -> (N, T)."""
    logits = _upcast(logits)
    logits = logits / temperature if temperature != 1.0 else logits
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)

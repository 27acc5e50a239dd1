"""One optimiser mini-batch of Multi-Conv DAPO: gradient accumulation that does not depend on
how the mini-batch is split into micro-batches or over data-parallel ranks.

The aggregation mode's count D (tokens for `token-mean`, rows, or samples) is summed over the
whole mini-batch on this rank and all-reduced over ranks BEFORE any backward; each row's weight
w_n = c_n / D is then fixed (memagent.rl.algos.row_loss_weights), and every micro-batch adds
sum_n w_n * sum_t loss[n, t] to the gradient. The sum over micro-batches and ranks is the
mini-batch loss exactly, so its gradient is too (up to float rounding). DDP/FSDP average
gradients over ranks; the loss is multiplied by world_size to undo that (DistInfo.grad_scale).
Rows of one sample must live on one rank (the trainer shards by question group) for
`sample-mean` to count each sample once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from memagent.rl.algos import (
    agg_loss,
    kl_penalty,
    loss_denominator,
    policy_loss,
    row_loss_weights,
    token_entropy,
    token_logprobs,
)
from memagent.rl.distributed import DistInfo, all_reduce, no_grad_sync
from memagent.rl.forward import dummy_forward_loss, micro_batches, pack_rows, pad_ragged, response_logits


@dataclass
class MiniBatch:
    """This rank's rows of one optimiser mini-batch (N rows)."""

    prompt_ids: list[list[int]]  # N x [P_n] int
    response_ids: list[list[int]]  # N x [R_n] int
    old_logprobs: list[Tensor]  # N x (R_n,) float, behaviour policy log-probs
    ref_logprobs: list[Tensor] | None  # N x (R_n,) float, frozen reference; None when kl_coef = 0
    advantages: Tensor  # (N,) float32, the sample's advantage on each row
    sample_index: Tensor  # (N,) int64, rows of one sample share an index


@dataclass(frozen=True)
class LossSettings:
    """The named scalars of the objective (from TrainConfig.loss)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_c: float = 3.0
    agg: str = "token-mean"
    kl_coef: float = 1e-3
    kl_kind: str = "k3"
    horizon: int | None = None
    temperature: float = 1.0  # logits are divided by the sampling temperature, as at rollout


def _response_mask(responses: Sequence[Sequence[int]]) -> Tensor:
    width = max([1] + [len(r) for r in responses])
    mask = torch.zeros(len(responses), width, dtype=torch.float64)
    for n, r in enumerate(responses):
        mask[n, : len(r)] = 1.0
    return mask  # (N, R)


def accumulate_gradients(
    model: nn.Module,
    mb: MiniBatch,
    loss: LossSettings,
    *,
    micro_batch_size: int,
    pad_id: int,
    info: DistInfo,
) -> dict[str, float]:
    """Forward/backward every micro-batch of `mb`, leaving the mini-batch gradient in .grad.

    Returns metrics over the whole mini-batch (all ranks): pg_loss, kl, loss, entropy (token
    mean), clip_frac, clip_frac_high, clip_frac_low, dual_clip_frac, ratio_mean/min/max,
    approx_kl, tokens (response tokens trained on).
    """
    device = info.device
    n_rows = len(mb.response_ids)
    mask_all = _response_mask(mb.response_ids)  # (N, R)
    denom = all_reduce(loss_denominator(mask_all, loss.agg, mb.sample_index), info)  # D over the mini-batch
    weights = row_loss_weights(mask_all, loss.agg, mb.sample_index, loss.horizon, denominator=denom)  # (N,)

    sums = {k: torch.zeros((), dtype=torch.float64) for k in
            ("pg_loss", "kl", "entropy", "clip_frac_high", "clip_frac_low", "dual_clip_frac",
             "ratio_mean", "approx_kl", "tokens")}
    ratio_min, ratio_max = torch.tensor(float("inf"), dtype=torch.float64), torch.tensor(float("-inf"), dtype=torch.float64)
    chunks = micro_batches(n_rows, micro_batch_size, info)
    model.train()
    for k, idx in enumerate(chunks):
        last = k == len(chunks) - 1
        with no_grad_sync(model, skip=not last):
            if not idx:
                dummy_forward_loss(model, pad_id, device).backward()
                continue
            resp = [mb.response_ids[i] for i in idx]
            packed = pack_rows([mb.prompt_ids[i] for i in idx], resp, pad_id).to(device)
            logits = response_logits(model, packed)  # (B, R, V)
            logp = token_logprobs(logits, packed.response_ids, loss.temperature)  # (B, R)
            width = logp.shape[1]
            mask = packed.response_mask.to(logp.dtype)  # (B, R)
            old = pad_ragged([mb.old_logprobs[i] for i in idx], width).to(device, logp.dtype)  # (B, R)
            adv = mb.advantages[idx].to(device, logp.dtype)  # (B,)
            w = weights[idx].to(device)  # (B,)
            pg, m = policy_loss(logp, old, adv, mask, loss.clip_low, loss.clip_high, loss.clip_c, loss.agg,
                                row_weights=w)
            total = pg
            if loss.kl_coef > 0:
                assert mb.ref_logprobs is not None, "kl_coef > 0 needs reference log-probs"
                ref = pad_ragged([mb.ref_logprobs[i] for i in idx], width).to(device, logp.dtype)
                kl = agg_loss(kl_penalty(logp, ref, loss.kl_kind), mask, row_weights=w)
                total = pg + loss.kl_coef * kl
                sums["kl"] += kl.detach().double().cpu()
            (total * info.grad_scale).backward()
            with torch.no_grad():
                n_tok = mask.sum().double().cpu()
                sums["pg_loss"] += pg.detach().double().cpu()
                sums["entropy"] += (token_entropy(logits.detach(), loss.temperature) * mask).sum().double().cpu()
                for key in ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "approx_kl"):
                    sums[key] += m[key].double().cpu() * n_tok
                sums["tokens"] += n_tok
                if n_tok > 0:
                    ratio_min = torch.minimum(ratio_min, m["ratio_min"].double().cpu())
                    ratio_max = torch.maximum(ratio_max, m["ratio_max"].double().cpu())
    keys = list(sums)
    reduced = all_reduce(torch.stack([sums[k] for k in keys]), info)
    tot = dict(zip(keys, reduced.tolist()))
    ratio_min = float(all_reduce(ratio_min, info, "min"))
    ratio_max = float(all_reduce(ratio_max, info, "max"))
    n = max(tot["tokens"], 1.0)
    out = {"pg_loss": tot["pg_loss"], "kl": tot["kl"], "loss": tot["pg_loss"] + loss.kl_coef * tot["kl"],
           "entropy": tot["entropy"] / n, "tokens": tot["tokens"]}
    for key in ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "approx_kl"):
        out[key] = tot[key] / n
    out["clip_frac"] = out["clip_frac_high"] + out["clip_frac_low"]
    out["ratio_min"], out["ratio_max"] = ratio_min, ratio_max
    return out

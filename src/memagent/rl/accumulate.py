"""One optimiser step's gradient from weighted objectives, whatever the micro-batch split and the ranks.

`accumulate_gradients(model, [Term(objective, weight, rows), ...])` leaves
    sum_k weight_k * loss_k(rows_k)
in `.grad`, each loss_k aggregated with its objective's mode over ALL of its rows on all ranks:
the mode's count D (tokens for `token-mean`, rows, or samples) is summed over the term's rows on
this rank and all-reduced over ranks BEFORE any backward; each row's weight w_n = c_n / D is then
fixed (memagent.rl.algos.row_loss_weights), and every micro-batch adds sum_n w_n * sum_t loss[n, t]
to the gradient. The sum over micro-batches and ranks is the mini-batch loss exactly, so its
gradient is too (up to float rounding). DDP/FSDP average gradients over ranks; the loss is
multiplied by world_size to undo that (DistInfo.grad_scale), and the gradients are synchronised
once, on the step's last backward. Rows of one sample must live on one rank (the trainer shards
by question group) for `sample-mean` to count each sample once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from memagent.rl.algos import loss_denominator, row_loss_weights
from memagent.rl.distributed import DistInfo, all_reduce, no_grad_sync
from memagent.rl.objectives import MiniBatch, Objective
from memagent.rl.packing import batch_logits, dummy_forward_loss, pack_batch, plan_micro_batches


@dataclass(frozen=True)
class Term:
    """One objective of a step, its weight in the summed loss and this rank's rows for it."""

    objective: Objective
    weight: float
    rows: MiniBatch


@dataclass
class _Plan:
    denominator: Tensor  # 0-d float64, the objective's count D over the whole mini-batch (all ranks)
    weights: Tensor  # (N,) float64, w_n = c_n / D
    chunks: list[list[int]]  # row indices of each micro-batch ([] pads to the largest count over ranks)


def response_mask(responses: Sequence[Sequence[int]]) -> Tensor:
    """(N, R) float64, 1 on each row's real response tokens."""
    width = max([1] + [len(r) for r in responses])
    mask = torch.zeros(len(responses), width, dtype=torch.float64)
    for n, r in enumerate(responses):
        mask[n, : len(r)] = 1.0
    return mask


def _plan(term: Term, micro_batch_size: int, micro_batch_tokens: int, info: DistInfo) -> _Plan:
    obj, rows = term.objective, term.rows
    mask = response_mask(rows.response_ids)  # (N, R)
    denom = all_reduce(loss_denominator(mask, obj.agg, rows.sample_index), info)
    weights = row_loss_weights(mask, obj.agg, rows.sample_index, obj.horizon, denominator=denom)  # (N,)
    return _Plan(denom, weights, plan_micro_batches(rows.prompt_ids, rows.response_ids, micro_batch_size=micro_batch_size,
                                                    micro_batch_tokens=micro_batch_tokens, info=info))


class _Tally:
    """Sums (minima, maxima for keys ending in _min / _max) of one objective's statistics."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.values = {k: torch.tensor(float("inf") if k.endswith("_min") else float("-inf") if k.endswith("_max")
                                       else 0.0, dtype=torch.float64) for k in keys}

    def add(self, stats: dict[str, Tensor]) -> None:
        for k, v in stats.items():
            if k.endswith("_min"):
                self.values[k] = torch.minimum(self.values[k], v)
            elif k.endswith("_max"):
                self.values[k] = torch.maximum(self.values[k], v)
            else:
                self.values[k] += v

    def reduced(self, info: DistInfo) -> dict[str, float]:
        sums = [k for k in self.values if not k.endswith(("_min", "_max"))]
        out = dict(zip(sums, all_reduce(torch.stack([self.values[k] for k in sums]), info).tolist()))
        for k in self.values:
            if k.endswith(("_min", "_max")):
                out[k] = float(all_reduce(self.values[k], info, "min" if k.endswith("_min") else "max"))
        return out


def accumulate_gradients(model: nn.Module, terms: Sequence[Term], *, micro_batch_size: int, pad_id: int,
                         info: DistInfo, micro_batch_tokens: int = 0,
                         vocab_limit: int | None = None) -> list[dict[str, float]]:
    """Forward/backward every micro-batch of every term, leaving the step's gradient in .grad.

    micro_batch_tokens > 0: padding-free micro-batches of at most that many tokens (memagent.rl.packing),
    else padded micro-batches of micro_batch_size rows; the gradient is the same either way.
    vocab_limit: the objectives see the logits of the first that many ids only (`packing.batch_logits`).
    Returns, per term, its objective's metrics over the whole mini-batch (all ranks).
    """
    plans = [_plan(t, micro_batch_size, micro_batch_tokens, info) for t in terms]
    tallies = [_Tally(t.objective.stats) for t in terms]
    last = (len(terms) - 1, len(plans[-1].chunks) - 1) if terms else (-1, -1)
    model.train()
    for i, (term, plan) in enumerate(zip(terms, plans)):
        for k, idx in enumerate(plan.chunks):
            with no_grad_sync(model, skip=(i, k) != last):
                if not idx:
                    dummy_forward_loss(model, pad_id, info.device).backward()
                    continue
                packed = pack_batch([term.rows.prompt_ids[j] for j in idx], [term.rows.response_ids[j] for j in idx],
                                    pad_id, micro_batch_tokens > 0).to(info.device)
                logits = batch_logits(model, packed, vocab_limit)  # (B, R, V)
                loss, stats = term.objective.micro_loss(logits, packed, term.rows, idx,
                                                        plan.weights[idx].to(info.device))
                (loss * (term.weight * info.grad_scale)).backward()
                tallies[i].add(stats)
    return [t.objective.summarize(tally.reduced(info), float(p.denominator))
            for t, p, tally in zip(terms, plans, tallies)]

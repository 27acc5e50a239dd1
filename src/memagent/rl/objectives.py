"""Per-row training objectives, registered by name: `dapo` (docs/paper.md, "Multi-Conv DAPO") and `sft`; and one
optimiser step's gradient over weighted objectives (`accumulate_gradients`).

An objective turns one micro-batch of rows into a scalar loss and its statistics. It never sees
how rows are split into micro-batches or ranks: it states an aggregation mode (`agg`, `horizon`)
and receives each row's weight w_n = c_n / D, where D is counted over the whole mini-batch on all
ranks (`accumulate_gradients`, below), so any split gives the same gradient. Its statistics are sums
(or minima / maxima, keys ending in `_min` / `_max`), reduced over micro-batches and ranks, and
turned into the reported metrics by `summarize`.

    dapo  the clipped policy loss with clip-higher and dual clip, plus beta * KL to a reference
    sft   the response tokens' cross-entropy (supervised warm-up; as a second, weighted
          objective in RL it is the demo's value-copy loss, NOT part of Multi-Conv DAPO)

Every objective's settings come from a config section (`LossConfig` for `dapo`); none is declared here.

One optimiser step's gradient from weighted objectives, whatever the micro-batch split and the ranks:

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
from typing import Any, Callable, Protocol, Sequence

import torch
from torch import Tensor, nn

from memagent.config import ConfigError
from memagent.rl.algos import (agg_loss, kl_penalty, loss_denominator, policy_loss, row_loss_weights, token_entropy,
                               token_logprobs)
from memagent.rl.config import LossConfig
from memagent.rl.distributed import DistInfo, all_reduce, no_grad_sync
from memagent.rl.packing import PackedRows, batch_logits, dummy_forward_loss, pack_batch, pad_ragged, plan_micro_batches

Row = tuple[Sequence[int], Sequence[int]]  # (prompt ids [P], response ids [R])


@dataclass
class MiniBatch:
    """This rank's rows of one optimiser mini-batch for one objective (N rows).

    The RL fields are None for an objective that does not read them (`sft` reads token ids only).
    """

    prompt_ids: list[list[int]]  # N x [P_n] int
    response_ids: list[list[int]]  # N x [R_n] int
    old_logprobs: list[Tensor] | None = None  # N x (R_n,) float, behaviour policy log-probs
    ref_logprobs: list[Tensor] | None = None  # N x (R_n,) float, frozen reference; None when kl_coef = 0
    advantages: Tensor | None = None  # (N,) float32, the sample's advantage on each row
    sample_index: Tensor | None = None  # (N,) int64, rows of one sample share an index

    @property
    def num_rows(self) -> int:
        return len(self.response_ids)

    @classmethod
    def supervised(cls, rows: Sequence[Row]) -> "MiniBatch":
        """Rows of (prompt ids, response ids) for `sft`."""
        return cls([list(r[0]) for r in rows], [list(r[1]) for r in rows])


class Objective(Protocol):
    """One per-row loss. `stats` names what `micro_loss` returns, so every rank tallies the same keys."""

    agg: str  # aggregation mode of memagent.rl.algos.AGG_MODES
    horizon: int | None  # the constant of seq-mean-token-sum-norm
    stats: tuple[str, ...]

    def micro_loss(self, logits: Tensor, packed: PackedRows, rows: MiniBatch, idx: list[int],
                   weights: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """logits (B, R, V) of rows `idx` of `rows`, packed as `packed`; weights (B,) float64.
        Returns the weighted loss of these rows and their detached 0-d float64 CPU statistics."""
        ...

    def summarize(self, totals: dict[str, float], denominator: float) -> dict[str, float]:
        """The reported metrics from the statistics reduced over the mini-batch."""
        ...


@dataclass(frozen=True)
class DAPO:
    """Multi-Conv DAPO's per-token loss: `algos.policy_loss` + kl_coef * `algos.kl_penalty`."""

    clip_low: float
    clip_high: float
    clip_c: float
    agg: str
    kl_coef: float
    kl_kind: str
    horizon: int | None
    temperature: float  # logits are divided by the sampling temperature, as at rollout
    stats: tuple[str, ...] = ("pg_loss", "kl", "entropy", "clip_frac_high", "clip_frac_low", "dual_clip_frac",
                              "ratio_mean", "approx_kl", "tokens", "ratio_min", "ratio_max")

    @classmethod
    def from_config(cls, loss: LossConfig, horizon: int | None = None, temperature: float = 1.0) -> "DAPO":
        return cls(loss.clip_low, loss.clip_high, loss.clip_c, loss.agg, loss.kl_coef, loss.kl_kind, horizon,
                   temperature)

    def micro_loss(self, logits: Tensor, packed: PackedRows, rows: MiniBatch, idx: list[int],
                   weights: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        assert rows.advantages is not None, "dapo needs advantages"
        logp = token_logprobs(logits, packed.response_ids, self.temperature)  # (B, R)
        width, device = logp.shape[1], logp.device
        mask = packed.response_mask.to(logp.dtype)  # (B, R)
        if rows.old_logprobs is None:  # on-policy (the policy has not moved since the rollout): ratio 1 exactly
            old = logp.detach()
        else:
            old = pad_ragged([rows.old_logprobs[i] for i in idx], width).to(device, logp.dtype)  # (B, R)
        adv = rows.advantages[idx].to(device, logp.dtype)  # (B,)
        pg, m = policy_loss(logp, old, adv, mask, self.clip_low, self.clip_high, self.clip_c, self.agg,
                            row_weights=weights)
        total, stats = pg, {}
        if self.kl_coef > 0:
            assert rows.ref_logprobs is not None, "kl_coef > 0 needs reference log-probs"
            ref = pad_ragged([rows.ref_logprobs[i] for i in idx], width).to(device, logp.dtype)
            kl = agg_loss(kl_penalty(logp, ref, self.kl_kind), mask, row_weights=weights)
            total = pg + self.kl_coef * kl
            stats["kl"] = kl.detach().double().cpu()
        with torch.no_grad():
            n_tok = mask.sum().double().cpu()
            stats["pg_loss"] = pg.detach().double().cpu()
            stats["entropy"] = (token_entropy(logits.detach(), self.temperature) * mask).sum().double().cpu()
            for key in ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "approx_kl"):
                stats[key] = m[key].double().cpu() * n_tok
            stats["tokens"] = n_tok
            if n_tok > 0:
                stats["ratio_min"], stats["ratio_max"] = m["ratio_min"].double().cpu(), m["ratio_max"].double().cpu()
        return total, stats

    def summarize(self, totals: dict[str, float], denominator: float) -> dict[str, float]:
        """pg_loss, kl, loss, entropy (token mean), tokens, clip_frac_high/low, dual_clip_frac, ratio_mean,
        approx_kl (token means), clip_frac (high + low), ratio_min, ratio_max."""
        n = max(totals["tokens"], 1.0)
        out = {"pg_loss": totals["pg_loss"], "kl": totals["kl"], "loss": totals["pg_loss"] + self.kl_coef * totals["kl"],
               "entropy": totals["entropy"] / n, "tokens": totals["tokens"]}
        for key in ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "approx_kl"):
            out[key] = totals[key] / n
        out["clip_frac"] = out["clip_frac_high"] + out["clip_frac_low"]
        # no token went through the loss (every row skipped: advantages all 0): nothing moved, the ratio is 1
        finite = totals["tokens"] > 0
        out["ratio_min"], out["ratio_max"] = (totals["ratio_min"], totals["ratio_max"]) if finite else (1.0, 1.0)
        return out


@dataclass(frozen=True)
class SFT:
    """Token-mean cross-entropy of the response tokens (the prompt is context only), temperature 1."""

    agg: str = "token-mean"
    horizon: int | None = None
    stats: tuple[str, ...] = ("loss", "correct")

    def micro_loss(self, logits: Tensor, packed: PackedRows, rows: MiniBatch, idx: list[int],
                   weights: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        logp = token_logprobs(logits, packed.response_ids)  # (B, R)
        mask = packed.response_mask.to(logp.dtype)
        loss = -((logp * mask).sum(-1) * weights.to(logp.dtype)).sum()
        correct = ((logits.argmax(-1) == packed.response_ids).to(mask.dtype) * mask).sum()
        return loss, {"loss": loss.detach().double().cpu(), "correct": correct.detach().double().cpu()}

    def summarize(self, totals: dict[str, float], denominator: float) -> dict[str, float]:
        """loss (the unweighted cross-entropy), token_accuracy (greedy token = target), tokens."""
        return {"loss": totals["loss"], "token_accuracy": totals["correct"] / max(denominator, 1.0),
                "tokens": denominator}


OBJECTIVES: dict[str, Callable[..., Objective]] = {"dapo": DAPO.from_config, "sft": SFT}


def get_objective(name: str, **settings: Any) -> Objective:
    """The objective registered under `name`, built from its settings (see each class)."""
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective {name!r}; choose one of: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name](**settings)


def check_rows(rows: Sequence[Any]) -> list[Row]:
    """Supervised rows as (prompt_ids, response_ids) lists (or dicts of those keys); a ConfigError names a bad one."""
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, dict):
            r = (r.get("prompt_ids"), r.get("response_ids"))
        if not (isinstance(r, (tuple, list)) and len(r) == 2) or not r[0] or not r[1]:
            raise ConfigError(f"SFT row {i} must be (prompt_ids, response_ids) with both non-empty")
        out.append((list(r[0]), list(r[1])))
    if not out:
        raise ConfigError("no SFT rows given")
    return out


# -- one optimiser step's gradient over [(objective, weight, rows)] --------------------------------------


@dataclass(frozen=True)
class Term:
    """One objective of a step, its weight in the summed loss and this rank's rows for it."""

    objective: Objective
    weight: float
    rows: MiniBatch
    # (N,) bool or None: rows known to add exactly 0 to the loss and its gradient (e.g. an advantage of 0 with no KL
    # term): left out of the forward and backward, still counted in the aggregation's denominator D
    skip: Tensor | None = None


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
    keep = [n for n in range(rows.num_rows) if term.skip is None or not bool(term.skip[n])]
    chunks = plan_micro_batches([rows.prompt_ids[n] for n in keep], [rows.response_ids[n] for n in keep],
                                micro_batch_size=micro_batch_size, micro_batch_tokens=micro_batch_tokens, info=info)
    # every row skipped on every rank: one empty micro-batch (a zero-gradient backward), so that every weight still
    # has a gradient of 0 and the optimiser steps exactly as it would over rows that all add 0
    return _Plan(denom, weights, [[keep[j] for j in chunk] for chunk in chunks] or [[]])


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

"""Per-row training objectives, registered by name: `dapo` (docs/paper.md, "Multi-Conv DAPO") and `sft`.

An objective turns one micro-batch of rows into a scalar loss and its statistics. It never sees
how rows are split into micro-batches or ranks: it states an aggregation mode (`agg`, `horizon`)
and receives each row's weight w_n = c_n / D, where D is counted over the whole mini-batch on all
ranks (`memagent.rl.accumulate`), so any split gives the same gradient. Its statistics are sums
(or minima / maxima, keys ending in `_min` / `_max`), reduced over micro-batches and ranks, and
turned into the reported metrics by `summarize`.

    dapo  the clipped policy loss with clip-higher and dual clip, plus beta * KL to a reference
    sft   the response tokens' cross-entropy (supervised warm-up; as a second, weighted
          objective in RL it is the demo's value-copy loss, NOT part of Multi-Conv DAPO)

Every objective's settings come from a config section (`LossConfig` for `dapo`); none is declared here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch
from torch import Tensor

from memagent.config import ConfigError
from memagent.rl.algos import agg_loss, kl_penalty, policy_loss, token_entropy, token_logprobs
from memagent.rl.config import LossConfig
from memagent.rl.packing import PackedRows, pad_ragged

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
        assert rows.old_logprobs is not None and rows.advantages is not None, "dapo needs old log-probs and advantages"
        logp = token_logprobs(logits, packed.response_ids, self.temperature)  # (B, R)
        width, device = logp.shape[1], logp.device
        mask = packed.response_mask.to(logp.dtype)  # (B, R)
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
        out["ratio_min"], out["ratio_max"] = totals["ratio_min"], totals["ratio_max"]
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

"""Step rewards in the Multi-Conv DAPO objective: one reward per conversation, centred per step, mixed with
the outcome advantage (NOT in the paper; docs/rewards.md).

The paper gives every conversation of a sample its final answer's advantage A_outcome (`algos.group_advantages`,
`algos.broadcast_advantages`). With a step reward r_n for row n (memagent.rewards.step; NaN where the reward
does not score the row):

    A_step[n] = r_n - mean{ r_m : m in the same question's group, same step (kind and index), scored }
                (divided by that set's std + eps with `scale`, as GRPO; a set of one row gives 0)
    A[n]      = mix * A_outcome[n] + (1 - mix) * A_step[n]      where row n is scored
    A[n]      = A_outcome[n]                                      elsewhere (the final answer, a lookup query,
                                                                  a sample without evidence)

as ReMemR1 (arXiv 2509.23040) mixes them (its a = 0.8, no std). mix = 1 is the paper's method exactly: the
outcome advantages are returned as they are.

Shapes: N rows; group_ids, step_keys (N,) int64; rewards (N,) float32 (NaN = not scored).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, fields
from typing import Any, Sequence

import torch
from torch import Tensor

from memagent.agent.chunking import iter_chunks
from memagent.rewards.protocol import Answered, Reward, Update
from memagent.rewards.registry import as_outcome_reward
from memagent.rl.distributed import all_reduce

__all__ = ["StepTally", "mix_advantages", "outcome_rewards", "rollout_step_rewards", "step_advantages", "step_key", "step_updates", "score_steps"]


def step_key(kind: str, step: int) -> int:
    """One integer for (kind, step index): rows are centred among the rows of the same key and question."""
    return step * (1 << 20) + zlib.crc32(kind.encode()) % (1 << 20)


def step_advantages(rewards: Tensor, group_ids: Tensor, step_keys: Tensor, scale: bool = False,
                    eps: float = 1e-6) -> Tensor:
    """A_step (N,): each scored row's reward minus the mean of the scored rows of its (group, step key); 0 for an
    unscored (NaN) row. scale: also divide by (the set's unbiased std + eps); a set of one row, or of equal
    rewards, is not divided."""
    if not (rewards.shape == group_ids.shape == step_keys.shape) or rewards.dim() != 1:
        raise ValueError(f"rewards, group_ids, step_keys must all be (N,), got {tuple(rewards.shape)}, "
                         f"{tuple(group_ids.shape)}, {tuple(step_keys.shape)}")
    scored = ~torch.isnan(rewards)  # (N,)
    out = torch.zeros_like(rewards)
    if not bool(scored.any()):
        return out
    keys = torch.stack([group_ids[scored], step_keys[scored]], dim=1)  # (M, 2)
    _, inv = torch.unique(keys, dim=0, return_inverse=True)  # (M,) dense (group, step) index
    r = rewards[scored].double()
    n_sets = int(inv.max()) + 1
    count = torch.zeros(n_sets, dtype=torch.float64).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(n_sets, dtype=torch.float64).index_add_(0, inv, r) / count
    adv = r - mean[inv]  # (M,)
    if scale:
        sq = torch.zeros(n_sets, dtype=torch.float64).index_add_(0, inv, adv * adv)
        std = (sq / (count - 1).clamp_min(1)).sqrt()
        std = torch.where((count > 1) & (std > 0), std + eps, torch.ones_like(std))
        adv = adv / std[inv]
    out[scored] = adv.to(rewards.dtype)
    return out


def mix_advantages(outcome: Tensor, step: Tensor, scored: Tensor, mix: float) -> Tensor:
    """A (N,) = mix * outcome + (1 - mix) * step on scored rows, outcome elsewhere; mix = 1 returns `outcome`."""
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must lie in [0, 1], got {mix}")
    if mix == 1.0:
        return outcome
    return torch.where(scored, mix * outcome + (1.0 - mix) * step, outcome)


# -- from rollouts to step rewards --------------------------------------------------------------------------


def step_updates(question: str, answers: Sequence[str], evidence: Sequence[str] | None, start_memory: str,
                 conversations: Sequence[Any], chunks: Sequence[str] | None = None) -> list[Update]:
    """One Update per conversation of a rollout (memagent.agent.protocol.Conversation: kind, step, text), in
    order: a memory update reads the memory the previous one wrote (`start_memory` first) and writes its
    `text`; any other call sees the current memory (a final answer's `after` is its reply). chunks: the
    document's chunk texts by step index, when known."""
    out, memory = [], start_memory
    ev = tuple(evidence) if evidence is not None else None
    for conv in conversations:
        chunk = chunks[conv.step] if chunks is not None and conv.kind == "memory" and conv.step < len(chunks) else None
        after = conv.text if conv.kind in ("memory", "final") else memory
        out.append(Update(question, tuple(answers), ev, conv.kind, conv.step, memory, after, chunk))
        if conv.kind == "memory":
            memory = conv.text
    return out


def score_steps(reward: Reward, updates: Sequence[Update]) -> Tensor:
    """(N,) float32 step rewards of the updates, NaN where the reward gives None (or a non-finite value)."""
    values = reward.score(list(updates)) if updates else []
    if len(values) != len(updates):
        raise ValueError(f"step reward {reward.name!r} returned {len(values)} values for {len(updates)} conversations")
    return torch.tensor([float(v) if v is not None and math.isfinite(float(v)) else float("nan") for v in values],
                        dtype=torch.float32)


def document_chunks(document: str | Sequence[str], tokenizer: Any, chunk_tokens: int) -> list[str]:
    """The chunk texts the memagent workflow reads of `document` (memagent.agent.chunking.iter_chunks)."""
    doc = document if isinstance(document, str) else list(document)
    return [c.text for c in iter_chunks(doc, tokenizer, chunk_tokens)]


def outcome_rewards(reward: Any, samples: Sequence[Any], results: Sequence[Any]) -> list[float]:
    """The outcome reward of each rollout's final reply (`reward`: a Reward or a plain `(reply, golds) ->
    float`); samples: the QASample of each rollout, results: their AgentResults."""
    return as_outcome_reward(reward).score([Answered(q.question, r.raw_answer, q.answers)
                                            for q, r in zip(samples, results, strict=True)])


def rollout_step_rewards(reward: Reward, samples: Sequence[Any], results: Sequence[Any], agent: Any,
                         tokenizer: Any = None) -> tuple[Tensor, Tensor]:
    """(rewards (N,) float32 with NaN where unscored, step keys (N,) int64) of every conversation of the
    rollouts, rows in the order generate_rollouts makes them (rollout by rollout, call by call).

    samples: the QASample of each rollout (question, answers, evidence, memory); results: their AgentResults;
    agent: the rollouts' AgentConfig (empty_memory: where a rollout starts when its sample gives no memory;
    chunk_tokens); tokenizer: the backend's, to cut the documents into the chunks read, only for a reward that
    reads them (`needs_chunks = True`)."""
    updates: list[Update] = []
    keys: list[int] = []
    cache: dict[int, list[str]] = {}
    wants_chunks = bool(getattr(reward, "needs_chunks", False)) and tokenizer is not None
    for sample, res in zip(samples, results, strict=True):
        chunks = None
        if wants_chunks:
            if id(sample) not in cache:
                cache[id(sample)] = document_chunks(sample.document, tokenizer, agent.chunk_tokens)
            chunks = cache[id(sample)]
        start = sample.memory if sample.memory is not None else agent.empty_memory
        updates += step_updates(sample.question, sample.answers, getattr(sample, "evidence", None), start,
                                res.conversations, chunks)
        keys += [step_key(c.kind, c.step) for c in res.conversations]
    return score_steps(reward, updates), torch.tensor(keys, dtype=torch.long)


@dataclass
class StepTally:
    """Sums of one training step's step rewards on this rank, over its sampling rounds (before any filter)."""

    total: float = 0.0  # sum of the scored rows' step rewards
    scored: float = 0.0  # rows the reward scored
    memory_rows: float = 0.0  # memory-update rows
    unscored_samples: float = 0.0  # samples with memory updates of which none was scored (e.g. no evidence)

    def add(self, batch: Any) -> None:
        """Add a RolloutBatch's rows (step_rewards (N,), step_keys (N,), sample_index (N,))."""
        if batch.step_rewards is None or not batch.num_rows:
            return
        r = batch.step_rewards
        scored = ~torch.isnan(r)
        memory = batch.step_keys % (1 << 20) == step_key("memory", 0)  # (N,) the key's kind part
        self.total += float(r[scored].sum())
        self.scored += float(scored.sum())
        self.memory_rows += float(memory.sum())
        per_sample = torch.zeros(batch.num_samples).index_add_(0, batch.sample_index, scored.float())
        has_memory = torch.zeros(batch.num_samples).index_add_(0, batch.sample_index, memory.float()) > 0
        self.unscored_samples += float(((per_sample == 0) & has_memory).sum())

    def metrics(self, name: str, info: Any) -> dict[str, float]:
        """step_reward/<name> (mean over scored rows), .../scored_rows (share of memory rows scored) and
        .../unscored_samples (samples none of whose updates it scored: no evidence), summed over ranks."""
        names = [f.name for f in fields(self)]
        sums = dict(zip(names, all_reduce(torch.tensor([getattr(self, n) for n in names], dtype=torch.float64),
                                          info).tolist()))
        return {f"step_reward/{name}": sums["total"] / max(sums["scored"], 1.0),
                f"step_reward/{name}/scored_rows": sums["scored"] / max(sums["memory_rows"], 1.0),
                f"step_reward/{name}/unscored_samples": sums["unscored_samples"]}

"""The built-in step rewards: credit for one memory update (NOT in the paper; docs/rewards.md).

Each is the change of a score of the memory from before the update to after it, `r_t = s(m_t) - s(m_{t-1})`,
as ReMemR1 (arXiv 2509.23040) does for answer recall; a conversation that is not a memory update is not
scored (None: its row keeps the outcome advantage).

- `evidence`: s(m) = the share of the gold evidence the memory holds, the mean over evidence strings e of
  |words(e) & words(m)| / |words(e)| (multiset intersection: a word twice in e must be twice in m). A sample
  without evidence is not scored. Unlike answer recall it pays the update that keeps a bridge fact (the
  pointer "k3 k7" of a two-hop chain holds no word of the answer).
- `evidence-chain`: for evidence that is a chain of hops in order (the two-hop toy's ["A B", "B V"]), the level
  s(m) = (i + 1) / n for the furthest hop i whose words the memory holds as one run in order (0 for none). An
  update pays the level it gains only one hop at a time (from hop i - 1 held to hop i), and costs the level it
  loses: keeping the pointer pays 1/2, swapping it for the value fact the other 1/2, dropping either costs what
  it is worth. A jump over a hop not held (the value fact copied before the pointer was read, a guess nothing in
  the memory could have made) pays 0. `evidence`'s word shares cannot say this: "A B" and "B V" both hold 3 of
  the chain's 4 words, so the swap scores 0 there, and the lucky copy of the value fact scores as much as it.
- `answer-recall`: s(m) = the best, over the gold answers a, of |words(a) & words(m)| / |words(a)| (ReMemR1's
  recall; its format term is left out).
- `answer-likelihood`: s(m) = the policy's mean log-probability of the gold answer's tokens given the question
  and the memory (the final-answer prompt), IGPO / InfoMem's information gain; one batched forward pass over
  every update's before and after memory (`attach` gives it the rollout backend). Off by default.

Words are `normalize_answer`'s (lower case, ASCII punctuation and the articles a/an/the dropped) after Unicode
NFKC normalisation, so a composed and a decomposed "é" are one word.
"""
from __future__ import annotations

import math
import unicodedata
from collections import Counter
from typing import Any, Sequence

from memagent.prompts import render
from memagent.rewards.protocol import Update
from memagent.tasks.metrics import normalize_answer

__all__ = ["AnswerLikelihoodReward", "AnswerRecallReward", "EvidenceChainReward", "EvidenceReward", "answer_recall",
           "chain_progress", "chain_step", "evidence_share", "words"]


def words(text: str) -> list[str]:
    """The normalised words of `text` (NFKC, then SQuAD normalisation)."""
    return normalize_answer(unicodedata.normalize("NFKC", text)).split()


def _recall(target: list[str], memory: Counter[str]) -> float:
    """|target & memory| / |target| (multisets); `target` is not empty."""
    return sum((Counter(target) & memory).values()) / len(target)


def _targets(evidence: Sequence[str]) -> list[list[str]]:
    """The words of each evidence string that has a word, in order."""
    return [w for w in (words(e) for e in evidence) if w]


def evidence_share(memory: str, evidence: Sequence[str]) -> float | None:
    """Mean over the evidence strings (those with a word) of the share of their words the memory holds;
    None when no evidence string has a word."""
    targets = _targets(evidence)
    if not targets:
        return None
    held = Counter(words(memory))
    return sum(_recall(t, held) for t in targets) / len(targets)


def _holds_run(memory: list[str], target: list[str]) -> bool:
    """Whether `target` occurs in `memory` as one contiguous run of words, in order."""
    n = len(target)
    return any(memory[i:i + n] == target for i in range(len(memory) - n + 1))


def _level(memory: str, hops: list[list[str]]) -> float:
    """(i + 1) / len(hops) for the furthest hop i the memory holds as one run of words in order, else 0."""
    held = words(memory)
    return max(((i + 1) / len(hops) for i, t in enumerate(hops) if _holds_run(held, t)), default=0.0)


def chain_progress(memory: str, evidence: Sequence[str]) -> float | None:
    """(i + 1) / n for the furthest evidence string i (of the n with a word, in chain order) whose words the
    memory holds as one run in order; 0 when it holds none; None when no evidence string has a word."""
    hops = _targets(evidence)
    return _level(memory, hops) if hops else None


def answer_recall(memory: str, answers: Sequence[str]) -> float:
    """ReMemR1's recall: the best, over the gold answers with a word, of the share of its words in the memory
    (0 when no answer has a word)."""
    held = Counter(words(memory))
    return max((_recall(t, held) for t in (words(a) for a in answers) if t), default=0.0)


class EvidenceReward:
    """`evidence`: evidence_share(after) - evidence_share(before) for a memory update; None for other calls and
    for a sample without evidence."""

    name, kind = "evidence", "step"

    def score(self, items: Sequence[Update]) -> list[float | None]:
        out: list[float | None] = []
        for it in items:
            if it.kind != "memory" or not it.evidence:
                out.append(None)
                continue
            after, before = evidence_share(it.after, it.evidence), evidence_share(it.before, it.evidence)
            out.append(None if after is None or before is None else after - before)
        return out


def chain_step(before: str, after: str, evidence: Sequence[str], loss_weight: float = 1.0) -> float | None:
    """The `evidence-chain` reward of one update: the level lost times `loss_weight` (negative; 0 with weight 0),
    or the level gained when it gains one hop (1/n) at most, else 0; None when no evidence string has a word."""
    hops = _targets(evidence)
    if not hops:
        return None
    gain = _level(after, hops) - _level(before, hops)
    if gain < 0:
        return loss_weight * gain
    return gain if gain <= 1 / len(hops) + 1e-9 else 0.0


class EvidenceChainReward:
    """`evidence-chain`: chain_step(before, after) for a memory update; None for other calls and for a sample
    without evidence. `loss_weight` (option, default 1): what a lost hop costs, as a share of its level (0: a
    lost hop costs nothing here, only through the final answer's reward)."""

    name, kind = "evidence-chain", "step"

    def __init__(self, loss_weight: float = 1.0) -> None:
        if not (isinstance(loss_weight, (int, float)) and not isinstance(loss_weight, bool)
                and math.isfinite(loss_weight) and loss_weight >= 0):
            raise ValueError(f"loss_weight must be a finite number >= 0, got {loss_weight!r}")
        self.loss_weight = float(loss_weight)

    def score(self, items: Sequence[Update]) -> list[float | None]:
        return [chain_step(it.before, it.after, it.evidence, self.loss_weight)
                if it.kind == "memory" and it.evidence else None for it in items]


class AnswerRecallReward:
    """`answer-recall`: answer_recall(after) - answer_recall(before) for a memory update; None for other calls."""

    name, kind = "answer-recall", "step"

    def score(self, items: Sequence[Update]) -> list[float | None]:
        return [answer_recall(it.after, it.answers) - answer_recall(it.before, it.answers) if it.kind == "memory"
                else None for it in items]


class AnswerLikelihoodReward:
    """`answer-likelihood`: mean log p(gold answer | question, memory after) minus the same with the memory before,
    under the rollout policy (`attach(backend, agent_config)` first; the backend must have `encode_many` and
    `score`, as the transformers one does). `answer_format` writes the gold answer as the model should
    ("{answer}"; e.g. "\\\\boxed{{{answer}}}"); the first gold answer is used."""

    name, kind = "answer-likelihood", "step"

    def __init__(self, answer_format: str = "{answer}") -> None:
        if "{answer}" not in answer_format:
            raise ValueError(f"answer_format must hold {{answer}}, got {answer_format!r}")
        self.answer_format = answer_format
        self.backend: Any = None
        self.template: str | None = None

    def attach(self, backend: Any, agent_config: Any) -> None:
        """The policy to score with, and the final-answer prompt (agent_config.final_template)."""
        self.backend, self.template = backend, agent_config.final_template

    def log_likelihoods(self, pairs: Sequence[tuple[str, str, str]]) -> list[float]:
        """Mean log-prob of each answer given (question, memory): pairs of (question, memory, answer), one
        forward pass for all."""
        if self.backend is None or self.template is None:
            raise RuntimeError("answer-likelihood: call attach(backend, agent_config) before score()")
        if not pairs:
            return []
        tok = self.backend.tokenizer
        prompts = self.backend.encode_many([render(self.template, question=q, memory=m) for q, m, _ in pairs])
        answers = [list(tok(self.answer_format.format(answer=a), add_special_tokens=False)["input_ids"])
                   for _, _, a in pairs]
        logps = self.backend.score(prompts, answers)
        return [sum(lp) / len(lp) if lp else -math.inf for lp in logps]

    def score(self, items: Sequence[Update]) -> list[float | None]:
        which = [i for i, it in enumerate(items) if it.kind == "memory" and it.answers]
        pairs = [(items[i].question, m, items[i].answers[0]) for i in which for m in (items[i].before, items[i].after)]
        values = self.log_likelihoods(pairs)
        out: list[float | None] = [None] * len(items)
        for k, i in enumerate(which):
            before, after = values[2 * k], values[2 * k + 1]
            out[i] = after - before if math.isfinite(before) and math.isfinite(after) else None
        return out

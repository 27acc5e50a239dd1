"""Rollouts for Multi-Conv DAPO: G runs of the workflow per question, every call a training row.

One rollout (sample) of a question is one full run of `MemoryAgent`: K memory updates (one per
chunk, in document order) and the final answer, i.e. n_i = K + 1 independent conversations. The
reward is computed on the final answer only (PAPER.md, "Multi-Conv DAPO"), turned into a group
advantage (Dr. GRPO: R_i - mean of the group) and broadcast unchanged to every conversation row
of the sample. A sample's memory calls run in sequence; the calls of different samples at the
same step go to the backend in one batch (the workflow's own batching).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.base import Backend, BackendError
from memagent.config import AgentConfig, ConfigError
from memagent.errors import InputError
from memagent.rl.algos import broadcast_advantages, group_advantages, informative_groups
from memagent.tasks.metrics import METRICS, boxed_reward  # the single home of scoring functions

RewardFn = Callable[[str | None, Sequence[str]], float]  # (final reply text, gold answers) -> reward


# -- rewards ----------------------------------------------------------------------------------------


def get_reward(name: str) -> RewardFn:
    """The reward registered under `name`: "boxed" (default), or any metric of memagent.tasks.metrics."""
    registry: dict[str, RewardFn] = {**METRICS, "boxed": boxed_reward}
    if name not in registry:
        raise ConfigError(f"unknown reward {name!r}; choose one of: {', '.join(sorted(registry))}")
    return registry[name]


# -- data -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QASample:
    """One training question: its document (text or text blocks, re-readable) and gold answers."""

    id: str
    question: str
    document: str | tuple[str, ...]
    answers: tuple[str, ...]
    memory: str | None = None  # the memory its rollouts start from; None: the agent's empty memory

    @classmethod
    def from_dict(cls, rec: dict[str, Any], where: str = "sample") -> "QASample":
        """From {id, question, answers, document | context, optional memory}; a clear InputError when a field
        is wrong."""
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a mapping with id, question, answers, document, got {type(rec).__name__}")
        has_doc = any(k in rec for k in ("document", "context", "lazy"))
        missing = [k for k in ("question", "answers") if k not in rec] + ([] if has_doc else ["document (or context)"])
        if missing:
            raise InputError(f"{where}: missing field(s) {', '.join(missing)}; each sample needs "
                             "id, question, answers (list of str) and document (str or list of str)")
        if "document" in rec or "context" in rec:
            doc = rec.get("document", rec.get("context"))
        else:  # a data-helper sample stored lazily (memagent.tasks.schema): rebuilt as its text blocks
            from memagent.tasks.schema import sample_document

            doc = sample_document(rec)
        if not isinstance(doc, str):
            doc = tuple(str(block) for block in doc)  # iterables are materialised: G rollouts re-read it
        answers = rec["answers"]
        answers = (answers,) if isinstance(answers, str) else tuple(str(a) for a in answers)
        if not answers:
            raise InputError(f"{where}: 'answers' is empty; give at least one gold answer")
        memory = rec.get("memory")
        if memory is not None and not isinstance(memory, str):
            raise InputError(f"{where}: 'memory' (the starting memory) must be a string, got {type(memory).__name__}")
        return cls(str(rec.get("id", where)), str(rec["question"]), doc, answers, memory)


# -- the batch ------------------------------------------------------------------------------------


@dataclass
class RolloutBatch:
    """Rows of conversations for training. N rows, S samples (rollouts), groups of G samples.

    Token fields are ragged Python lists (one list per row); they become padded tensors per
    micro-batch in the trainer.
    """

    prompt_ids: list[list[int]]  # N x [P_n] int, the exact ids the model saw (chat template included)
    response_ids: list[list[int]]  # N x [R_n] int, the sampled ids (terminating EOS included)
    rollout_logprobs: list[list[float]] | None  # N x [R_n] float, sampling-time log-probs, or None
    sample_index: Tensor  # (N,) int64, row -> its sample in [0, S)
    is_final: Tensor  # (N,) bool, True for the final-answer conversation of its sample
    advantages: Tensor  # (N,) float32, the sample's advantage copied to each of its rows
    rewards: Tensor  # (S,) float32, reward of each sample's final answer
    sample_group: Tensor  # (S,) int64, group (question) id of each sample; unique across the run's step
    sample_advantages: Tensor  # (S,) float32
    predictions: list[str | None]  # S, the extracted \boxed{} answers (None: none written)
    generated_tokens: int = 0  # response tokens over all rows
    seconds: float = 0.0  # wall-clock of generation

    @property
    def num_rows(self) -> int:
        return len(self.response_ids)

    @property
    def num_samples(self) -> int:
        return int(self.rewards.numel())

    @property
    def group_id(self) -> Tensor:
        """(N,) int64 group of each row."""
        return self.sample_group[self.sample_index]

    def conversations_per_sample(self) -> Tensor:
        """(S,) int64 number of rows of each sample."""
        return torch.bincount(self.sample_index, minlength=self.num_samples)

    def select_samples(self, keep: Tensor) -> "RolloutBatch":
        """The batch restricted to samples where keep (S,) bool is True, sample indices renumbered."""
        new_index = torch.full((self.num_samples,), -1, dtype=torch.long)
        new_index[keep] = torch.arange(int(keep.sum()))
        rows = [n for n in range(self.num_rows) if bool(keep[self.sample_index[n]])]
        idx = torch.tensor(rows, dtype=torch.long)
        return RolloutBatch(
            prompt_ids=[self.prompt_ids[n] for n in rows],
            response_ids=[self.response_ids[n] for n in rows],
            rollout_logprobs=None if self.rollout_logprobs is None else [self.rollout_logprobs[n] for n in rows],
            sample_index=new_index[self.sample_index[idx]] if rows else torch.zeros(0, dtype=torch.long),
            is_final=self.is_final[idx] if rows else torch.zeros(0, dtype=torch.bool),
            advantages=self.advantages[idx] if rows else torch.zeros(0),
            rewards=self.rewards[keep],
            sample_group=self.sample_group[keep],
            sample_advantages=self.sample_advantages[keep],
            predictions=[p for p, k in zip(self.predictions, keep.tolist()) if k],
            generated_tokens=sum(len(self.response_ids[n]) for n in rows),
            seconds=self.seconds,
        )

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"]) -> "RolloutBatch":
        """Batches one after another (sample indices shifted); group ids must already be distinct."""
        offsets, total = [], 0
        for b in batches:
            offsets.append(total)
            total += b.num_samples
        has_lp = all(b.rollout_logprobs is not None for b in batches)
        return RolloutBatch(
            prompt_ids=[p for b in batches for p in b.prompt_ids],
            response_ids=[r for b in batches for r in b.response_ids],
            rollout_logprobs=[lp for b in batches for lp in b.rollout_logprobs] if has_lp else None,  # type: ignore[union-attr]
            sample_index=torch.cat([b.sample_index + o for b, o in zip(batches, offsets)]) if batches else torch.zeros(0, dtype=torch.long),
            is_final=torch.cat([b.is_final for b in batches]) if batches else torch.zeros(0, dtype=torch.bool),
            advantages=torch.cat([b.advantages for b in batches]) if batches else torch.zeros(0),
            rewards=torch.cat([b.rewards for b in batches]) if batches else torch.zeros(0),
            sample_group=torch.cat([b.sample_group for b in batches]) if batches else torch.zeros(0, dtype=torch.long),
            sample_advantages=torch.cat([b.sample_advantages for b in batches]) if batches else torch.zeros(0),
            predictions=[p for b in batches for p in b.predictions],
            generated_tokens=sum(b.generated_tokens for b in batches),
            seconds=sum(b.seconds for b in batches),
        )


def dynamic_sampling_filter(batch: RolloutBatch) -> RolloutBatch:
    """DAPO dynamic sampling: keep exactly the groups whose rewards are not all equal."""
    return batch.select_samples(informative_groups(batch.rewards, batch.sample_group))


# -- generating -------------------------------------------------------------------------------------


def generate_rollouts(
    backend: Backend,
    agent_config: AgentConfig,
    questions: Sequence[QASample],
    group_ids: Sequence[int],
    group_size: int,
    reward_fn: RewardFn,
    *,
    seed: int | None,
    norm_by_std: bool = False,
) -> RolloutBatch:
    """G rollouts of each question through the workflow, rewarded and advantaged.

    group_ids: one id per question (unique within the training step, also across ranks).
    seed: seed of this batch's sampling (the workflow derives one per call from it).
    Samples are ordered question by question: sample s = q * G + g.
    """
    if len(questions) != len(group_ids):
        raise ValueError("give one group id per question")
    items = [AgentInput(q.question, list(q.document) if isinstance(q.document, tuple) else q.document,
                        f"{q.id}#{g}", q.memory) for q in questions for g in range(group_size)]
    # every rollout in flight at once: each workflow step is one backend batch (memory is bounded by
    # the backend's own max_batch_size)
    agent = MemoryAgent(backend, replace(agent_config, seed=seed, max_batch_docs=max(1, len(items))),
                        keep_conversations=True)
    t0 = time.perf_counter()
    results = agent.run(items) if items else []
    seconds = time.perf_counter() - t0

    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    logprobs: list[list[float]] | None = []
    sample_index: list[int] = []
    is_final: list[bool] = []
    rewards: list[float] = []
    for s, res in enumerate(results):
        q = questions[s // group_size]
        rewards.append(float(reward_fn(res.raw_answer, q.answers)))
        for conv in res.conversations:
            if conv.prompt_ids is None:
                raise BackendError("the rollout backend returned no prompt token ids; training needs a "
                                   "backend that reports them (transformers or vllm)")
            prompts.append(list(conv.prompt_ids))
            responses.append(list(conv.response_ids))
            if logprobs is not None and conv.logprobs is not None:
                logprobs.append(list(conv.logprobs))
            else:
                logprobs = None
            sample_index.append(s)
            is_final.append(conv.kind == "final")
    r = torch.tensor(rewards, dtype=torch.float32)  # (S,)
    groups = torch.tensor([group_ids[s // group_size] for s in range(len(results))], dtype=torch.long)  # (S,)
    adv = group_advantages(r, groups, norm_by_std=norm_by_std) if len(results) else torch.zeros(0)  # (S,)
    idx = torch.tensor(sample_index, dtype=torch.long)  # (N,)
    return RolloutBatch(
        prompt_ids=prompts,
        response_ids=responses,
        rollout_logprobs=logprobs,
        sample_index=idx,
        is_final=torch.tensor(is_final, dtype=torch.bool),
        advantages=broadcast_advantages(adv, idx) if len(idx) else torch.zeros(0),
        rewards=r,
        sample_group=groups,
        sample_advantages=adv,
        predictions=[res.answer for res in results],
        generated_tokens=sum(len(x) for x in responses),
        seconds=seconds,
    )


def load_samples(samples: Iterable[Any]) -> list[QASample]:
    """QASample list from dicts (or QASample objects); errors name the offending sample."""
    out = []
    for i, rec in enumerate(samples):
        out.append(rec if isinstance(rec, QASample) else QASample.from_dict(rec, f"sample {i}"))
    if not out:
        raise InputError("the training dataset is empty; give at least one sample")
    return out

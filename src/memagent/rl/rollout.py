"""Rollouts for Multi-Conv DAPO: G runs of the workflow per question, every call a training row, and the
engines that generate them (`RolloutEngine`, `make_engine`: the policy itself here, vLLM in memagent.rl.vllm).

One rollout (sample) of a question is one full run of the workflow (`workflow` in the training config,
memagent.agent.registry): for the paper's `memagent`, K memory updates (one per chunk, in document order)
and the final answer, i.e. n_i = K + 1 independent conversations; another workflow's conversations of every
kind (e.g. a lookup query) are rows alike. The
reward is computed on the final answer only (docs/paper.md, "Multi-Conv DAPO"); NOT in the paper, a step reward
may also score each conversation, its advantage mixed in (memagent.rl.step_rewards, docs/rewards.md). A sample's memory calls
run in sequence; the calls of different samples at the same step go to the backend in one batch
(the workflow's own batching).

One step's rollouts come from `collect_rollouts`: rounds of B questions, each question sent to
the rank that trains it; with dynamic sampling (DAPO), groups whose rewards are all equal are
dropped and further rounds are sampled until B groups are kept or the round limit is hit. Only
then are the group advantages computed (Dr. GRPO: R_i - mean of the group) and broadcast
unchanged to every conversation row of the sample (`RolloutBatch.with_advantages`).

Data parallelism: question j of a round goes to rank ((j mod m) * W) // m, m = mini_batch_size,
so every global mini-batch holds the same groups whatever the number of processes W. Seeding
(`rollout.seeding`): "rank" seeds each rank's round as a whole; "sample" keys every rollout by its global
identity (data position p, index g: `p * G + g`) and the run's (seed, step, round) alone, so a step draws the
same rollouts under any W (per-row sampling in the transformers backend: `memagent.backends.row_sampling`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from memagent.agent.protocol import AgentInput
from memagent.agent.registry import DEFAULT_WORKFLOW, BoundWorkflow, build_workflow, run_workflow
from memagent.backends.base import Backend, BackendError
from memagent.backends.hf import TransformersBackend
from memagent.config import AgentConfig
from memagent.rewards.protocol import Reward
from memagent.rl.algos import broadcast_advantages, group_advantages, informative_groups
from memagent.rl.config import TrainConfig
from memagent.rl.distributed import DistInfo, all_gather_objects, all_reduce, full_state_dict, is_fsdp, unwrap
from memagent.rl.lora import empty_twin
from memagent.rl.objectives import MiniBatch
from memagent.rl.recipe import DataStream, step_seed
from memagent.rl.samples import QASample
from memagent.rl.step_rewards import (StepTally, mix_advantages, outcome_rewards, rollout_step_rewards,
                                      step_advantages)
from memagent.rl.vllm.engine import ServerRollout, VLLMRollout
from memagent.tasks.metrics import RewardFn

log = logging.getLogger(__name__)


# -- engines: which model generates the rollouts, and how it follows the trained weights --------------
#
# A `RolloutEngine` hands out the backend that generates one step's rollouts and, after every update, brings
# that backend's weights up to date (`sync`, a collective under FSDP2: every rank calls it). An engine may
# also have `offload()`, called after the rollouts and before the update (a sleeping vLLM engine frees its
# GPU memory there). `make_engine` builds the one named by `rollout.engine`: "policy" (`PolicyRollout`, the
# trained policy itself through the `transformers` backend) or the vLLM engines of memagent.rl.vllm.engine,
# "vllm" (in-process) and "vllm-server" (an external server).


class RolloutEngine(Protocol):
    def backend(self) -> Backend:
        """The backend to generate this step's rollouts with."""
        ...

    def sync(self) -> None:
        """Bring the generating weights up to date with the trained ones (every rank calls it)."""
        ...


class PolicyRollout:
    """rollout.engine=policy: the trained policy itself, through the `transformers` backend. Single process and
    DDP: the live model, nothing to sync. FSDP2: sharded parameters cannot generate (every forward is a
    collective and ranks decode different lengths), so each rank keeps a full, unsharded copy that is refreshed
    from the shards after every update."""

    def __init__(self, model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo,
                 vocab_limit: int | None | str = "auto") -> None:
        self.model, self.info = model, info
        self.copy: nn.Module | None = None
        gen_model = unwrap(model)
        if is_fsdp(model):  # a LoRA policy's copy is a peft model too: the same names, base + adapters
            self.copy = empty_twin(model).to(info.device).eval().requires_grad_(False)
            gen_model = self.copy
            self.sync()
        self._backend = TransformersBackend(gen_model, tokenizer, max_batch_size=cfg.rollout.max_batch_size,
                                            want_logprobs=cfg.update.old_logprobs == "rollout",
                                            chat_template_kwargs=cfg.chat_template_kwargs,
                                            speculate=cfg.rollout.speculate, emit_limit=vocab_limit)

    def backend(self) -> Any:
        """The transformers backend, its model put in eval mode."""
        self._backend.model.eval()
        return self._backend

    def sync(self) -> None:
        """Refresh the generating copy from the shards (FSDP2 only; otherwise the live model generates)."""
        if self.copy is None:
            return
        full = full_state_dict(self.model, all_ranks=True)
        got = self.copy.load_state_dict({k: v.to(self.info.device) for k, v in full.items()}, strict=False)
        if got.missing_keys or got.unexpected_keys:  # a copy left with random weights would sample noise
            raise BackendError(f"the rollout copy of the FSDP2 policy does not match its weights: missing "
                               f"{got.missing_keys[:3]}, unexpected {got.unexpected_keys[:3]}")


ENGINES = {"policy": PolicyRollout, "vllm": VLLMRollout, "vllm-server": ServerRollout}


def make_engine(model: nn.Module, tokenizer: Any, cfg: TrainConfig, info: DistInfo,
                vocab_limit: int | None | str = "auto") -> RolloutEngine:
    """The engine named by `cfg.rollout.engine` (validated by RolloutConfig); `vocab_limit`: the ids the policy
    may emit, computed by the trainer once (the in-process engine masks the rest; "auto": computed there)."""
    if cfg.rollout.engine == "policy":
        return PolicyRollout(model, tokenizer, cfg, info, vocab_limit)
    return ENGINES[cfg.rollout.engine](model, tokenizer, cfg, info)


@dataclass
class RolloutBatch:
    """Rows of conversations for training. N rows, S samples (rollouts), groups of G samples.

    Token fields are ragged Python lists (one list per row); they become padded tensors per
    micro-batch (`memagent.rl.packing`). The advantages are None until `with_advantages`.
    """

    prompt_ids: list[list[int]]  # N x [P_n] int, the exact ids the model saw (chat template included)
    response_ids: list[list[int]]  # N x [R_n] int, the sampled ids (terminating EOS included)
    rollout_logprobs: list[list[float]] | None  # N x [R_n] float, sampling-time log-probs, or None
    sample_index: Tensor  # (N,) int64, row -> its sample in [0, S)
    is_final: Tensor  # (N,) bool, True for the final-answer conversation of its sample
    rewards: Tensor  # (S,) float32, reward of each sample's final answer
    sample_group: Tensor  # (S,) int64, group (question) id of each sample; unique within the step
    predictions: list[str | None]  # S, the extracted \boxed{} answers (None: none written)
    generated_tokens: int = 0  # response tokens over all rows
    seconds: float = 0.0  # wall-clock of generation
    sample_advantages: Tensor | None = None  # (S,) float32
    advantages: Tensor | None = None  # (N,) float32, the sample's advantage copied to each of its rows (mixed
    #   with the step advantage where a step reward scores the row: memagent.rl.step_rewards)
    step_rewards: Tensor | None = None  # (N,) float32, the step reward of each row (NaN: not scored); None: no
    #   step reward in this run
    step_keys: Tensor | None = None  # (N,) int64, (kind, step index) of each row (`step_rewards.step_key`)

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

    def with_advantages(self, norm_by_std: bool = False, step_mix: float = 1.0, step_scale: bool = False) -> "RolloutBatch":
        """The batch with each sample's group advantage (`algos.group_advantages`) broadcast to its rows, mixed
        with the centred step rewards where there are any (`step_rewards.mix_advantages`; step_mix = 1: none)."""
        adv = group_advantages(self.rewards, self.sample_group, norm_by_std=norm_by_std) if self.num_samples \
            else torch.zeros(0)  # (S,)
        rows = broadcast_advantages(adv, self.sample_index) if self.num_rows else torch.zeros(0)  # (N,)
        if self.step_rewards is not None and self.step_keys is not None and self.num_rows and step_mix != 1.0:
            step = step_advantages(self.step_rewards, self.group_id, self.step_keys, scale=step_scale)
            rows = mix_advantages(rows, step, ~torch.isnan(self.step_rewards), step_mix)
        return replace(self, sample_advantages=adv, advantages=rows)

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
            rewards=self.rewards[keep],
            sample_group=self.sample_group[keep],
            predictions=[p for p, k in zip(self.predictions, keep.tolist()) if k],
            generated_tokens=sum(len(self.response_ids[n]) for n in rows),
            seconds=self.seconds,
            sample_advantages=None if self.sample_advantages is None else self.sample_advantages[keep],
            advantages=None if self.advantages is None else (self.advantages[idx] if rows else torch.zeros(0)),
            step_rewards=None if self.step_rewards is None else self.step_rewards[idx] if rows else torch.zeros(0),
            step_keys=None if self.step_keys is None else self.step_keys[idx] if rows else torch.zeros(0, dtype=torch.long),
        )

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"]) -> "RolloutBatch":
        """Batches one after another (sample indices shifted); group ids must already be distinct.
        Advantages are dropped: compute them on the result (`with_advantages`)."""
        offsets, total = [], 0
        for b in batches:
            offsets.append(total)
            total += b.num_samples
        has_lp = all(b.rollout_logprobs is not None for b in batches)

        def cat(name: str, dtype: torch.dtype) -> Tensor:
            return torch.cat([getattr(b, name) for b in batches]) if batches else torch.zeros(0, dtype=dtype)

        return RolloutBatch(
            prompt_ids=[p for b in batches for p in b.prompt_ids],
            response_ids=[r for b in batches for r in b.response_ids],
            rollout_logprobs=[lp for b in batches for lp in b.rollout_logprobs] if has_lp else None,  # type: ignore[union-attr]
            sample_index=torch.cat([b.sample_index + o for b, o in zip(batches, offsets)]) if batches
            else torch.zeros(0, dtype=torch.long),
            is_final=cat("is_final", torch.bool),
            rewards=cat("rewards", torch.float32),
            sample_group=cat("sample_group", torch.long),
            predictions=[p for b in batches for p in b.predictions],
            generated_tokens=sum(b.generated_tokens for b in batches),
            seconds=sum(b.seconds for b in batches),
            step_rewards=torch.cat([b.step_rewards for b in batches]) if batches and all(  # type: ignore[misc]
                b.step_rewards is not None for b in batches) else None,
            step_keys=torch.cat([b.step_keys for b in batches]) if batches and all(  # type: ignore[misc]
                b.step_keys is not None for b in batches) else None,
        )

    def mini_batch(self, groups: Sequence[int], old_logprobs: list[Tensor] | None,
                   ref_logprobs: list[Tensor] | None) -> MiniBatch:
        """The rows of `groups` (group ids) as one objective mini-batch; needs `with_advantages` first.
        old_logprobs, ref_logprobs: N x (R_n,) for every row of this batch (old None: on-policy, the objective
        takes its own forward's)."""
        assert self.advantages is not None, "compute the advantages (with_advantages) before training"
        wanted = set(groups)
        rows = [n for n, g in enumerate(self.group_id.tolist()) if g in wanted]
        idx = torch.tensor(rows, dtype=torch.long)
        return MiniBatch([self.prompt_ids[n] for n in rows], [self.response_ids[n] for n in rows],
                         None if old_logprobs is None else [old_logprobs[n] for n in rows],
                         None if ref_logprobs is None else [ref_logprobs[n] for n in rows],
                         self.advantages[idx] if rows else torch.zeros(0),
                         self.sample_index[idx] if rows else torch.zeros(0, dtype=torch.long))


def dynamic_sampling_filter(batch: RolloutBatch) -> RolloutBatch:
    """DAPO dynamic sampling: keep exactly the groups whose rewards are not all equal."""
    return batch.select_samples(informative_groups(batch.rewards, batch.sample_group))


# -- generating -------------------------------------------------------------------------------------


def rollout_inputs(questions: Sequence[QASample], group_ids: Sequence[int], group_size: int,
                   per_sample: bool = False) -> list[AgentInput]:
    """The workflow inputs of G rollouts per question (question by question); with per_sample, rollout g of
    question q carries the seed key group_ids[q] * G + g (its global identity within the run)."""
    if len(questions) != len(group_ids):
        raise ValueError("give one group id per question")
    return [q.agent_input(f"{q.id}#{g}", group_ids[i] * group_size + g if per_sample else None)
            for i, q in enumerate(questions) for g in range(group_size)]


def generate_rollouts(
    backend: Backend,
    agent_config: AgentConfig,
    questions: Sequence[QASample],
    group_ids: Sequence[int],
    group_size: int,
    reward_fn: RewardFn | Reward,
    *,
    seed: int | None, step_reward: Reward | None = None,
    per_sample: bool = False, workflow: str | BoundWorkflow = DEFAULT_WORKFLOW, workflow_options: dict | None = None,
) -> RolloutBatch:
    """G rollouts of each question through the workflow, rewarded (advantages: `with_advantages`).

    group_ids: one id per question (unique within the training step, also across ranks).
    seed: seed of this batch's sampling (the workflow derives one per call from it).
    per_sample: seed rollout g of question q by its global key group_ids[q] * G + g (`AgentInput.seed_key`)
        instead of by batch, so its draws do not depend on the other questions here (a backend that honours
        `SamplingParams.seeds`: the transformers one).
    workflow, workflow_options: the workflow by name and its own options, or bound (`TrainConfig.bound_workflow`);
    reward_fn: a Reward or `(reply, golds) -> float`; step_reward: a Reward scoring each row (rl.step_rewards) or None.
    Samples are ordered question by question: sample s = q * G + g.
    """
    items = rollout_inputs(questions, group_ids, group_size, per_sample)
    # every rollout in flight at once: each workflow step is one backend batch (bounded by max_batch_size)
    agent = build_workflow(workflow, backend, replace(agent_config, seed=seed, max_batch_docs=max(1, len(items))),
                           keep_conversations=True, **(workflow_options or {}))
    t0 = time.perf_counter()
    results = run_workflow(agent, items) if items else []
    seconds = time.perf_counter() - t0
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    logprobs: list[list[float]] | None = []
    sample_index: list[int] = []
    is_final: list[bool] = []
    for s, res in enumerate(results):
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
            is_final.append(conv.kind == "final")  # any other kind (memory, query, ...) is an intermediate row
    owners = [questions[s // group_size] for s in range(len(results))]  # the question of each rollout
    steps = rollout_step_rewards(step_reward, owners, results, agent_config, backend.tokenizer) if step_reward else (None, None)
    return RolloutBatch(
        prompt_ids=prompts, response_ids=responses, rollout_logprobs=logprobs,
        sample_index=torch.tensor(sample_index, dtype=torch.long),  # (N,)
        is_final=torch.tensor(is_final, dtype=torch.bool),
        rewards=torch.tensor(outcome_rewards(reward_fn, owners, results), dtype=torch.float32),  # (S,)
        sample_group=torch.tensor([group_ids[s // group_size] for s in range(len(results))], dtype=torch.long),
        predictions=[res.answer for res in results],
        generated_tokens=sum(len(x) for x in responses),
        seconds=seconds,
        step_rewards=steps[0], step_keys=steps[1],  # (N,) each, or None
    )


# -- one step's rollouts ----------------------------------------------------------------------------


@dataclass
class RolloutTally:
    """Sums over one step's sampling rounds on this rank, before any group is dropped."""

    reward: float = 0.0  # sum of the samples' rewards
    correct: float = 0.0  # samples with reward >= 1
    samples: float = 0.0
    rows: float = 0.0  # conversations
    tokens: float = 0.0  # generated response tokens
    seconds: float = 0.0  # generation wall-clock (the slowest rank's, once reduced)

    def add(self, batch: RolloutBatch) -> None:
        self.reward += float(batch.rewards.sum())
        self.correct += float((batch.rewards >= 1).sum())
        self.samples += batch.num_samples
        self.rows += batch.num_rows
        self.tokens += batch.generated_tokens
        self.seconds += batch.seconds

    def reduced(self, info: DistInfo) -> "RolloutTally":
        """Sums over all ranks; seconds the maximum."""
        names = [f.name for f in fields(self)]
        sums = all_reduce(torch.tensor([getattr(self, n) for n in names], dtype=torch.float64), info).tolist()
        out = RolloutTally(**dict(zip(names, sums)))
        out.seconds = float(all_reduce(torch.tensor([self.seconds], dtype=torch.float64), info, "max"))
        return out


def warn_rank_seeded_resume(seeding: str, saved: int | None, info: DistInfo) -> str | None:
    """The warning (logged once, by rank 0) when a run with rollout.seeding "rank" resumes from a checkpoint
    written by another number of processes (`saved`: that number, from its trainer_state.json; None for a fresh
    run): its later rollouts, hence its metrics, differ from those of the uninterrupted run. None when there is
    nothing to warn about."""
    if seeding != "rank" or saved is None or saved == info.world_size:
        return None
    msg = (f"resuming a run saved by {saved} process(es) with {info.world_size}: rollouts are seeded per rank "
           "(rollout.seeding: rank), so the later rollouts and metrics will differ from an uninterrupted run's; "
           "rollout.seeding: sample draws the same rollouts under any number of processes")
    if info.is_main:
        log.warning(msg)
    return msg


def assign_rank(position: int, mini_batch_size: int, world_size: int) -> int:
    """The rank that generates and trains question `position` of a round (see module docstring)."""
    return ((position % mini_batch_size) * world_size) // mini_batch_size


@dataclass
class StepRollouts:
    """One step's rollouts on this rank, ready to train on."""

    batch: RolloutBatch  # this rank's kept groups, advantages computed
    parts: list[list[int]]  # the global mini-batch partition, as group ids (the same on every rank)
    metrics: dict[str, float] = field(default_factory=dict)


def collect_rollouts(backend: Backend, cfg: TrainConfig, samples: Sequence[QASample], data: DataStream,
                     reward_fn: RewardFn | Reward, *, step: int, info: DistInfo,
                     step_reward: Reward | None = None) -> StepRollouts:
    """This rank's groups of one training step: sampled in rounds, filtered, then advantaged (with the step
    reward's advantages mixed in: cfg.step_mix, cfg.step_scale)."""
    if step_reward is not None and hasattr(step_reward, "attach"):  # a reward that asks the policy
        step_reward.attach(backend, cfg.agent)
    steps = StepTally()
    B, m = cfg.rollout.batch_size, cfg.update.mini_batch_size
    per_sample = cfg.rollout.seeding == "sample"  # else seeded per rank: draws depend on the world size
    batches, tally, kept_ids, rounds = [], RolloutTally(), [], 0
    while True:
        start = data.position
        indices = data.take(B)
        mine = [j for j in range(B) if assign_rank(j, m, info.world_size) == info.rank]
        batch = generate_rollouts(backend, cfg.agent, [samples[indices[j]] for j in mine], [start + j for j in mine],
                                  cfg.rollout.group_size, reward_fn, per_sample=per_sample,
                                  seed=step_seed(cfg.seed, step, rounds, 0 if per_sample else info.rank),
                                  workflow=cfg.bound_workflow,
                                  step_reward=step_reward)
        tally.add(batch)
        steps.add(batch)
        if cfg.rollout.dynamic_sampling:
            batch = dynamic_sampling_filter(batch)
        batches.append(batch)
        rounds += 1
        kept_ids.extend(g for ids in all_gather_objects(sorted(set(batch.sample_group.tolist())), info) for g in ids)
        kept_ids.sort()  # group id = data position: the same order whatever the number of processes
        if not cfg.rollout.dynamic_sampling or len(kept_ids) >= B or rounds >= cfg.rollout.max_sampling_rounds:
            break
    kept_ids = kept_ids[:B]
    kept = set(kept_ids)
    local = RolloutBatch.concat(batches)
    local = local.select_samples(torch.tensor([int(g) in kept for g in local.sample_group.tolist()], dtype=torch.bool))
    parts = [list(map(int, p)) for p in np.array_split(np.array(kept_ids, dtype=np.int64), cfg.num_mini_batches)]
    t = tally.reduced(info)
    n = max(t.samples, 1.0)
    metrics = {"reward": t.reward / n, "accuracy": t.correct / n, "sampled_groups": rounds * B,
               "kept_groups": len(kept_ids), "sampling_rounds": rounds, "conversations_per_sample": t.rows / n,
               "generated_tokens": int(t.tokens), "rollout_s": t.seconds, "tokens_per_s": t.tokens / max(t.seconds, 1e-9)}
    if step_reward is not None:
        metrics.update(steps.metrics(step_reward.name, info))
    metrics.update(getattr(reward_fn, "metrics", dict)())  # a reward's own counters (the judge's; this rank's)
    return StepRollouts(local.with_advantages(cfg.loss.norm_by_std, cfg.step_mix if step_reward else 1.0,
                                              cfg.step_scale), parts, metrics)

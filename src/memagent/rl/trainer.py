"""The Multi-Conv DAPO training loop (PAPER.md, "Multi-Conv DAPO"): setup, train, save, cleanup.

Per step (one rollout batch):
1. Rollout: B questions x G samples through the workflow with the live policy (temperature 1.0);
   every memory update and final answer is a row; reward on the final answer, group advantage
   broadcast to the sample's rows. With dynamic sampling, groups of equal rewards are dropped and
   further rounds of B questions are sampled until B groups are kept or the round limit is hit.
2. Old log-probs recomputed with the policy before any update (or the rollout's own), reference
   log-probs from the frozen initial model when kl_coef > 0.
3. mu passes over the batch; the kept groups split into B / mini_batch_size optimiser
   mini-batches; each is accumulated over micro-batches with the mini-batch's global count as the
   loss denominator (memagent.rl.update), then clipped, AdamW, scheduler.
4. Metrics (JSONL, optional TensorBoard), progress bar, checkpoints every N steps and at the end.

Data parallelism: question j of a round goes to rank ((j mod m) * W) // m, m = mini_batch_size,
so every global mini-batch holds the same groups whatever the number of processes W; each rank
generates and trains on its own groups. Departures from the paper: weight decay applies to all
parameters (as verl's actor does); `sample-mean` aggregation is an option of ours.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from memagent.config import ConfigError
from memagent.errors import MemAgentError
from memagent.jsonl import iter_jsonl
from memagent.lock import run_lock
from memagent.rl.checkpoint import latest_checkpoint, load_checkpoint, load_model_weights, save_checkpoint
from memagent.rl.config import TrainConfig, check_out_dir, config_to_dict, save_config
from memagent.rl.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce,
    clip_grad_norm,
    init_distributed,
    unwrap,
    wrap_model,
)
from memagent.rl.checkpoint import TrainOutputError, resume_checkpoint
from memagent.rl.forward import rows_logprobs
from memagent.rl.loop import DataStream, MetricsLog, Progress, make_optimizer, step_seed
from memagent.rl.rollout import QASample, RewardFn, RolloutBatch, dynamic_sampling_filter, generate_rollouts, get_reward, load_samples
from memagent.rl.update import LossSettings, MiniBatch, accumulate_gradients

log = logging.getLogger(__name__)

Callback = Callable[[int, dict[str, Any]], "bool | None"]  # (step, metrics) -> False stops the run


@dataclass
class TrainResult:
    out_dir: Path
    checkpoint: Path | None  # the last checkpoint; `<checkpoint>/model` loads with from_pretrained
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one record per step run by this call
    model: nn.Module | None = None  # the trained policy (unwrapped), in memory


def load_policy(config: TrainConfig, model: Any, tokenizer: Any, device: torch.device) -> tuple[nn.Module, Any]:
    """The policy and tokenizer: the ones given, else from `config.model` (path or HF id)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.backends.hf import pick_dtype

    if (model is None or tokenizer is None) and not config.model:
        raise ConfigError("no model: set `model` (a save_pretrained directory or Hugging Face id) in the "
                          "config, or pass model= and tokenizer= to train()")
    try:
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(config.model)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(config.model, dtype=pick_dtype(config.dtype, device))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load model {config.model!r}: {e}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def assign_rank(position: int, mini_batch_size: int, world_size: int) -> int:
    """The rank that generates and trains question `position` of a round (see module docstring)."""
    return ((position % mini_batch_size) * world_size) // mini_batch_size


class Trainer:
    """One training run; `train()` below is the usual entry point. It holds its out_dir's lock
    (`out_dir_lock`) from construction to the end of `run()`, so a second run there refuses."""

    def __init__(self, config: TrainConfig, samples: list[QASample], reward_fn: RewardFn,
                 model: Any = None, tokenizer: Any = None, callback: Callback | None = None,
                 sft_data: Sequence[Any] | None = None) -> None:
        self.cfg, self.samples, self.reward_fn, self.callback = config, samples, reward_fn, callback
        check_out_dir(config)
        self.sft_rows = self._sft_rows(config, sft_data)
        self.info = init_distributed(config.device)
        if config.update.mini_batch_size % self.info.world_size:
            raise ConfigError(f"update.mini_batch_size ({config.update.mini_batch_size}) must be a multiple of "
                              f"the number of processes ({self.info.world_size}) so each holds whole groups")
        self._held = contextlib.ExitStack()  # the out_dir lock: released by run(), or here when setup fails
        self._held.enter_context(out_dir_lock(config.out_dir, self.info))
        try:
            self._setup(model, tokenizer)
        except BaseException:
            self._held.close()
            raise

    def _setup(self, model: Any, tokenizer: Any) -> None:
        """Policy (resumed when asked), reference model, optimiser, data order, rollout engine, run files."""
        config, samples = self.cfg, self.samples
        self.out = Path(config.out_dir)
        self.ckpt_root = self.out / "checkpoints"
        plain, self.tokenizer = load_policy(config, model, tokenizer, self.info.device)
        self.pad_id = self.tokenizer.pad_token_id
        self.ref: nn.Module | None = None
        if config.loss.kl_coef > 0:  # the initial weights, before any resume: KL to the start point
            self.ref = copy.deepcopy(plain).eval().requires_grad_(False).to(self.info.device)
        resume_from = self._resume_point()
        if resume_from is not None:
            load_model_weights(plain, resume_from / "model")
        plain.to(self.info.device)
        self.model = wrap_model(plain, config.strategy, self.info)
        if self.ref is not None and config.strategy == "fsdp" and self.info.enabled:
            self.ref = wrap_model(self.ref, "fsdp", self.info)
        self.optimizer, self.scheduler = make_optimizer(  # nominal optimiser steps: dynamic sampling may take fewer
            self.model, config.optim, config.total_steps * config.num_mini_batches * config.update.epochs)
        self.step, position = 0, 0
        if resume_from is not None:
            state = load_checkpoint(resume_from, self.info, model=self.model, optimizer=self.optimizer,
                                    scheduler=self.scheduler)
            self.step, position = int(state["step"]), int(state["data_position"])
            if self.step > config.total_steps:
                raise ConfigError(f"resume: the run in {self.out} has done {self.step} steps, more than "
                                  f"total_steps={config.total_steps}; set total_steps >= {self.step} to go on")
            log.info("resumed from %s (step %d)", resume_from, self.step)
        else:
            torch.manual_seed(config.seed + self.info.rank)
            random.seed(config.seed + self.info.rank)
            np.random.seed(config.seed + self.info.rank)
        self.data = DataStream(len(samples), config.seed, position)
        self.rollout_engine = self._make_rollout_engine()
        self.loss = LossSettings(config.loss.clip_low, config.loss.clip_high, config.loss.clip_c, config.loss.agg,
                                 config.loss.kl_coef, config.loss.kl_kind, config.horizon, config.agent.temperature)
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(config, self.out / "config.json")
        self.metrics = MetricsLog(self.out, self.info, config.tensorboard, resume_step=self.step)

    @staticmethod
    def _sft_rows(config: TrainConfig, sft_data: Sequence[Any] | None) -> list[tuple[list[int], list[int]]] | None:
        """The auxiliary supervised rows (loss.sft_coef), checked; None when the loss is off."""
        from memagent.rl.sft import check_rows  # a local import: sft imports this module

        if config.loss.sft_coef == 0:
            if sft_data:
                raise ConfigError("sft_data was given but loss.sft_coef is 0: set loss.sft_coef to mix it in")
            return None
        if not sft_data:
            raise ConfigError(f"loss.sft_coef is {config.loss.sft_coef} but no rows were given: pass "
                              "train(..., sft_data=[(prompt_ids, response_ids), ...])")
        return check_rows(sft_data)

    def sft_grads(self, k: int) -> dict[str, float]:
        """Add loss.sft_coef x the token-mean cross-entropy of loss.sft_batch_size rows (drawn with replacement,
        seeded by the step and the optimiser step k within it, the same on every rank) to the gradient."""
        from memagent.rl.sft import sft_step_grads

        rows, cfg, info = self.sft_rows, self.cfg, self.info
        assert rows is not None
        g = torch.Generator().manual_seed(step_seed(cfg.seed, self.step, k, 0) + 1)
        picked = torch.randint(len(rows), (cfg.loss.sft_batch_size,), generator=g).tolist()
        mine = [rows[i] for i in picked[info.rank :: info.world_size]]
        out = sft_step_grads(self.model, mine, micro_batch_size=cfg.update.micro_batch_size, pad_id=self.pad_id,
                             info=info, scale=cfg.loss.sft_coef)
        return {"sft_loss": out["loss"], "sft_token_accuracy": out["token_accuracy"]}

    def _resume_point(self) -> Path | None:
        """The checkpoint to resume from: the newest whole one (damaged newer ones are skipped with a warning)."""
        latest = latest_checkpoint(self.ckpt_root)
        if self.cfg.resume:
            if latest is None:
                log.warning("resume=true but %s holds no checkpoint: starting from step 0", self.ckpt_root)
            return resume_checkpoint(self.ckpt_root)
        if latest is not None:
            raise ConfigError(f"{self.out} already holds checkpoints (latest {latest.name}); pass resume=true "
                              "to continue that run, or choose another out_dir")
        return None

    def _make_rollout_engine(self) -> Any:
        if self.cfg.rollout.engine == "vllm":
            from memagent.rl.vllm_rollout import VLLMRollout  # optional dependency, imported only here

            return VLLMRollout(self.model, self.tokenizer, self.cfg, self.info)
        from memagent.rl.policy_rollout import PolicyRollout

        return PolicyRollout(self.model, self.tokenizer, self.cfg, self.info)

    # -- one step ---------------------------------------------------------------------------------
    def rollout(self) -> tuple[RolloutBatch, list[list[int]], dict[str, float]]:
        """This rank's kept groups, the global mini-batch partition (group ids), rollout metrics."""
        cfg, info = self.cfg, self.info
        B, m = cfg.rollout.batch_size, cfg.update.mini_batch_size
        backend = self.rollout_engine.backend()
        batches, totals = [], torch.zeros(6, dtype=torch.float64)  # reward, correct, samples, rows, tokens, seconds
        kept_ids: list[int] = []
        rounds = 0
        while True:
            start = self.data.position
            indices = self.data.take(B)
            mine = [j for j in range(B) if assign_rank(j, m, info.world_size) == info.rank]
            batch = generate_rollouts(backend, cfg.agent, [self.samples[indices[j]] for j in mine],
                                      [start + j for j in mine], cfg.rollout.group_size, self.reward_fn,
                                      seed=step_seed(cfg.seed, self.step, rounds, info.rank),
                                      norm_by_std=cfg.loss.norm_by_std)
            totals += torch.tensor([float(batch.rewards.sum()), float((batch.rewards >= 1).sum()), batch.num_samples,
                                    batch.num_rows, batch.generated_tokens, batch.seconds], dtype=torch.float64)
            if cfg.rollout.dynamic_sampling:
                batch = dynamic_sampling_filter(batch)
            batches.append(batch)
            rounds += 1
            kept_ids.extend(g for ids in all_gather_objects(sorted(set(batch.sample_group.tolist())), info) for g in ids)
            kept_ids.sort()  # group id = data position: the same order whatever the number of processes
            if not cfg.rollout.dynamic_sampling or len(kept_ids) >= B or rounds >= cfg.rollout.max_sampling_rounds:
                break
        kept_ids = kept_ids[:B]
        local = RolloutBatch.concat(batches)
        local = local.select_samples(torch.tensor([int(g) in set(kept_ids) for g in local.sample_group.tolist()],
                                                  dtype=torch.bool))
        parts = [list(map(int, p)) for p in np.array_split(np.array(kept_ids, dtype=np.int64), cfg.num_mini_batches)]
        t = all_reduce(totals, info)
        seconds = float(all_reduce(totals[5:6], info, "max"))
        n = max(t[2].item(), 1.0)
        metrics = {"reward": t[0].item() / n, "accuracy": t[1].item() / n, "sampled_groups": rounds * B,
                   "kept_groups": len(kept_ids), "sampling_rounds": rounds,
                   "conversations_per_sample": t[3].item() / n, "generated_tokens": int(t[4].item()),
                   "rollout_s": seconds, "tokens_per_s": t[4].item() / max(seconds, 1e-9)}
        return local, parts, metrics

    def update(self, batch: RolloutBatch, parts: list[list[int]]) -> dict[str, float]:
        """mu passes of optimiser steps over this rank's rows; averaged metrics."""
        cfg, info = self.cfg, self.info
        mu = cfg.update.micro_batch_size
        if cfg.update.old_logprobs == "rollout" and batch.rollout_logprobs is not None:
            old = [torch.tensor(lp, dtype=torch.float64) for lp in batch.rollout_logprobs]
        else:
            if cfg.update.old_logprobs == "rollout":
                log.warning("the rollout backend gave no log-probs: recomputing them with the policy")
            old = rows_logprobs(self.model, batch.prompt_ids, batch.response_ids, pad_id=self.pad_id,
                                micro_batch_size=mu, info=info, temperature=self.loss.temperature)
        ref = None
        if self.ref is not None:
            ref = rows_logprobs(self.ref, batch.prompt_ids, batch.response_ids, pad_id=self.pad_id,
                                micro_batch_size=mu, info=info, temperature=self.loss.temperature)
        row_group = batch.group_id.tolist()
        records: list[dict[str, float]] = []
        for _ in range(cfg.update.epochs):
            for part in parts:
                if not part:
                    continue
                wanted = set(part)
                rows = [n for n, g in enumerate(row_group) if g in wanted]
                idx = torch.tensor(rows, dtype=torch.long)
                mb = MiniBatch([batch.prompt_ids[n] for n in rows], [batch.response_ids[n] for n in rows],
                               [old[n] for n in rows], None if ref is None else [ref[n] for n in rows],
                               batch.advantages[idx] if rows else torch.zeros(0),
                               batch.sample_index[idx] if rows else torch.zeros(0, dtype=torch.long))
                rec = accumulate_gradients(self.model, mb, self.loss, micro_batch_size=mu, pad_id=self.pad_id, info=info)
                if self.sft_rows is not None:
                    rec.update(self.sft_grads(len(records)))
                rec["grad_norm"] = float(clip_grad_norm(self.model, cfg.optim.grad_clip))
                rec["lr"] = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                records.append(rec)
        self.rollout_engine.sync()
        if not records:
            return {"optimizer_steps": 0}
        out = {k: float(np.mean([r[k] for r in records])) for k in records[0]}
        out["ratio_min"] = min(r["ratio_min"] for r in records)
        out["ratio_max"] = max(r["ratio_max"] for r in records)
        out["tokens"] = sum(r["tokens"] for r in records)
        out["optimizer_steps"] = len(records)
        return out

    def save(self) -> Path:
        return save_checkpoint(self.ckpt_root, self.step, self.info, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, scheduler=self.scheduler,
                               trainer_state={"data_position": self.data.position, "seed": self.cfg.seed},
                               config=config_to_dict(self.cfg), keep_last=self.cfg.keep_last)

    def run(self) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(self.out, latest_checkpoint(self.ckpt_root), model=unwrap(self.model))
        saved_at = self.step if result.checkpoint is not None else -1
        progress = Progress(cfg.total_steps, self.step, enabled=cfg.progress and self.info.is_main)
        try:
            while self.step < cfg.total_steps:
                t0 = time.perf_counter()
                batch, parts, roll = self.rollout()
                t1 = time.perf_counter()
                upd = self.update(batch, parts)
                self.step += 1
                rec = {"step": self.step, **roll, **upd, "update_s": time.perf_counter() - t1,
                       "step_s": time.perf_counter() - t0, "data_position": self.data.position}
                self.metrics.write(rec)
                result.metrics.append(rec)
                progress.advance(rec)
                stop = self.callback is not None and self.callback(self.step, rec) is False
                if (cfg.save_every and self.step % cfg.save_every == 0) or stop or self.step == cfg.total_steps:
                    result.checkpoint = self.save()
                    saved_at = self.step
                if stop:
                    break
            if saved_at != self.step:
                result.checkpoint = self.save()
        finally:
            progress.close()
            self.metrics.close()
            self._held.close()
        return result


def train(
    config: TrainConfig,
    dataset: Iterable[dict[str, Any] | QASample] | None = None,
    reward_fn: RewardFn | None = None,
    model: Any = None,
    tokenizer: Any = None,
    callback: Callback | None = None,
    sft_data: Sequence[Any] | None = None,
) -> TrainResult:
    """Train a policy with Multi-Conv DAPO; the Python entry point (the CLI calls it too).

    config: TrainConfig (see memagent.rl.config; `load_config` reads YAML + overrides).
    dataset: samples {id, question, document (str or list of str) or context, answers (list of
        str)}; read once into memory. None reads `config.data` (JSONL of the same records).
    reward_fn: (final reply text or None, gold answers) -> float; default `config.rollout.reward`
        ("boxed": the paper's verifier).
    model, tokenizer: an in-memory Hugging Face causal LM and its tokenizer; default loaded from
        `config.model`. The model is trained in place (and returned in the result).
    callback: called as callback(step, metrics) after every step (on every rank: it must answer
        the same on all); returning False stops the run (a checkpoint is written at that step,
        so `resume=true` continues it).
    sft_data: rows (prompt_ids, response_ids) of the auxiliary supervised loss, when loss.sft_coef > 0
        (NOT part of Multi-Conv DAPO; see LossConfig).
    A fresh run seeds the global torch / random / NumPy generators from `config.seed` (+ rank).
    Returns a TrainResult; launch under `torchrun --nproc-per-node N` for data parallelism.
    """
    if dataset is None:
        if not config.data:
            raise ConfigError("no training data: set `data` (a JSONL file) in the config or pass dataset=")
        dataset = read_jsonl(config.data)
    samples = load_samples(dataset)
    reward = reward_fn if reward_fn is not None else get_reward(config.rollout.reward)
    return Trainer(config, samples, reward, model, tokenizer, callback, sft_data).run()


@contextlib.contextmanager
def out_dir_lock(out_dir: str | Path, info: DistInfo) -> Iterator[None]:
    """Hold `memagent.lock.run_lock(out_dir)` on rank 0 for the block, so a second run on the same out_dir
    refuses; under torchrun every rank learns rank 0's outcome, and all refuse together."""
    with contextlib.ExitStack() as stack:
        refusal = None
        if info.is_main:
            try:
                stack.enter_context(run_lock(out_dir, "training run"))
            except OSError as e:
                refusal = TrainOutputError(f"cannot create or lock out_dir {out_dir}: {e}; choose a folder you can write")
            except MemAgentError as e:
                refusal = e
        agreed = all_gather_objects(None if refusal is None else str(refusal), info)[0]
        if agreed is not None:
            raise refusal if refusal is not None else TrainOutputError(agreed)
        yield


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a clear error names the bad line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"data file {p} does not exist; give a JSONL of {{id, question, answers, context}}")
    return [record for _, record in iter_jsonl(p, ConfigError)]


__all__ = ["TrainResult", "Trainer", "assign_rank", "load_policy", "out_dir_lock", "read_jsonl", "train"]

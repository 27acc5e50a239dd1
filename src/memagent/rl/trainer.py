"""Multi-Conv DAPO (docs/paper.md, "Multi-Conv DAPO"): the RL configuration of the training recipe.

Per step (one rollout batch), `MultiConvDAPO.step`:
1. Rollout (`memagent.rl.rollout.collect_rollouts`): B questions x G samples through the workflow
   with the live policy (temperature 1.0); every memory update and final answer is a row; reward
   on the final answer. With dynamic sampling, groups of equal rewards are dropped and further
   rounds are sampled; the group advantages are computed on the kept groups and broadcast to
   each sample's rows.
2. Old log-probs recomputed with the policy before any update (or the rollout's own), reference
   log-probs from the frozen initial model when kl_coef > 0.
3. mu passes over the batch; the kept groups split into B / mini_batch_size optimiser
   mini-batches; each is one `accumulate_gradients` over the objectives [(dapo, 1)] -- plus
   (sft, loss.sft_coef) on rows drawn from `sft_data` when loss.sft_coef > 0, an auxiliary loss
   NOT in the paper -- then clipped, AdamW, scheduler.
The recipe (`memagent.rl.recipe`) writes the metrics, the progress bar and the checkpoints.

Departures from the paper: weight decay applies to all parameters (as verl's actor does);
`sample-mean` aggregation is an option of ours.

`run_train(cfg, profile_yaml)` is what `memagent train` runs (its `--dry-run`, the memory estimate, is
`memagent.rl.estimate.dry_run_report`): the training after its guards (an out_dir that would destroy an input,
a resume whose settings or data differ from the run's), under the run's lock, with the protocol profile it uses
written first (rank 0). The process's rank (torchrun's RANK) is read once, there.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from memagent.backends.gguf import resolve_model
from memagent.backends.hf import config_vocab_size, pick_dtype, vocab_limit
from memagent.backends.tokenizer import check_vocab, ensure_pad_token, load_tokenizer
from memagent.config import ConfigError
from memagent.errors import MemAgentError
from memagent.io import atomic_write_text
from memagent.lock import run_lock
from memagent.rl.checkpoint import TrainOutputError
from memagent.rl.config import TrainConfig, check_out_dir, config_to_dict
from memagent.rl.distributed import DistInfo, all_gather_objects, init_distributed, wrap_model
from memagent.rl.lora import adapters_disabled, apply_lora, is_lora, load_initial_adapters
from memagent.rl.model_options import load_kwargs, offload_policy, prepare_model
from memagent.rl.objectives import DAPO, SFT, MiniBatch, Objective, Term, accumulate_gradients, check_rows
from memagent.rl.packing import rows_logprobs
from memagent.rl.recipe import Callback, Recipe, RunSpec, TrainResult, step_seed
from memagent.rl.resume_guard import samples_digest
from memagent.rl.rollout import RewardFn, RolloutBatch, collect_rollouts, make_engine, warn_rank_seeded_resume
from memagent.rl.samples import QASample, cap_chunks, load_samples, read_training_samples
from memagent.rl.validation import make_validator
from memagent.rewards.registry import build_reward

log = logging.getLogger(__name__)


def load_policy(config: TrainConfig, model: Any, tokenizer: Any, device: torch.device) -> tuple[nn.Module, Any]:
    """The policy and tokenizer: the ones given, else from `config.model` (path or HF id)."""
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: transformers

    if (model is None or tokenizer is None) and not config.model:
        raise ConfigError("no model: set `model` (a save_pretrained directory or Hugging Face id) in the "
                          "config, or pass model= and tokenizer= to train()")
    loaded = model is None  # loaded here: its vocabulary checked against config.json before its weights
    try:
        path = resolve_model(config.model)  # a GGUF file: its converted folder
        if tokenizer is None:
            tokenizer = load_tokenizer(path)
        if model is None:  # the embedding's size checked first: weights of another size would not even load
            check_vocab(tokenizer, config_vocab_size(AutoConfig.from_pretrained(path)), str(config.model))
            model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(config.dtype, device),
                                                         **load_kwargs(config.model_options, device))
    except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: weights of other shapes than config.json
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"cannot load model {config.model!r}: {first}") from None
    if not loaded and getattr(model, "config", None) is not None:  # a model given: its tokenizer must be its own
        check_vocab(tokenizer, config_vocab_size(model.config), str(config.model or "the model"))
    return model, ensure_pad_token(tokenizer)


def run_spec(config: TrainConfig, data_size: int, data_sha256: str | None = None) -> RunSpec:
    """The recipe's view of a TrainConfig: one step is one rollout batch and its optimiser steps.
    data_sha256: the training data's digest, saved with each checkpoint (a resume with other data refuses)."""
    return RunSpec(out_dir=Path(config.out_dir), seed=config.seed, total_steps=config.total_steps,
                   # nominal optimiser steps (the cosine schedule's length): dynamic sampling may take fewer
                   optimizer_steps=config.total_steps * config.num_mini_batches * config.update.epochs,
                   data_size=data_size, save_every=config.save_every, keep_last=config.keep_last,
                   resume=config.resume, save_final=True, strategy=config.strategy, optim=config.optim,
                   config=config_to_dict(config), state={"seed": config.seed, **({"data_sha256": data_sha256} if data_sha256 else {})},
                   write_config=True,
                   tensorboard=config.tensorboard, progress=config.progress, what="train",
                   wandb=config_to_dict(config.log) if config.log.wandb else None,
                   cpu_offload=offload_policy(config.model_options, config.strategy, config.device),
                   checkpoint_format=config.checkpoint.format, async_save=config.checkpoint.async_save)


@dataclass(frozen=True)
class DrawnRows:
    """A further objective of each optimiser step on rows of the caller's (the demo's value-copy rows):
    `batch_size` rows drawn with replacement, seeded by the run seed, the step and the optimiser step k
    within it (the same on every rank, so a resumed run draws the same); each rank takes every W-th."""

    objective: Objective
    weight: float
    rows: list[tuple[list[int], list[int]]]
    batch_size: int
    name: str  # its metrics are reported as <name>_<metric>

    def term(self, seed: int, step: int, k: int, info: DistInfo) -> Term:
        g = torch.Generator().manual_seed(step_seed(seed, step, k, 0) + 1)
        picked = torch.randint(len(self.rows), (self.batch_size,), generator=g).tolist()
        return Term(self.objective, self.weight,
                    MiniBatch.supervised([self.rows[i] for i in picked[info.rank :: info.world_size]]))


def extra_objectives(config: TrainConfig, sft_data: Sequence[Any] | None) -> list[DrawnRows]:
    """[(sft, loss.sft_coef) on sft_data] when loss.sft_coef > 0 (NOT part of Multi-Conv DAPO), else []."""
    if config.loss.sft_coef == 0:
        if sft_data:
            raise ConfigError("sft_data was given but loss.sft_coef is 0: set loss.sft_coef to mix it in")
        return []
    if not sft_data:
        raise ConfigError(f"loss.sft_coef is {config.loss.sft_coef} but no rows were given: pass "
                          "train(..., sft_data=[(prompt_ids, response_ids), ...])")
    return [DrawnRows(SFT(), config.loss.sft_coef, check_rows(sft_data), config.loss.sft_batch_size, "sft")]


class MultiConvDAPO:
    """The RL algorithm: rollouts, then optimiser steps over the objectives (see the module docstring)."""

    def __init__(self, config: TrainConfig, samples: list[QASample], reward_fn: RewardFn, recipe: Recipe,
                 ref: nn.Module | None, extra: Sequence[DrawnRows] = ()) -> None:
        self.cfg, self.samples, self.reward_fn, self.extra = config, samples, reward_fn, list(extra)
        # NOT in the paper: credit per memory update (rl.step_rewards)
        self.step_reward = (build_reward(config.step_reward, "step", **config.step_reward_options)
                            if config.step_reward else None)
        self.recipe, self.info = recipe, recipe.info  # the model being trained, its optimiser, the data order
        self.ref = ref
        if ref is not None and config.strategy == "fsdp" and self.info.enabled:
            self.ref = wrap_model(ref, "fsdp", self.info)
        self.pad_id = recipe.tokenizer.pad_token_id
        # the ids the rollout may sample (an embedding padded past the tokenizer: the rest are masked there)
        self.vocab_limit = vocab_limit(recipe.model, recipe.tokenizer)
        self.engine = make_engine(recipe.model, recipe.tokenizer, config, self.info, self.vocab_limit)
        warn_rank_seeded_resume(config.rollout.seeding, recipe.saved_world_size, self.info)
        self.dapo = DAPO.from_config(config.loss, config.horizon, config.agent.temperature)
        self.validator = make_validator(config.val.data, config.val.every, config.val.samples, config.agent,
                                        reward_fn, config.seed, self.info, config.rollout.seeding == "sample",
                                        config.bound_workflow)

    def step(self, run: Recipe) -> dict[str, Any]:
        t0 = time.perf_counter()
        got = collect_rollouts(self.engine.backend(), self.cfg, self.samples, run.data, self.reward_fn,
                               step=run.step, info=self.info, step_reward=self.step_reward)
        getattr(self.engine, "offload", lambda: None)()  # a sleeping vLLM engine frees its GPU memory
        t1 = time.perf_counter()
        upd = self.update(got.batch, got.parts)
        out = {**got.metrics, **upd, "update_s": time.perf_counter() - t1, "step_s": time.perf_counter() - t0,
               "data_position": run.data.position}
        if self.validator is not None:
            out.update(self.validator.metrics(run.step + 1, self.engine.backend()))
        return out

    def logprobs(self, batch: RolloutBatch, on_policy: bool = False
                 ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """Old (behaviour) and reference log-probs of every row: N x (R_n,). on_policy: the step is one optimiser
        step, so with update.old_logprobs "policy" the old log-probs are the loss forward's own (None here)."""
        cfg, mu = self.cfg, self.cfg.update.micro_batch_size
        if cfg.update.old_logprobs == "policy" and on_policy:
            old = None  # the objective takes the loss forward's own log-probs, detached
        elif cfg.update.old_logprobs == "rollout" and batch.rollout_logprobs is not None:
            old = [torch.tensor(lp, dtype=torch.float64) for lp in batch.rollout_logprobs]
        else:
            if cfg.update.old_logprobs == "rollout":
                log.warning("the rollout backend gave no log-probs: recomputing them with the policy")
            old = rows_logprobs(self.recipe.model, batch.prompt_ids, batch.response_ids, pad_id=self.pad_id,
                                micro_batch_size=mu, info=self.info, temperature=self.dapo.temperature,
                                micro_batch_tokens=cfg.update.packed_tokens, vocab_limit=self.vocab_limit)
        ref = None
        if self.ref is not None or (cfg.loss.kl_coef > 0 and is_lora(self.recipe.model)):
            # with LoRA the reference is the policy with its adapters off (the base model)
            with adapters_disabled(self.recipe.model) if self.ref is None else contextlib.nullcontext():
                ref = rows_logprobs(self.ref if self.ref is not None else self.recipe.model, batch.prompt_ids,
                                    batch.response_ids, pad_id=self.pad_id, micro_batch_size=mu, info=self.info,
                                    temperature=self.dapo.temperature,
                                    micro_batch_tokens=cfg.update.packed_tokens, vocab_limit=self.vocab_limit)
        return old, ref

    def update(self, batch: RolloutBatch, parts: list[list[int]]) -> dict[str, float]:
        """mu passes of optimiser steps over this rank's rows; metrics averaged over the optimiser steps."""
        on_policy = self.cfg.update.epochs == 1 and sum(bool(part) for part in parts) <= 1
        old, ref = self.logprobs(batch, on_policy)
        skip = self.cfg.update.skip_zero_advantage and self.cfg.loss.kl_coef == 0
        records: list[dict[str, float]] = []
        for _ in range(self.cfg.update.epochs):
            for part in parts:
                if not part:
                    continue
                k = len(records)
                rows = batch.mini_batch(part, old, ref)
                inert = rows.advantages == 0 if skip else None  # (N,) bool: rows that add exactly 0
                terms = [Term(self.dapo, 1.0, rows, skip=inert),
                         *(x.term(self.cfg.seed, self.recipe.step, k, self.info) for x in self.extra)]
                rec, *more = accumulate_gradients(self.recipe.model, terms, micro_batch_size=self.cfg.update.micro_batch_size,
                                                  pad_id=self.pad_id, info=self.info,
                                                  micro_batch_tokens=self.cfg.update.packed_tokens,
                                                  vocab_limit=self.vocab_limit)
                for x, m in zip(self.extra, more):
                    rec.update({f"{x.name}_{key}": value for key, value in m.items() if key != "tokens"})
                if inert is not None:
                    rec["skipped_rows"] = float(inert.sum())
                rec.update(self.recipe.optimizer_step(self.cfg.optim.grad_clip))
                records.append(rec)
        self.engine.sync()
        return average_records(records)


def average_records(records: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from its optimiser steps' records: means, except extremes and token counts."""
    if not records:
        return {"optimizer_steps": 0}
    out = {k: float(np.mean([r[k] for r in records])) for k in records[0]}
    out["ratio_min"] = min(r["ratio_min"] for r in records)
    out["ratio_max"] = max(r["ratio_max"] for r in records)
    out["tokens"] = sum(r["tokens"] for r in records)
    out["optimizer_steps"] = len(records)
    return out


class Trainer:
    """One Multi-Conv DAPO run: the recipe set up with this algorithm. It holds its out_dir's lock
    (`out_dir_lock`) from construction to the end of `run()`, so a second run there refuses."""

    def __init__(self, config: TrainConfig, samples: list[QASample], reward_fn: RewardFn,
                 model: Any = None, tokenizer: Any = None, callback: Callback | None = None,
                 sft_data: Sequence[Any] | None = None, data_sha256: str | None = None,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.cfg, self.callback = config, callback
        data_sha256 = data_sha256 or samples_digest(samples)
        check_out_dir(config)
        extra = extra_objectives(config, sft_data)
        info = init_distributed(config.device)
        if config.update.mini_batch_size % info.world_size:
            raise ConfigError(f"update.mini_batch_size ({config.update.mini_batch_size}) must be a multiple of "
                              f"the number of processes ({info.world_size}) so each holds whole groups")
        held = contextlib.ExitStack()  # the out_dir lock: released by the recipe's cleanup, or here when setup fails
        held.enter_context(out_dir_lock(config.out_dir, info))
        try:
            plain, tokenizer = load_policy(config, model, tokenizer, info.device)
            samples = cap_chunks(samples, tokenizer, config.agent.chunk_tokens, config.data.max_chunks)
            prepare_model(plain, config.model_options, packed=config.update.packing)
            ref = None
            if config.lora.r > 0:  # only adapters train; the KL reference is the base (adapters disabled)
                plain = apply_lora(plain, config.lora, config.rollout.engine)
                load_initial_adapters(plain, config.lora)  # lora.init: continue an adapter (the warm-up's)
            elif config.loss.kl_coef > 0:  # the initial weights, before any resume: KL to the start point
                ref = copy.deepcopy(plain).eval().requires_grad_(False).to(info.device)
            self.recipe = Recipe(run_spec(config, len(samples), data_sha256), info, plain, tokenizer, held)
            self.algorithm = MultiConvDAPO(config, samples, reward_fn, self.recipe, ref, extra)
            if on_ready is not None and info.is_main:  # the lock held, out_dir and resume checked, nothing trained
                on_ready()
        except BaseException:
            held.close()
            raise

    def run(self) -> TrainResult:
        return self.recipe.run(self.algorithm, self.callback)


def train(
    config: TrainConfig,
    dataset: Iterable[dict[str, Any] | QASample] | None = None,
    reward_fn: RewardFn | None = None,
    model: Any = None,
    tokenizer: Any = None,
    callback: Callback | None = None,
    sft_data: Sequence[Any] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> TrainResult:
    """Train a policy with Multi-Conv DAPO; the Python entry point (the CLI calls it too).

    config: TrainConfig (see memagent.rl.config; `load_config` reads YAML + overrides).
    dataset: samples {id, question, document (str or list of str) or context, answers (list of
        str)}; read once into memory. None reads `config.data` with `memagent.tasks.schema.read_samples`.
    reward_fn: the outcome reward: (final reply text or None, gold answers) -> float, or a Reward
        (memagent.rewards); default `config.reward` with `config.reward_options` ("boxed": the paper's
        verifier; any outcome reward of memagent.rewards.registry). A step reward is `config.step_reward`.
    model, tokenizer: an in-memory Hugging Face causal LM and its tokenizer; default loaded from
        `config.model`. The model is trained in place (and returned in the result).
    callback: called as callback(step, metrics) after every step (on every rank: it must answer
        the same on all); returning False stops the run (a checkpoint is written at that step,
        so `resume=true` continues it).
    sft_data: rows (prompt_ids, response_ids) of the auxiliary supervised objective, when
        loss.sft_coef > 0 (NOT part of Multi-Conv DAPO; see LossConfig).
    on_ready: called once on rank 0 when the run is set up (out_dir checked and locked, a resume checked against
        its checkpoint), before the first step: `memagent train` writes out_dir/profile.yaml there.
    A fresh run seeds the global torch / random / NumPy generators from `config.seed` (+ rank).
    Returns a TrainResult; launch under `torchrun --nproc-per-node N` for data parallelism.
    """
    if dataset is None:
        if not config.data:
            raise ConfigError("no training data: set `data` (a JSONL file) in the config or pass dataset=")
        hashed = hashlib.sha256()  # the file's bytes, hashed as they are read: a resume with other data refuses
        samples = read_training_samples(config.data.path, hashed)
        digest = hashed.hexdigest()
    else:
        samples = load_samples(dataset)
        digest = None  # Trainer digests the samples
    reward = reward_fn if reward_fn is not None else build_reward(config.reward, "outcome", **config.reward_options)
    return Trainer(config, samples, reward, model, tokenizer, callback, sft_data, digest, on_ready).run()


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


__all__ = ["DrawnRows", "MultiConvDAPO", "TrainResult", "Trainer", "load_policy", "out_dir_lock", "train"]


# -- `memagent train` as one library call (the run, with its guards) ------------------------------------------
PROFILE_FILE = "profile.yaml"  # the protocol profile a run uses, beside its config.json


def run_train(cfg: TrainConfig, profile_yaml: str) -> str:
    """Train `cfg`; returns the line to print ("" on a rank other than 0). profile_yaml: the resolved protocol
    profile, written to out_dir/profile.yaml."""
    if cfg.data and not Path(cfg.data).is_file():
        raise ConfigError(f"data file {cfg.data} does not exist; give a JSONL of {{id, question, answers, context}}")
    # the trainer checks out_dir, takes its lock and checks a resume once; profile.yaml is written after that
    # (a refused run leaves the folder's profile.yaml as it was), before the first step
    result = train(cfg, on_ready=lambda: atomic_write_text(Path(cfg.out_dir) / PROFILE_FILE, profile_yaml))
    if result.checkpoint is None or int(os.environ.get("RANK", "0")) != 0:
        return ""
    return f"trained {len(result.metrics)} step(s); checkpoint: {result.checkpoint}"

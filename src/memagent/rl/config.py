"""All configuration of training: one `TrainConfig` with nested sections, and its loader.

Defaults follow the paper (docs/paper.md, "Multi-Conv DAPO"); each field is documented once, where it is
defined, and its rule (min, choices) sits beside it (`memagent.sections.rule`, checked by `check_fields`).
`load_config(path, overrides)` reads YAML and applies `key=value` overrides (dotted keys for nested fields,
e.g. `loss.clip_high=0.2`) through the one loader, `memagent.sections`; unknown keys are errors.

Two short spellings are declared on their fields: `data: FILE` is `data: {path: FILE}` (DataConfig.path is
`scalar`), and `model: {path: ID, KEY: ...}` is `model: ID` with `model_options.KEY` (the model's loading
options share its name: `model.gradient_checkpointing=true`). `build_train_config` adds the command line's
flags and a protocol profile; `run_train` is what `memagent train` calls.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from memagent.agent.registry import BoundWorkflow, bind_workflow
from memagent.backends.speculate import SPECULATE
from memagent.config import AgentConfig, ConfigError, WorkflowChoice, deprecated, workflow_choice_data
from memagent.errors import MemAgentError
from memagent.flags import check_device
from memagent.io import check_not_input, check_output_dir, folder_holds, read_text
from memagent.rewards.registry import DEFAULT_REWARD, build_reward, check_reward_name
from memagent.rl.algos import AGG_MODES, KL_ESTIMATORS
from memagent.sections import build, check_fields, deep_merge, load_mapping, parse_overrides, rule, spell_out, to_dict

LR_SCHEDULES = ("constant", "cosine")
ENGINES = ("policy", "vllm", "vllm-server")
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2", "varlen")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CHECKPOINT_FORMATS = ("safetensors", "dcp")
DTYPES = ("auto", "float32", "bfloat16", "float16")
STRATEGIES = ("ddp", "fsdp")


@dataclass
class RolloutConfig:
    """How a rollout batch is sampled (the workflow itself is configured by `TrainConfig.agent`)."""

    batch_size: int = field(default=128, metadata=rule(min=1))  # B questions per rollout batch (paper: 128 for
    #   7B, 256 for 14B)
    group_size: int = field(default=16, metadata=rule(min=2))  # G rollouts per question (paper: 16); advantages
    #   compare the rollouts of one question, so G >= 2
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, sample more
    max_sampling_rounds: int = field(default=3, metadata=rule(min=1))  # with dynamic sampling: rounds of B
    #   questions before training on fewer
    engine: str = field(default="policy", metadata=rule(choices=ENGINES))  # "policy": generate with the trained
    #   model itself; "vllm": a vLLM engine; "vllm-server": an external vLLM server (see VLLMConfig)
    reward: str = ""  # old spelling of the top-level `reward` (kept so older config files load); "" = unset
    max_batch_size: int = field(default=64, metadata=rule(min=1))  # prompts per generate() call of the policy
    #   backend (memory bound)
    seeding: str = field(default="rank", metadata=rule(choices=("rank", "sample")))  # "rank" (seeds per rank
    #   and batch) or "sample": rank-invariant rollouts (docs/training.md); "sample" needs engine "policy"
    speculate: str = field(default="none", metadata=rule(choices=SPECULATE))  # "ngram": prompt-lookup speculative
    #   decoding (memagent.backends.speculate; the sampling distribution is unchanged) for engine "policy" (rows
    #   one at a time) and "vllm" (its speculative_config); a vllm-server decodes as it was started

    def __post_init__(self) -> None:
        check_fields(self, "rollout")
        if self.seeding == "sample" and self.engine != "policy":
            raise ConfigError(f"rollout.seeding must be 'rank' or 'sample' (per-row seeded sampling, rollout.engine "
                              f"'policy' only), got {self.seeding!r} with engine {self.engine!r}")
        if self.speculate != "none" and self.engine == "vllm-server":
            raise ConfigError(f"rollout.speculate={self.speculate} is for rollout.engine policy or vllm; an external "
                              "vLLM server speculates as it was started (vllm serve --speculative-config ...)")


@dataclass
class LossConfig:
    """The Multi-Conv DAPO objective (memagent.rl.algos.policy_loss and kl_penalty)."""

    clip_low: float = field(default=0.2, metadata=rule(min=0, below=1))  # eps_low of the clipped ratio (DAPO)
    clip_high: float = 0.28  # eps_high, DAPO's clip-higher (the paper's reference run used 0.2); >= clip_low
    clip_c: float = field(default=3.0, metadata=rule(above=1))  # dual-clip bound for negative advantages
    agg: str = field(default="token-mean", metadata=rule(choices=AGG_MODES))  # aggregation mode (paper: token
    #   mean over the whole mini-batch)
    horizon: int | None = field(default=None, metadata=rule(min=1))  # constant of seq-mean-token-sum-norm;
    #   default: max(memory, answer) tokens
    kl_coef: float = field(default=1e-3, metadata=rule(min=0))  # beta of the KL-to-reference term; 0 skips it
    #   and loads no reference
    kl_kind: str = field(default="k3", metadata=rule(choices=KL_ESTIMATORS))  # KL estimator (paper: k3, low
    #   variance)
    norm_by_std: bool = False  # divide advantages by the group std (GRPO); paper: no (Dr. GRPO)
    # NOT in the paper: an auxiliary supervised loss (InstructGPT's "PPO-ptx" mix) on rows passed as
    # train(..., sft_data=rows), added to each optimiser step's gradient; 0 = pure Multi-Conv DAPO
    sft_coef: float = field(default=0.0, metadata=rule(min=0))
    sft_batch_size: int = field(default=64, metadata=rule(min=1))  # rows of sft_data per optimiser step

    def __post_init__(self) -> None:
        check_fields(self, "loss")
        if self.clip_high < self.clip_low:
            raise ConfigError(f"loss.clip_high ({self.clip_high}) must be >= loss.clip_low ({self.clip_low}); "
                              "clip-higher widens the upper bound (paper: 0.2 / 0.28)")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up, then a constant learning rate (paper's setting) or a cosine decay."""

    lr: float = field(default=1e-6, metadata=rule(above=0))  # peak (constant) learning rate
    warmup_steps: int = field(default=20, metadata=rule(min=0))  # optimiser steps of linear warm-up from
    #   lr / warmup_steps to lr
    schedule: str = field(default="constant", metadata=rule(choices=LR_SCHEDULES))  # after the warm-up:
    #   "constant" or "cosine" (to min_lr_ratio * lr at the end)
    min_lr_ratio: float = field(default=0.0, metadata=rule(min=0, max=1))  # cosine only: the final learning
    #   rate as a fraction of lr
    weight_decay: float = field(default=0.01, metadata=rule(min=0))
    grad_clip: float = field(default=1.0, metadata=rule(min=0))  # max global gradient norm; 0 disables clipping
    beta1: float = field(default=0.9, metadata=rule(min=0, below=1))
    beta2: float = field(default=0.999, metadata=rule(min=0, below=1))
    eps: float = 1e-8  # > 0: AdamW divides by sqrt(v) + eps, and v is 0 for a weight whose gradient is 0

    def __post_init__(self) -> None:
        check_fields(self, "optim")
        if not self.eps > 0:  # eps 0 gives 0/0 = NaN weights at the first step where a gradient entry is 0
            raise ConfigError(f"optim.eps must be > 0 (AdamW divides by sqrt(v) + eps), got {self.eps}; "
                              "use the default 1e-8")


@dataclass
class UpdateConfig:
    """How one rollout batch becomes optimiser steps."""

    mini_batch_size: int = field(default=8, metadata=rule(min=1))  # questions (x G rollouts, all their
    #   conversations) per optimiser step; paper: 16 mini-batches per rollout batch of 128
    epochs: int = field(default=1, metadata=rule(min=1))  # mu: passes over the rollout batch
    micro_batch_size: int = field(default=8, metadata=rule(min=1))  # conversation rows per forward/backward
    #   (memory bound, not the math)
    old_logprobs: str = field(default="recompute", metadata=rule(choices=("recompute", "rollout", "policy")))  # "recompute"
    #   with the policy before the update, or "rollout" (the sampling-time log-probs; exact only when rollout
    #   and training numerics agree), or "policy": when the step is one optimiser step (epochs 1, one mini-batch)
    #   the policy has not moved since the rollout, so old = the loss forward's own log-probs, detached (ratio 1
    #   exactly; one forward pass over every row saved); otherwise recomputed
    skip_zero_advantage: bool = False  # leave rows whose advantage is 0 out of the forward and backward when
    #   loss.kl_coef is 0 (they add exactly 0 to the loss; the token-mean's denominator still counts them); their
    #   statistics (clip fractions, entropy) are then not reported
    packing: bool = False  # padding-free micro-batches of micro_batch_tokens tokens (rows back to back,
    #   memagent.rl.packing) instead of micro_batch_size padded rows; the same gradient
    micro_batch_tokens: int = field(default=16384, metadata=rule(min=1))  # with packing: tokens per
    #   forward/backward (a longer row goes alone)

    @property
    def packed_tokens(self) -> int:
        """The token budget of a padding-free micro-batch; 0 for the padded path."""
        return self.micro_batch_tokens if self.packing else 0

    def __post_init__(self) -> None:
        check_fields(self, "update")


@dataclass
class DataConfig(os.PathLike):
    """The training data file and how its contexts are cut. YAML `data: FILE` is short for
    `data: {path: FILE}`; the section is path-like (`open(cfg.data)`, `Path(cfg.data)`, `if cfg.data`)."""

    path: str = field(default="", metadata=rule(scalar=True))  # JSONL of samples {id, question, answers,
    #   context} (for the CLI)
    max_chunks: int = field(default=0, metadata=rule(min=0))  # cut each training context to at most N chunks of
    #   agent.chunk_tokens by removing its middle (the official training caps contexts at 8 chunks); 0 = no cap

    def __post_init__(self) -> None:
        check_fields(self, "data")

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    def __bool__(self) -> bool:
        return bool(self.path)


@dataclass
class ValConfig:
    """Periodic validation on a held-out file: greedy and sampled accuracy into metrics.jsonl
    (`val/greedy_acc`, `val/sampled_acc`), after every `every`-th step's update."""

    data: str = ""  # held-out JSONL (the sample format of `data`)
    every: int = field(default=0, metadata=rule(min=0))  # validate after steps every, 2 * every, ...; 0 = never
    samples: int = field(default=0, metadata=rule(min=0))  # the first N samples of the file; 0 = all of them

    def __post_init__(self) -> None:
        check_fields(self, "val")
        if self.every and not self.data:
            raise ConfigError(f"val.every is {self.every} but val.data is empty; give a held-out JSONL file "
                              "(val.data=FILE) or set val.every=0")


@dataclass
class LogConfig:
    """Experiment loggers beside metrics.jsonl (TensorBoard is TrainConfig.tensorboard)."""

    wandb: bool = False  # also log every step's metrics to Weights & Biases (pip install wandb)
    project: str = "memagent"  # W&B project
    name: str = ""  # W&B run name; "" = the out_dir's folder name
    entity: str = ""  # W&B team or user; "" = the logged-in default


@dataclass
class VLLMConfig:
    """The vLLM rollout engines: `rollout.engine=vllm` (in-process, colocated with training) and
    `rollout.engine=vllm-server` (an external server, weights broadcast over NCCL)."""

    gpu_memory_utilization: float = field(default=0.3, metadata=rule(above=0, max=1))  # in-process engine: its
    #   share of the GPU (training holds the rest)
    sleep: bool = False  # in-process engine: sleep (level 1) during the update, freeing its GPU memory
    sync_chunk_mb: int = field(default=512, metadata=rule(min=1))  # weights pushed per call (collective_rpc /
    #   broadcast bucket), in MiB
    server_url: str = ""  # vllm-server: the server's base URL, e.g. http://gpu7:8000 (its /v1 generates)
    nccl_host: str = ""  # vllm-server: this trainer's address as the server's workers reach it
    nccl_port: int = field(default=51216, metadata=rule(min=1, max=65535))  # vllm-server: the port of the
    #   weight-broadcast rendezvous (on nccl_host)
    timeout: float = field(default=600.0, metadata=rule(above=0))  # vllm-server: seconds for one HTTP request
    #   (generation or weight update)

    def __post_init__(self) -> None:
        check_fields(self, "vllm")


@dataclass
class ModelOptions:
    """Memory settings of the trained model, written `model.<field>` (`model` itself stays the path or id);
    applied by memagent.rl.model_options."""

    gradient_checkpointing: bool = False  # recompute each decoder layer's activations in the backward pass
    cpu_offload: bool = False  # strategy fsdp: parameters, gradients, optimiser state on the CPU (CPUOffloadPolicy)
    attn_implementation: str = field(default="auto", metadata=rule(choices=ATTN_IMPLEMENTATIONS))  # auto:
    #   flash_attention_2 on CUDA when flash-attn is installed, else transformers' default, switched to varlen
    #   under update.packing; or eager, sdpa, flash_attention_2, varlen (per-row sdpa for packed micro-batches,
    #   memagent.rl.packing)

    def __post_init__(self) -> None:
        check_fields(self, "model")


@dataclass
class LoraConfig:
    """LoRA through peft (`pip install 'memagent[lora]'`); r = 0 trains the full model.

    With r > 0 only the adapters train; the KL reference is the base model with the adapters
    disabled (no second copy); checkpoints hold the adapters (`memagent merge-lora` merges them).
    """

    r: int = field(default=0, metadata=rule(min=0))  # adapter rank; 0 disables LoRA
    alpha: float = field(default=16.0, metadata=rule(above=0))  # scaling: the update is (alpha / r) * B @ A
    dropout: float = field(default=0.0, metadata=rule(min=0, below=1))  # dropout on the adapters' input
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # linear layers' names (a list
    #   or a comma-separated string: q_proj,v_proj)
    init: str = ""  # start the adapters from this adapter folder (a checkpoint's model/ or its step_* folder, e.g.
    #   the warm-up stage's), not from B = 0; its r and target_modules must be these

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or isinstance(self.r, bool):
            raise ConfigError(f"lora.r must be an integer >= 0 (0 disables LoRA), got {self.r!r}")
        check_fields(self, "lora")
        self.target_modules = module_names(self.target_modules)
        if self.init and self.r == 0:
            raise ConfigError(f"lora.init ({self.init}) needs lora.r > 0: set lora.r to the r of that adapter")


def module_names(value: Any) -> list[str]:
    """A list of module names from a list or a comma-separated string ('q_proj,v_proj')."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in items) or not items:
        raise ConfigError(f"lora.target_modules must be a non-empty list of module names (e.g. [q_proj, v_proj]), "
                          f"got {value!r}")
    return [x.strip() for x in items]


@dataclass
class CheckpointConfig:
    """How training state is written: "safetensors" (default; rank 0 writes the full state) or "dcp"
    (torch.distributed.checkpoint: each rank writes its shards, in safetensors files; resumable under
    another number of processes). Both also write `model/` (save_pretrained) for inference."""

    format: str = field(default="safetensors", metadata=rule(choices=CHECKPOINT_FORMATS))
    async_save: bool = False  # dcp only: shards written in the background while training goes on

    def __post_init__(self) -> None:
        check_fields(self, "checkpoint")
        if self.async_save and self.format != "dcp":
            raise ConfigError("checkpoint.async_save needs checkpoint.format=dcp")
@dataclass
class TrainConfig:
    """Everything a training run needs; `model` and `data` may be given through the Python API instead."""

    model: str = field(default="", metadata=rule(options="model_options"))  # policy: a local save_pretrained
    #   directory or a Hugging Face id; YAML `model: {path: ID, KEY: ...}` also sets model_options.KEY
    data: DataConfig = field(default_factory=DataConfig)  # the data file (YAML `data: FILE`) and data.max_chunks
    out_dir: str = "runs/train"  # checkpoints, metrics.jsonl, config.json
    seed: int = 0  # one seed for data order, rollouts and dropout; in [0, 2**32) (NumPy's limit)
    total_steps: int = field(default=100, metadata=rule(min=1))  # rollout batches to train on
    save_every: int = field(default=50, metadata=rule(min=0))  # checkpoint every N steps (and always at the
    #   end); 0 = only at the end
    keep_last: int = field(default=2, metadata=rule(min=0))  # checkpoints kept on disk (oldest deleted first);
    #   0 = keep all
    resume: bool = False  # continue from the latest checkpoint in out_dir
    force: bool = False  # write into an out_dir that holds a model or an earlier run (overwriting it)
    dtype: str = field(default="auto", metadata=rule(choices=DTYPES))  # parameters: auto (bf16 on a GPU that has it, else fp32), float32, bfloat16
    device: str = "auto"  # auto, cpu, cuda (with torchrun, each rank uses cuda:LOCAL_RANK)
    strategy: str = field(default="ddp", metadata=rule(choices=STRATEGIES))  # with torchrun: "ddp" (DistributedDataParallel) or "fsdp" (FSDP2 fully_shard)
    tensorboard: bool = False  # also write TensorBoard scalars under out_dir/tb (needs tensorboard)
    progress: bool = True  # rich progress bar on stderr
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(temperature=1.0))  # rollout workflow
    workflow: WorkflowChoice = field(default_factory=WorkflowChoice)  # {name, options}: the reading workflow rolled
    #   out and validated (memagent.agent.registry) and its own options (e.g. lookup's); every conversation of it is
    #   a training row sharing its sample's advantage; "memagent" is the paper's. The older `workflow: NAME` with
    #   `workflow_options: {...}` reads with a deprecation line (memagent.config.workflow_choice_data)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # variables for the chat template of every
    #   rollout and validation prompt (a profile's chat_template_kwargs, e.g. enable_thinking: false), as ask renders
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: str = DEFAULT_REWARD  # the outcome reward of the final answer, by name (memagent.rewards.registry):
    #   "boxed" (the paper's verifier), em, f1, sub_em, ..., judge, or a plug-in's
    reward_options: dict[str, Any] = field(default_factory=dict)  # the outcome reward's own options (the judge's)
    step_reward: str = ""  # NOT in the paper: a step reward of each memory update (evidence, answer-recall,
    #   answer-likelihood, a plug-in's), mixed into the advantages (memagent.rl.step_rewards); "" = none (paper)
    step_reward_options: dict[str, Any] = field(default_factory=dict)  # the step reward's own options
    step_mix: float = field(default=0.8, metadata=rule(min=0, max=1))  # a in A = a * A_outcome + (1 - a) * A_step
    #   on the rows a step reward scores (ReMemR1: 0.8); 1 = the paper's advantages exactly
    step_scale: bool = False  # divide the centred step rewards by their (question, step) std (ReMemR1: no)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    val: ValConfig = field(default_factory=ValConfig)  # periodic validation (val.every, val.samples, val.data)
    log: LogConfig = field(default_factory=LogConfig)  # log.wandb: Weights & Biases beside TensorBoard
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # the vllm / vllm-server rollout engines
    model_options: ModelOptions = field(default_factory=ModelOptions)  # also written model.<field>
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters (peft); r = 0 trains the full model
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # safetensors (rank 0) or dcp (sharded)

    def __post_init__(self) -> None:
        if isinstance(self.data, str):  # TrainConfig(data="file.jsonl") from Python
            self.data = DataConfig(self.data)
        if isinstance(self.seed, int) and not 0 <= self.seed < 2**32:
            raise ConfigError(f"seed must be in [0, 2**32) (NumPy's limit), got {self.seed}")
        check_fields(self)
        if self.rollout.batch_size % self.update.mini_batch_size:
            raise ConfigError(
                f"update.mini_batch_size ({self.update.mini_batch_size}) must divide rollout.batch_size "
                f"({self.rollout.batch_size}); e.g. set update.mini_batch_size="
                f"{largest_divisor(self.rollout.batch_size, self.update.mini_batch_size)}")
        if self.agent.temperature <= 0:
            raise ConfigError("agent.temperature must be > 0 for rollouts (0 is greedy: every rollout of a "
                              "group would be the same); the paper samples at 1.0")
        if isinstance(self.workflow, str):  # TrainConfig(workflow="lookup") from Python: the old spelling
            deprecated(f"TrainConfig(workflow={self.workflow!r}): give WorkflowChoice({self.workflow!r}, options)")
            self.workflow = WorkflowChoice(self.workflow)
        self.reward = reward_fields(self)  # the fields' own rules; the names are looked up by the resolve
        try:
            check_device(self.device, "device")
        except MemAgentError as e:
            raise ConfigError(str(e)) from None

    @cached_property
    def bound_workflow(self) -> BoundWorkflow:
        """The rollout workflow bound to its options (memagent.agent.registry.bind_workflow): looked up and
        checked once, on first use (`build_train_config` and the trainer's set-up), then passed down. ConfigError
        for a workflow that is not known (listing the valid ones) or options it does not take (a run-time setting
        such as trace_path is not one)."""
        try:
            return bind_workflow(self.workflow.name, self.workflow.options)
        except MemAgentError as e:
            raise ConfigError(f"workflow.options: {e}" if isinstance(e, ConfigError) else str(e)) from None

    @property
    def num_mini_batches(self) -> int:
        return self.rollout.batch_size // self.update.mini_batch_size

    @property
    def horizon(self) -> int:
        """The constant of `seq-mean-token-sum-norm`: loss.horizon or the longest possible response."""
        return self.loss.horizon or max(self.agent.memory_tokens, self.agent.answer_tokens)


def reward_fields(cfg: "TrainConfig") -> str:
    """The outcome reward's name (the old `rollout.reward` taken when `reward` is left at its default); a
    ConfigError for options that are not a mapping or step reward options without a step reward. The names are
    not looked up here: `check_reward_names` does, once, where a command resolves its config."""
    reward = cfg.reward
    if cfg.rollout.reward:
        if reward not in (DEFAULT_REWARD, cfg.rollout.reward):
            raise ConfigError(f"reward is {reward!r} but rollout.reward (its old spelling) is {cfg.rollout.reward!r}; "
                              "give the top-level `reward` only")
        reward = cfg.rollout.reward
    for name, value in (("reward_options", cfg.reward_options), ("step_reward_options", cfg.step_reward_options)):
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping of option: value, got {value!r}")
    if cfg.step_reward_options and not cfg.step_reward:
        raise ConfigError(f"step_reward_options {cfg.step_reward_options} are given but no step_reward: name the step "
                          "reward they are for (step_reward=evidence), or leave them out")
    return reward


def check_reward_names(cfg: "TrainConfig") -> "TrainConfig":
    """`cfg`, its outcome and step rewards looked up in the registry (memagent.rewards.registry): a ConfigError
    listing the valid names for an unknown one, or for a step reward's options it refuses (one line). Called once
    per command, by the resolve (`load_config`, `build_train_config`)."""
    try:
        check_reward_name(cfg.reward, "outcome", "reward")
        if cfg.step_reward:
            check_reward_name(cfg.step_reward, "step", "step_reward")
            if cfg.step_reward_options:  # its options as the run will take them (a value it refuses: one line)
                build_reward(cfg.step_reward, "step", **cfg.step_reward_options)
    except MemAgentError as e:  # an unknown name, or a plug-in that failed as it was imported: one line
        raise ConfigError(str(e)) from None
    return cfg


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


# -- loading ----------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, JSON-able dict of a (nested) config dataclass."""
    return to_dict(cfg)


def config_data(path: str | Path | None = None, overrides: list[str] | None = None,
                parsed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The nested mapping of a YAML file of TrainConfig fields (none: {}) with `key=value` overrides applied,
    short spellings written in full (`parsed`: the overrides parsed already, `parse_train_overrides`)."""
    data = workflow_choice_data(config_file_data(TrainConfig, path), str(path)) if path is not None else {}
    return deep_merge(data, parsed if parsed is not None else parse_train_overrides(overrides or []))


def config_file_data(cls: type, path: str | Path | None) -> dict[str, Any]:
    """The nested mapping of a YAML file of `cls` fields (training's, warm-up's; none: {}), short spellings written
    in full; a ConfigError for a file that is missing, a folder, or not a mapping."""
    if path is None:
        return {}
    p, what = Path(path), f"{cls.__name__} fields"
    if not p.is_file():
        raise ConfigError(f"config file {p} {'is a folder' if p.is_dir() else 'does not exist'}; pass a YAML file of "
                          f"{what}")
    return spell_out(cls, load_mapping(read_text(p, "config file", ConfigError), str(p), what))


def parse_train_overrides(overrides: list[str]) -> dict[str, Any]:
    """The nested mapping of TrainConfig `key=value` overrides (the old workflow spellings read)."""
    return workflow_choice_data(parse_overrides(overrides, TrainConfig), "the overrides")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TrainConfig from a YAML file (or the defaults when `path` is None) plus `key=value` overrides, its reward
    names looked up once."""
    return check_reward_names(build(TrainConfig, config_data(path, overrides)))


def build_train_config(path: str | Path | None, overrides: list[str] | None = None, *, resume: bool = False,
                       force: bool = False, profile: Any = None) -> TrainConfig:
    """The TrainConfig of `memagent train`: the YAML file, the `key=value` overrides, --resume and --force, then a
    protocol profile's prompts and budgets in `agent` (a `memagent.protocol.profile.Profile`; explicit `agent.*=...`
    overrides win over it, and the config's own chat_template_kwargs over the profile's). The file and the
    overrides are read once; the reward names are looked up once (`check_reward_names`) and the workflow is bound
    once (`TrainConfig.bound_workflow`), before anything is written."""
    flags = [*(overrides or []), *(["resume=true"] if resume else []), *(["force=true"] if force else [])]
    parsed = parse_train_overrides(flags)
    given = config_data(path, parsed=parsed)  # read once; the reward names it sets win over the profile's
    cfg = build(TrainConfig, given)
    if profile is not None:
        kwargs = cfg.chat_template_kwargs or dict(profile.chat_template_kwargs)
        rewards = {k: v for k, v in profile.training_rewards(cfg.reward, cfg.step_reward).items()
                   if k not in given and not (k == "reward" and "reward" in given.get("rollout", {}))}
        cfg = dataclasses.replace(cfg, agent=profile.training_agent(cfg.agent, set(parsed.get("agent", {}))),
                                  chat_template_kwargs=kwargs, **rewards)
    check_reward_names(cfg)  # the reward names looked up once, on the merged config
    cfg.bound_workflow  # looked up and checked once, before anything is written  # noqa: B018
    return cfg


def check_out_dir(cfg: TrainConfig) -> None:
    """Refuse an out_dir that would destroy an input: the model's folder or any folder holding a model,
    an earlier run's folder without resume, or one whose config.json / metrics.jsonl is the data file.
    `force` writes over a model or a run anyway; checkpoints without resume stay an error (the trainer's)."""
    model = cfg.model if cfg.model and Path(cfg.model).exists() else None
    inputs = {"model": model, "data": cfg.data.path or None}
    out = check_output_dir(cfg.out_dir if cfg.out_dir is not None else "", "out_dir", inputs)  # "" is refused
    for name in ("config.json", "metrics.jsonl"):
        check_not_input(out / name, inputs, f"out_dir (its {name})")
    held = folder_holds(out)
    if held is None or cfg.force:
        return
    if held == "a model":
        raise ConfigError(f"out_dir {out} holds a model (training writes config.json over it); choose another "
                          f"out_dir, or pass force=true (--force) to overwrite it")
    if not cfg.resume and not (out / "checkpoints").exists():
        raise ConfigError(f"out_dir {out} holds an earlier run; pass resume=true (--resume) to continue it, "
                          f"force=true (--force) to start over in it, or choose another out_dir")

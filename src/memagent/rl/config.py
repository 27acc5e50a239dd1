"""Configuration of Multi-Conv DAPO training: one `TrainConfig` with nested sections.

Defaults follow the paper (docs/paper.md, "Multi-Conv DAPO"); each field is documented once, where it
is defined. `load_config(path, overrides)` reads YAML and applies `key=value` overrides (dotted
keys for nested fields, e.g. `loss.clip_high=0.2`); unknown keys are errors.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from memagent.bounded import load_yaml
from memagent.config import AgentConfig, ConfigError
from memagent.errors import MemAgentError
from memagent.io import atomic_write_text, check_not_input, check_output_dir, folder_holds, read_text
from memagent.rl.algos import AGG_MODES, KL_ESTIMATORS
from memagent.rl.config_aliases import canonical_key, canonical_mapping, deep_merge
from memagent.rl.run_options import ATTN_IMPLEMENTATIONS, DataConfig, LogConfig, ModelOptions, ValConfig, VLLMConfig
from memagent.rl.scale_config import CheckpointConfig, LoraConfig


@dataclass
class RolloutConfig:
    """How a rollout batch is sampled (the workflow itself is configured by `TrainConfig.agent`)."""

    batch_size: int = 128  # B questions per rollout batch (paper: 128 for 7B, 256 for 14B)
    group_size: int = 16  # G rollouts per question (paper: 16); advantages need G >= 2
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, sample more
    max_sampling_rounds: int = 3  # with dynamic sampling: rounds of B questions before training on fewer
    engine: str = "policy"  # "policy": generate with the trained model itself; "vllm": a vLLM engine;
    #   "vllm-server": an external vLLM server (see VLLMConfig)
    reward: str = "boxed"  # reward function by name (memagent.tasks.metrics.REWARDS)
    max_batch_size: int = 64  # prompts per generate() call of the policy backend (memory bound)
    seeding: str = "rank"  # "rank" (seeds per rank and batch) or "sample": rank-invariant rollouts (docs/training.md)

    def __post_init__(self) -> None:
        _positive(self, "batch_size", "max_sampling_rounds", "max_batch_size")
        if self.group_size < 2:
            raise ConfigError(f"rollout.group_size must be >= 2 (advantages compare rollouts of one question), "
                              f"got {self.group_size}; the paper uses 16")
        if self.engine not in ("policy", "vllm", "vllm-server"):
            raise ConfigError(f"rollout.engine must be 'policy', 'vllm' or 'vllm-server', got {self.engine!r}")
        if self.seeding not in ("rank", "sample") or (self.seeding == "sample" and self.engine != "policy"):
            raise ConfigError(f"rollout.seeding must be 'rank' or 'sample' (per-row seeded sampling, rollout.engine "
                              f"'policy' only), got {self.seeding!r} with engine {self.engine!r}")


@dataclass
class LossConfig:
    """The Multi-Conv DAPO objective (memagent.rl.algos.policy_loss and kl_penalty)."""

    clip_low: float = 0.2  # eps_low of the clipped ratio (DAPO)
    clip_high: float = 0.28  # eps_high, DAPO's clip-higher (the paper's reference run used 0.2)
    clip_c: float = 3.0  # dual-clip bound for negative advantages
    agg: str = "token-mean"  # aggregation mode (paper: token mean over the whole mini-batch)
    horizon: int | None = None  # constant of seq-mean-token-sum-norm; default: max(memory, answer) tokens
    kl_coef: float = 1e-3  # beta of the KL-to-reference term; 0 skips it and loads no reference
    kl_kind: str = "k3"  # KL estimator (paper: k3, low variance)
    norm_by_std: bool = False  # divide advantages by the group std (GRPO); paper: no (Dr. GRPO)
    # NOT in the paper: an auxiliary supervised loss (InstructGPT's "PPO-ptx" mix) on rows passed as
    # train(..., sft_data=rows), added to each optimiser step's gradient; 0 = pure Multi-Conv DAPO
    sft_coef: float = 0.0
    sft_batch_size: int = 64  # rows of sft_data per optimiser step

    def __post_init__(self) -> None:
        if self.sft_coef < 0 or self.sft_batch_size < 1:
            raise ConfigError(f"loss.sft_coef must be >= 0 and loss.sft_batch_size >= 1; got {self.sft_coef}, "
                              f"{self.sft_batch_size}")
        if not 0 <= self.clip_low < 1:
            raise ConfigError(f"loss.clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < self.clip_low:
            raise ConfigError(f"loss.clip_high ({self.clip_high}) must be >= loss.clip_low ({self.clip_low}); "
                              "clip-higher widens the upper bound (paper: 0.2 / 0.28)")
        if self.clip_c <= 1:
            raise ConfigError(f"loss.clip_c must be > 1 (dual clip bounds ratios above 1), got {self.clip_c}")
        if self.agg not in AGG_MODES:
            raise ConfigError(f"loss.agg {self.agg!r} is unknown; choose one of: {', '.join(AGG_MODES)}")
        if self.kl_kind not in KL_ESTIMATORS:
            raise ConfigError(f"loss.kl_kind {self.kl_kind!r} is unknown; choose one of: {', '.join(KL_ESTIMATORS)}")
        if self.kl_coef < 0:
            raise ConfigError(f"loss.kl_coef must be >= 0 (0 disables the KL term), got {self.kl_coef}")
        if self.horizon is not None and self.horizon <= 0:
            raise ConfigError(f"loss.horizon must be positive, got {self.horizon}")


LR_SCHEDULES = ("constant", "cosine")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up, then a constant learning rate (paper's setting) or a cosine decay."""

    lr: float = 1e-6  # peak (constant) learning rate
    warmup_steps: int = 20  # optimiser steps of linear warm-up from lr / warmup_steps to lr
    schedule: str = "constant"  # after the warm-up: "constant" or "cosine" (to min_lr_ratio * lr at the end)
    min_lr_ratio: float = 0.0  # cosine only: the final learning rate as a fraction of lr
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8  # > 0: AdamW divides by sqrt(v) + eps, and v is 0 for a weight whose gradient is 0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be positive, got {self.lr}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("optim.warmup_steps, optim.weight_decay and optim.grad_clip must be >= 0")
        if self.schedule not in LR_SCHEDULES:
            raise ConfigError(f"optim.schedule {self.schedule!r} is unknown; choose one of: {', '.join(LR_SCHEDULES)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"optim.beta1 and optim.beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if not self.eps > 0:  # eps 0 gives 0/0 = NaN weights at the first step where a gradient entry is 0
            raise ConfigError(f"optim.eps must be > 0 (AdamW divides by sqrt(v) + eps), got {self.eps}; "
                              "use the default 1e-8")


@dataclass
class UpdateConfig:
    """How one rollout batch becomes optimiser steps."""

    mini_batch_size: int = 8  # questions (x G rollouts, all their conversations) per optimiser step;
    #   paper: 16 mini-batches per rollout batch of 128
    epochs: int = 1  # mu: passes over the rollout batch
    micro_batch_size: int = 8  # conversation rows per forward/backward (memory bound, not the math)
    old_logprobs: str = "recompute"  # "recompute" with the policy before the update, or "rollout"
    #   (the sampling-time log-probs; exact only when rollout and training numerics agree)
    packing: bool = False  # padding-free micro-batches of micro_batch_tokens tokens (rows back to back,
    #   memagent.rl.packing) instead of micro_batch_size padded rows; the same gradient
    micro_batch_tokens: int = 16384  # with packing: tokens per forward/backward (a longer row goes alone)

    @property
    def packed_tokens(self) -> int:
        """The token budget of a padding-free micro-batch; 0 for the padded path."""
        return self.micro_batch_tokens if self.packing else 0

    def __post_init__(self) -> None:
        _positive(self, "mini_batch_size", "epochs", "micro_batch_size", "micro_batch_tokens")
        if self.old_logprobs not in ("recompute", "rollout"):
            raise ConfigError(f"update.old_logprobs must be 'recompute' or 'rollout', got {self.old_logprobs!r}")


@dataclass
class TrainConfig:
    """Everything a training run needs; `model` and `data` may be given through the Python API instead."""

    model: str = ""  # policy: a local save_pretrained directory or a Hugging Face id
    data: DataConfig = field(default_factory=DataConfig)  # the data file (YAML `data: FILE`) and data.max_chunks
    out_dir: str = "runs/train"  # checkpoints, metrics.jsonl, config.json
    seed: int = 0  # one seed for data order, rollouts and dropout
    total_steps: int = 100  # rollout batches to train on
    save_every: int = 50  # checkpoint every N steps (and always at the end); 0 = only at the end
    keep_last: int = 2  # checkpoints kept on disk (oldest deleted first); 0 = keep all
    resume: bool = False  # continue from the latest checkpoint in out_dir
    force: bool = False  # write into an out_dir that holds a model or an earlier run (overwriting it)
    dtype: str = "auto"  # parameters: auto (bf16 on a GPU that has it, else fp32), float32, bfloat16
    device: str = "auto"  # auto, cpu, cuda (with torchrun, each rank uses cuda:LOCAL_RANK)
    strategy: str = "ddp"  # with torchrun: "ddp" (DistributedDataParallel) or "fsdp" (FSDP2 fully_shard)
    tensorboard: bool = False  # also write TensorBoard scalars under out_dir/tb (needs tensorboard)
    progress: bool = True  # rich progress bar on stderr
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(temperature=1.0))  # rollout workflow
    workflow: str = "memagent"  # the reading workflow rolled out and validated (memagent.agent.registry): every
    #   conversation of it is a training row sharing its sample's advantage; "memagent" is the paper's
    workflow_options: dict[str, Any] = field(default_factory=dict)  # the workflow's own options (e.g. lookup's)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # variables for the chat template of every
    #   rollout and validation prompt (a profile's chat_template_kwargs, e.g. enable_thinking: false), as ask renders
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    val: ValConfig = field(default_factory=ValConfig)  # periodic validation (val.every, val.samples, val.data)
    log: LogConfig = field(default_factory=LogConfig)  # log.wandb: Weights & Biases beside TensorBoard
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # the vllm / vllm-server rollout engines
    model_options: ModelOptions = field(default_factory=ModelOptions)  # also written model.<field> (load_config)
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters (peft); r = 0 trains the full model
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # safetensors (rank 0) or dcp (sharded)

    def __post_init__(self) -> None:
        if isinstance(self.data, str):  # TrainConfig(data="file.jsonl") from Python
            self.data = DataConfig(self.data)
        _positive(self, "total_steps")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"seed must be in [0, 2**32) (NumPy's limit), got {self.seed}")
        if self.save_every < 0 or self.keep_last < 0:
            raise ConfigError("save_every and keep_last must be >= 0")
        if self.rollout.batch_size % self.update.mini_batch_size:
            raise ConfigError(
                f"update.mini_batch_size ({self.update.mini_batch_size}) must divide rollout.batch_size "
                f"({self.rollout.batch_size}); e.g. set update.mini_batch_size="
                f"{_largest_divisor(self.rollout.batch_size, self.update.mini_batch_size)}")
        if self.agent.temperature <= 0:
            raise ConfigError("agent.temperature must be > 0 for rollouts (0 is greedy: every rollout of a "
                              "group would be the same); the paper samples at 1.0")
        if self.strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"strategy must be 'ddp' or 'fsdp', got {self.strategy!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        _check_workflow(self.workflow, self.workflow_options)
        from memagent.flags import check_device

        try:
            check_device(self.device, "device")
        except MemAgentError as e:
            raise ConfigError(str(e)) from None

    @property
    def num_mini_batches(self) -> int:
        return self.rollout.batch_size // self.update.mini_batch_size

    @property
    def horizon(self) -> int:
        """The constant of `seq-mean-token-sum-norm`: loss.horizon or the longest possible response."""
        return self.loss.horizon or max(self.agent.memory_tokens, self.agent.answer_tokens)


def _check_workflow(name: str, options: Any) -> None:
    """ConfigError for a workflow that is not known (listing the valid ones) or options that are not a mapping."""
    from memagent.agent.registry import get_workflow

    if not isinstance(options, dict):
        raise ConfigError(f"workflow_options must be a mapping of option: value, got {options!r}")
    try:
        get_workflow(name)
    except MemAgentError as e:
        raise ConfigError(str(e)) from None


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}")


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


# -- loading ----------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, JSON-able dict of a (nested) config dataclass."""
    return dataclasses.asdict(cfg)


def config_from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict; unknown keys and wrong types are ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(prefix + k for k in unknown)}; valid keys"
                          f"{' under ' + prefix.rstrip('.') if prefix else ''}: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
            value = deep_merge(config_to_dict(f.default_factory()), value)  # keep the section's own defaults
        kwargs[name] = _coerce(hints[name], value, prefix + name)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{prefix or 'config'}: {e}") from None


class _NotFinite(Exception):
    """A float config value that is NaN or infinite."""


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if isinstance(value, str) and hasattr(tp, "from_str"):  # `data: FILE` for `data: {path: FILE}`
            return tp.from_str(value)
        return config_from_dict(tp, value, key + ".")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key) if len(inner) == 1 else value
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
                return value.lower() in ("true", "yes", "1")
            raise ValueError
        if tp is int:
            if not isinstance(value, (int, float, str)) or isinstance(value, bool) or (
                    isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if not isinstance(value, (int, float, str)) or isinstance(value, bool):
                raise ValueError
            number = float(value)  # also "1e-6", which YAML 1.1 reads as a string
            if not math.isfinite(number):
                raise _NotFinite
            return number
        if tp is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except _NotFinite:
        raise ConfigError(f"{key} must be a finite number, got {value!r}") from None
    except (ValueError, OverflowError):
        raise ConfigError(f"{key} must be {tp.__name__}, got {value!r}") from None
    return value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """['loss.clip_high=0.2', 'seed=3'] -> {'loss': {'clip_high': 0.2}, 'seed': 3} (YAML-typed values;
    short keys such as data=FILE spelled out by memagent.rl.config_aliases)."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value (dotted keys for nested fields, e.g. loss.kl_coef=0)")
        shown = item if len(item) <= 80 else item[:60] + "..."
        value = load_yaml(raw, f"override {shown!r}: the value", ConfigError) if raw.strip() else ""
        if any(not p.strip() for p in key.split(".")):
            raise ConfigError(f"override {item!r}: the key has an empty part; e.g. loss.kl_coef=0")
        node = out
        parts = canonical_key(key.strip().split("."), value)
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {p}")
        node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TrainConfig from a YAML file (or the defaults when `path` is None) plus `key=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} {'is a folder' if p.is_dir() else 'does not exist'}; pass a YAML "
                              "file of TrainConfig fields")
        data = load_yaml(read_text(p, "config file", ConfigError), str(p), ConfigError)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p} must be a YAML mapping of TrainConfig fields (key: value lines), "
                              f"got a {type(data).__name__}")
    data = deep_merge(canonical_mapping(data), parse_overrides(overrides or []))
    return config_from_dict(TrainConfig, data)


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    atomic_write_text(path, json.dumps(config_to_dict(cfg), indent=2) + "\n")


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

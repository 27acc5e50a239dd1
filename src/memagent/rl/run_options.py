"""TrainConfig sections for the data file, validation, experiment logging and the vLLM rollout engines.

Each is one nested section of `memagent.rl.config.TrainConfig` (YAML `data:`, `val:`, `log:`,
`vllm:`); every field is documented where it is defined.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from memagent.config import ConfigError


@dataclass
class DataConfig(os.PathLike):
    """The training data file and how its contexts are cut. YAML `data: FILE` is short for
    `data: {path: FILE}`; the section is path-like (`open(cfg.data)`, `Path(cfg.data)`, `if cfg.data`)."""

    path: str = ""  # JSONL of samples {id, question, answers, context} (for the CLI)
    max_chunks: int = 0  # cut each training context to at most N chunks of agent.chunk_tokens by
    #   removing its middle (the official training caps contexts at 8 chunks); 0 = no cap

    def __post_init__(self) -> None:
        if not isinstance(self.max_chunks, int) or isinstance(self.max_chunks, bool) or self.max_chunks < 0:
            raise ConfigError(f"data.max_chunks must be an integer >= 0 (0 = no cap), got {self.max_chunks!r}")

    @classmethod
    def from_str(cls, path: str) -> "DataConfig":
        return cls(path=path)

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
    every: int = 0  # validate after steps every, 2 * every, ...; 0 = never
    samples: int = 0  # the first N samples of the file; 0 = all of them

    def __post_init__(self) -> None:
        for name in ("every", "samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"val.{name} must be an integer >= 0, got {value!r}")
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

    gpu_memory_utilization: float = 0.3  # in-process engine: its share of the GPU (training holds the rest)
    sleep: bool = False  # in-process engine: sleep (level 1) during the update, freeing its GPU memory
    sync_chunk_mb: int = 512  # weights pushed per call (collective_rpc / broadcast bucket), in MiB
    server_url: str = ""  # vllm-server: the server's base URL, e.g. http://gpu7:8000 (its /v1 generates)
    nccl_host: str = ""  # vllm-server: this trainer's address as the server's workers reach it
    nccl_port: int = 51216  # vllm-server: the port of the weight-broadcast rendezvous (on nccl_host)
    timeout: float = 600.0  # vllm-server: seconds for one HTTP request (generation or weight update)

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"vllm.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.sync_chunk_mb < 1 or not 0 < self.nccl_port < 65536 or self.timeout <= 0:
            raise ConfigError("vllm.sync_chunk_mb must be >= 1, vllm.nccl_port in 1..65535 and vllm.timeout > 0")

ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2", "varlen")


@dataclass
class ModelOptions:
    """Memory settings of the trained model, written `model.<field>` (`model` itself stays the path or id)."""

    gradient_checkpointing: bool = False  # recompute each decoder layer's activations in the backward pass
    cpu_offload: bool = False  # strategy fsdp: parameters, gradients, optimiser state on the CPU (CPUOffloadPolicy)
    attn_implementation: str = "auto"  # auto: flash_attention_2 on CUDA when flash-attn is installed, else
    #   transformers' default, switched to varlen under update.packing; or eager, sdpa, flash_attention_2,
    #   varlen (per-row sdpa for packed micro-batches, memagent.rl.varlen)

    def __post_init__(self) -> None:
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(f"model.attn_implementation {self.attn_implementation!r} is unknown; choose one of: "
                              f"{', '.join(ATTN_IMPLEMENTATIONS)}")

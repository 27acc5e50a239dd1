"""Configuration of training at scale that sits beside `TrainConfig`: LoRA adapters and checkpoint format."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memagent.config import ConfigError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CHECKPOINT_FORMATS = ("safetensors", "dcp")


@dataclass
class LoraConfig:
    """LoRA through peft (`pip install 'memagent[lora]'`); r = 0 trains the full model.

    With r > 0 only the adapters train; the KL reference is the base model with the adapters
    disabled (no second copy); checkpoints hold the adapters (`memagent merge-lora` merges them).
    """

    r: int = 0  # adapter rank; 0 disables LoRA
    alpha: float = 16.0  # scaling: the update is (alpha / r) * B @ A
    dropout: float = 0.0  # dropout on the adapters' input
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # linear layers' names

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 0:
            raise ConfigError(f"lora.r must be an integer >= 0 (0 disables LoRA), got {self.r!r}")
        if self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.alpha must be > 0 and lora.dropout in [0, 1); got {self.alpha}, {self.dropout}")
        self.target_modules = _names(self.target_modules)


def _names(value: Any) -> list[str]:
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

    format: str = "safetensors"
    async_save: bool = False  # dcp only: shards written in the background while training goes on

    def __post_init__(self) -> None:
        if self.format not in CHECKPOINT_FORMATS:
            raise ConfigError(f"checkpoint.format {self.format!r} is unknown; choose one of: "
                              f"{', '.join(CHECKPOINT_FORMATS)}")
        if self.async_save and self.format != "dcp":
            raise ConfigError("checkpoint.async_save needs checkpoint.format=dcp")

"""The errors of training checkpoints (a leaf module: the checkpoint formats all raise them)."""
from __future__ import annotations

from memagent.config import ConfigError
from memagent.errors import MemAgentError


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete or does not fit the run; the message says what to do.

    A ConfigError, so the CLI reports it as one line (resuming is a configuration choice).
    """


class TrainOutputError(MemAgentError):
    """A training run cannot write its files (disk full, file too large, read-only folder)."""

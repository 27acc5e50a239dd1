"""The one Protocol every model backend implements, and the records it returns.

A backend turns a batch of user messages into generations. It owns how a message becomes
model input (the model's chat template, or the raw text when the model has none) and exposes
the tokenizer the workflow uses for chunking and budgets.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from memagent.errors import MemAgentError


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch. `temperature == 0` means greedy decoding."""

    max_new_tokens: int
    temperature: float = 0.0  # paper rollouts: 1.0; evaluation: greedy
    top_p: float = 1.0
    seed: int | None = None  # a seeded batch gives the same samples on the same backend
    # one seed per prompt of the batch: prompt i's draws depend on seeds[i] alone, not on its batch neighbours;
    # honoured by the transformers backend (backends/row_sampling.py), other backends go by `seed`
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Generation:
    """One generated reply.

    token_ids: the generated token ids, the terminating EOS included when generation stopped
        on it (the trainer must learn to stop); `text` never contains it  # [T_out]
    logprobs: log-prob of each generated token under the sampling distribution, or None
        when the backend cannot give them  # [T_out]
    prompt_token_ids: the exact ids the model was conditioned on, or None  # [T_in]
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str = "stop"  # "stop" (EOS or stop string) or "length" (hit max_new_tokens)
    # speculative decoding (--speculate): draft tokens proposed for this reply and how many the model kept;
    # None when the reply was decoded without speculation or the backend does not report them
    draft_proposed: int | None = None
    draft_accepted: int | None = None


@runtime_checkable
class Backend(Protocol):
    """A batch of user messages in, one Generation per message out, in order.

    `tokenizer` is a Hugging Face tokenizer of the model (used for chunking and budgets);
    `max_window` is the model's context length in tokens, or None when unknown.
    """

    tokenizer: Any
    max_window: int | None

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]: ...

    def prompt_length(self, prompt: str) -> int:
        """Number of tokens `prompt` occupies once rendered for the model (chat template included)."""
        ...


@runtime_checkable
class ConcurrentBackend(Backend, Protocol):
    """A backend that takes single requests concurrently (HTTP): `submit` returns at once."""
    max_concurrency: int  # requests it may have in flight
    def submit(self, prompt: str, params: SamplingParams) -> "concurrent.futures.Future[Generation]": ...


class BackendError(MemAgentError, RuntimeError):
    """A backend failed in a way the user must act on (server down, model missing, ...)."""

"""A scriptable backend for tests: records every prompt and replies with what `reply` returns."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from memagent.backends.base import Generation, SamplingParams


class ScriptedBackend:
    """Backend Protocol over a real tokenizer; `reply(prompt, call_index) -> str`."""

    def __init__(self, tokenizer: Any, reply: Callable[[str, int], str], max_window: int | None = None,
                 record: bool = True):
        self.tokenizer = tokenizer
        self.reply = reply
        self.max_window = max_window
        self.record = record  # keep every prompt (off for memory measurements)
        self.batches: list[list[str]] = []
        self.params: list[SamplingParams] = []

    def prompt_length(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        self.batches.append(list(prompts) if self.record else [])
        self.params.append(params)
        out = []
        for p in prompts:
            text = self.reply(p, len(self.batches) - 1)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text=text, token_ids=ids, logprobs=None,
                                  prompt_token_ids=self.tokenizer(p, add_special_tokens=False)["input_ids"]))
        return out

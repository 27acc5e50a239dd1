"""How one user message becomes model input, shared by the backends that render prompts locally.

A prompt goes through the tokenizer's chat template (as a single user turn, with the generation
prompt) when the model has one, else it is used as raw text. Every backend that renders prompts locally
(`transformers`, `openai`, `vllm`) and every trainer that builds model input uses `render_prompt`.
"""
from __future__ import annotations

from typing import Any

from memagent.backends.base import BackendError


def resolve_chat_template(tokenizer: Any, use_chat_template: bool | str) -> bool:
    """"auto": use the chat template when the tokenizer has one; True: require one; False: raw text."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template == "auto":
        return has_template
    if use_chat_template not in (True, False):
        raise BackendError(f"use_chat_template must be 'auto', True or False, got {use_chat_template!r}")
    if use_chat_template and not has_template:
        raise BackendError("use_chat_template=True but the tokenizer has no chat template; "
                           "pass use_chat_template=False to send raw text")
    return bool(use_chat_template)


def render_prompt(tokenizer: Any, prompt: str, use_chat_template: bool,
                  chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The text the model reads for `prompt`: one user turn in the chat template, or `prompt` itself.

    chat_template_kwargs: extra variables for the template, e.g. {"enable_thinking": False} for Qwen3.
    """
    if not use_chat_template:
        return prompt
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
        **(chat_template_kwargs or {}),
    )


def encode_prompt(tokenizer: Any, prompt: str, use_chat_template: bool,
                  chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the rendered prompt; the chat template carries its own special tokens."""  # [T_in]
    text = render_prompt(tokenizer, prompt, use_chat_template, chat_template_kwargs)
    return tokenizer(text, add_special_tokens=not use_chat_template)["input_ids"]

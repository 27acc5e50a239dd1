"""How one user message becomes model input, shared by the backends that render prompts locally.

A prompt goes through the tokenizer's chat template (as a single user turn, with the generation
prompt) when the model has one, else it is used as raw text. Every backend that renders prompts locally
(`transformers`, `openai`, `vllm`) and every trainer that builds model input uses `render_prompt`.

A template is model-supplied code: `resolve_chat_template` renders it once on a probe conversation when a
backend starts (`probe_chat_template`), within a time and size bound, so a syntax error, a `raise_exception`
or a runaway loop is one clear error at load, not a traceback at the first document.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from memagent.backends.base import BackendError


PROBE_SECONDS = 10.0  # a real template renders a one-turn conversation in milliseconds
PROBE_MAX_CHARS = 1_000_000  # ... into a few hundred characters


def resolve_chat_template(tokenizer: Any, use_chat_template: bool | str,
                          chat_template_kwargs: dict[str, Any] | None = None) -> bool:
    """"auto": use the chat template when the tokenizer has one; True: require one; False: raw text.

    A template that will be used is rendered once on a probe conversation first (`probe_chat_template`)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template == "auto":
        use = has_template
    elif use_chat_template not in (True, False):
        raise BackendError(f"use_chat_template must be 'auto', True or False, got {use_chat_template!r}")
    elif use_chat_template and not has_template:
        raise BackendError("use_chat_template=True but the tokenizer has no chat template; "
                           "pass use_chat_template=False to send raw text")
    else:
        use = bool(use_chat_template)
    if use:
        probe_chat_template(tokenizer, chat_template_kwargs)
    return use


def probe_chat_template(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The probe conversation rendered by the tokenizer's template, within PROBE_SECONDS and PROBE_MAX_CHARS.

    The time bound is a SIGALRM timer, so it holds only in the main thread (where every command loads its
    model); elsewhere the size bound alone applies."""
    with _time_bound(PROBE_SECONDS):
        text = render_prompt(tokenizer, "What is the probe question?", True, chat_template_kwargs)
    if not isinstance(text, str) or len(text) > PROBE_MAX_CHARS:
        size = len(text) if isinstance(text, str) else type(text).__name__
        raise BackendError(f"the model's chat template renders a one-line question into {size} characters "
                           f"(more than {PROBE_MAX_CHARS:,}); fix chat_template.jinja or pass "
                           "use_chat_template=False")
    return text


class _TemplateTimeout(Exception):
    pass


@contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise _TemplateTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _TemplateTimeout:
        raise BackendError(f"the model's chat template did not render a one-line question in {seconds:g} s "
                           "(a runaway loop?); fix chat_template.jinja or pass use_chat_template=False") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def render_prompt(tokenizer: Any, prompt: str, use_chat_template: bool,
                  chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The text the model reads for `prompt`: one user turn in the chat template, or `prompt` itself.

    chat_template_kwargs: extra variables for the template, e.g. {"enable_thinking": False} for Qwen3.
    """
    if not use_chat_template:
        return prompt
    try:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
            **(chat_template_kwargs or {}),
        )
    except _TemplateTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - the template is the model's code: jinja syntax, raise_exception, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BackendError(f"the model's chat template failed to render a prompt ({type(e).__name__}: {first}); "
                           "fix chat_template.jinja (or the profile's chat_template_kwargs) or pass "
                           "use_chat_template=False") from None


def encode_prompt(tokenizer: Any, prompt: str, use_chat_template: bool,
                  chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the rendered prompt; the chat template carries its own special tokens."""  # [T_in]
    text = render_prompt(tokenizer, prompt, use_chat_template, chat_template_kwargs)
    return tokenizer(text, add_special_tokens=not use_chat_template)["input_ids"]

"""One backend shared by the job threads, and a per-job view of it that counts the job's calls.

Hugging Face fast tokenizers are not safe to call from several threads at once (a batch call with
padding can fail with "Already borrowed" while another thread encodes), so every tokenizer call
goes through one lock; `serialize=True` also runs one `generate` at a time (a local model), while
an HTTP backend (openai) or a simulated one can overlap calls.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from memagent.backends.base import Backend, Generation, SamplingParams
from memagent.serve.errors import JobCancelled


class _LockedTokenizer:
    """The tokenizer, with `__call__`, `encode` and `decode` under a lock; other attributes as they are."""

    def __init__(self, tokenizer: Any, lock: threading.RLock) -> None:
        self._tok, self._lock = tokenizer, lock

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._tok(*args, **kwargs)

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._tok.encode(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._tok.decode(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


class SharedBackend:
    """`backend` made safe to share between threads; `on_call(n_prompts, seconds)` after each batch."""

    def __init__(self, backend: Backend, serialize: bool = True,
                 on_call: Callable[[int, float], None] | None = None) -> None:
        self.inner = backend
        self._tok_lock = threading.RLock()
        self._gen_lock = threading.Lock() if serialize else None
        self.tokenizer = _LockedTokenizer(backend.tokenizer, self._tok_lock)
        self.max_window = backend.max_window
        self.on_call = on_call

    def prompt_length(self, prompt: str) -> int:
        with self._tok_lock:
            return self.inner.prompt_length(prompt)

    def redact(self, text: str) -> str:
        """`text` without the backend's secrets (the openai backend's API key; memagent.backends.openai_http.redact),
        for job errors and chat error replies that reach HTTP clients."""
        inner = getattr(self.inner, "redact", None)
        return inner(text) if inner is not None else text

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        t0 = time.perf_counter()
        if self._gen_lock is None:
            out = self.inner.generate(prompts, params)
        else:
            with self._gen_lock, self._tok_lock:
                out = self.inner.generate(prompts, params)
        if self.on_call is not None:
            self.on_call(len(prompts), time.perf_counter() - t0)
        return out


class JobBackend:
    """A view of the shared backend that counts one job's calls and tokens, and stops a cancelled job."""

    def __init__(self, shared: SharedBackend, on_usage: Callable[[int, int, int], None],
                 cancelled: Callable[[], bool]) -> None:
        self.shared = shared
        self.tokenizer = shared.tokenizer
        self.max_window = shared.max_window
        self.on_usage = on_usage  # (calls, prompt tokens, completion tokens)
        self.cancelled = cancelled

    def prompt_length(self, prompt: str) -> int:
        return self.shared.prompt_length(prompt)

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        if self.cancelled():
            raise JobCancelled()
        out = self.shared.generate(prompts, params)
        n_prompt = sum(len(g.prompt_token_ids) if g.prompt_token_ids is not None else self.prompt_length(p)
                       for g, p in zip(out, prompts))
        self.on_usage(len(prompts), n_prompt, sum(len(g.token_ids) for g in out))
        return out

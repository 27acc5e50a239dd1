"""Model backends behind one Protocol (`memagent.backends.base.Backend`).

`load_backend(name, ...)` builds one by name; heavy imports happen only for the backend chosen.
"""
from __future__ import annotations

from typing import Any

from memagent.backends.base import Backend, BackendError, Generation, SamplingParams
from memagent.backends.vllm import VLLMBackend  # the engine itself is imported when one is built

BACKENDS = ("transformers", "openai", "vllm")


def load_backend(name: str, model: str, **kwargs: Any) -> Backend:
    """Build the backend `name` for `model` (a Hugging Face id, a local path, or a served model name)."""
    if name == "transformers":
        from memagent.backends.hf import TransformersBackend  # lazy: torch

        return TransformersBackend.from_pretrained(model, **kwargs)
    if name == "openai":
        from memagent.backends.openai import OpenAIBackend  # lazy: httpx

        return OpenAIBackend(model=model, **kwargs)
    if name == "vllm":
        return VLLMBackend(model=model, **kwargs)
    raise BackendError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "BackendError", "Generation", "SamplingParams", "load_backend"]

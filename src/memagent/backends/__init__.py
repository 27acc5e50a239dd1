"""Model backends behind one Protocol (`memagent.backends.base.Backend`).

`load_backend(name, model, **kwargs)` builds one by name: a built-in (transformers, openai, vllm), one registered
in this process (`register_backend`), or a package's entry point in the group `memagent.backends`
(`[project.entry-points."memagent.backends"] mine = "pkg.mod:MyBackend"`), as workflows and rewards are found.
A backend's factory is called as `factory(model, **kwargs)` and returns a Backend; heavy imports happen only for
the backend chosen (built-ins are named by "module:attribute" and imported when asked for). A plug-in's backend
(a factory defined outside memagent) is built and used behind memagent.backends.guard: what it raises is one
BackendError naming it, what it returns is checked (types, sizes, one reply per prompt) before memagent uses it.
"""
from __future__ import annotations

from typing import Any, Callable

from memagent.backends.base import Backend, BackendError, Generation, SamplingParams
from memagent.backends.guard import build_guarded
from memagent.plugins import Registry, is_plugin

BackendFactory = Callable[..., Backend]  # factory(model, **kwargs) -> Backend
ENTRY_POINT_GROUP = "memagent.backends"

# name -> "module:attribute", imported on first use (torch, httpx and vllm load only for the backend chosen)
BUILTINS: dict[str, str] = {
    "transformers": "memagent.backends.hf:TransformersBackend.from_pretrained",
    "openai": "memagent.backends.openai:OpenAIBackend",
    "vllm": "memagent.backends.vllm:VLLMBackend",  # the engine itself is imported when one is built
}
BACKENDS = tuple(BUILTINS)


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make `factory` the backend called `name` in this process (it replaces a built-in or entry point of that
    name): `memagent ask --backend NAME` and every other command then build it."""
    _REGISTRY.register(name, factory)


def unregister_backend(name: str) -> None:
    """Forget a backend registered with `register_backend` (built-ins and entry points stay)."""
    _REGISTRY.unregister(name)


def backend_names() -> list[str]:
    """Every backend name known: built-ins first, then registered ones and installed entry points (sorted)."""
    more = (set(_REGISTRY.factories) | set(_REGISTRY.installed())) - set(BUILTINS)
    return [*BUILTINS, *sorted(more)]


_REGISTRY = Registry(ENTRY_POINT_GROUP, "backend", BUILTINS, backend_names, BackendError, BackendError)


def get_backend(name: str) -> BackendFactory:
    """The factory of backend `name`; BackendError naming the known ones when there is none (memagent.plugins)."""
    return _REGISTRY.get(name)


def load_backend(name: str, model: str, **kwargs: Any) -> Backend:
    """Build the backend `name` for `model` (a Hugging Face id, a local path, or a served model name); a plug-in's
    behind memagent.backends.guard."""
    factory = get_backend(name)
    if is_plugin(factory):
        return build_guarded(name, factory, model, **kwargs)
    return factory(model, **kwargs)


__all__ = ["BACKENDS", "Backend", "BackendError", "Generation", "SamplingParams", "backend_names", "get_backend",
           "load_backend", "register_backend", "unregister_backend"]

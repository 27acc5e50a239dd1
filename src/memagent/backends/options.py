"""How a command builds its backend: one options type shared by `memagent ask`, `eval` and `serve`."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from memagent import backends
from memagent.backends.base import Backend
from memagent.backends.replicas import split_base_urls
from memagent.backends.speculate import SPECULATE, vllm_speculative_config
from memagent.errors import InputError
from memagent.config import rule
from memagent.flags import DTYPES, check_device, flag, flag_values

log = logging.getLogger(__name__)


def check_backend(name: str, flag: str = "--backend") -> None:
    """A built-in backend, one registered in this process or an installed `memagent.backends` entry point."""
    known = backends.backend_names()
    if name not in known:
        raise InputError(f"{flag} must be one of {', '.join(known)}; got {name!r}")


def _base_url(text: Optional[str], flag: str) -> Optional[str]:
    """--base-url as given, once each of its URLs parses (a port in 1..65535, a well-formed [IPv6] literal):
    refused when the command line is read, not when the first request is built."""
    if text is not None:
        split_base_urls(text)
    return text


@dataclass
class BackendOptions:
    """The backend and its options (one field per command-line option, plus two a profile sets: use
    `memagent.protocol.profile.open_backend` to load one with them).

    An option that belongs to another backend than the chosen one is an error, not ignored.
    """

    name: str = field(default="transformers", metadata={"check": check_backend, **flag(
        "transformers | openai | vllm, or a plug-in's name (entry-point group memagent.backends)", "--backend")})
    base_url: Optional[str] = field(default=None, metadata=flag(
        "openai backend: server URL, e.g. http://localhost:8000/v1; replicas of one server as URL1,URL2,... "
        "(each request goes to the least loaded; a failing one is rested)", parse=_base_url))
    tokenizer: Optional[str] = field(default=None, metadata=flag(
        "openai (and vllm) backend: the served model's tokenizer for chunking (HF id or path); default the model "
        "name."))
    device: str = field(default="auto", metadata={"check": check_device, **flag(
        "transformers backend: auto | cpu | cuda | mps")})
    dtype: str = field(default="auto", metadata={**rule(choices=DTYPES), **flag(
        "transformers / vllm backend: auto | float32 | bfloat16 | float16")})
    tensor_parallel: int = field(default=1, metadata={**rule(min=1), **flag(
        "vllm backend: tensor-parallel size (GPUs).")})
    kv_cache_gib: Optional[float] = field(default=None, metadata={**rule(above=0), **flag(
        "vllm backend: the KV cache in GiB (default on CPU 2, refused over the RAM available; on a GPU what "
        "--gpu-memory-utilization leaves).")})
    gpu_memory_utilization: Optional[float] = field(default=None, metadata={**rule(above=0, max=1), **flag(
        "vllm backend on a GPU: the share of GPU memory vLLM takes (default vLLM's, 0.9).")})
    enforce_eager: bool = field(default=False, metadata=flag(
        "vllm backend: no torch.compile or CUDA graphs: a faster start (about 1 min instead of 3 on 2 CPU cores), "
        "slower decoding on a GPU.", "--enforce-eager/--no-enforce-eager"))
    max_concurrency: int = field(default=8, metadata={**rule(min=1), **flag(
        "openai backend: requests in flight at once.")})
    request_timeout: float = field(default=600.0, metadata={**rule(above=0), **flag(
        "openai backend: seconds one try may take in all (connect, send, every byte of the reply).")})
    max_retries: int = field(default=4, metadata={**rule(min=0), **flag(
        "openai backend: retries on 5xx, 429, timeouts and refused connections.")})
    speculate: Optional[str] = field(default=None, metadata={**rule(choices=SPECULATE), **flag(
        "transformers / vllm backend: speculative decoding, none | ngram (prompt lookup: drafts copied from the "
        "prompt, verified in one forward pass; greedy output unchanged) (default: the profile's, none).")})
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # from the profile
    yarn_factor: float | None = None  # from the profile: YaRN rope scaling (transformers, vllm)

    def __post_init__(self) -> None:
        """Refuse speculation with a backend that cannot do it when the options are read, before any call."""
        if self.name in ("transformers", "vllm") or self.speculate in (None, "none"):
            return
        if self.name == "openai":
            raise InputError(f"--speculate {self.speculate} (or a profile's speculate: {self.speculate}) is for "
                             "--backend transformers or vllm; the openai backend's server decodes as it was started "
                             "(e.g. vllm serve --speculative-config '{\"method\": \"ngram\", ...}')")
        raise InputError(f"--speculate is for --backend transformers or vllm, not {self.name}")  # a plug-in

    def flags(self) -> dict[str, Any]:
        """The command-line options these came from ({parameter name: value}, `backend` for `name`)."""
        return flag_values(self)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `load_backend` for the chosen backend."""
        defaults = BackendOptions()
        if self.name != "openai" and self.base_url is not None:
            raise InputError(f"--base-url is for --backend openai, not {self.name}")
        for name in ("tensor_parallel", "kv_cache_gib", "gpu_memory_utilization", "enforce_eager"):
            if self.name != "vllm" and getattr(self, name) != getattr(defaults, name):
                raise InputError(f"--{name.replace('_', '-')} is for --backend vllm, not {self.name}")
        if self.name not in ("openai", "vllm") and self.tokenizer is not None:
            own = "; transformers uses the model's own" if self.name == "transformers" else f", not {self.name}"
            raise InputError(f"--tokenizer is for --backend openai or vllm{own}")
        ctk = dict(chat_template_kwargs=dict(self.chat_template_kwargs)) if self.chat_template_kwargs else {}
        yarn = dict(yarn_factor=self.yarn_factor) if self.yarn_factor is not None else {}
        speculate = self.speculate or "none"
        if self.name == "transformers":
            spec = dict(speculate=speculate) if speculate != "none" else {}
            return dict(device=self.device, dtype=self.dtype, **ctk, **yarn, **spec)
        if self.name == "openai":
            if self.yarn_factor is not None:
                log.warning("yarn_factor %s is not applied by the openai backend: start the server with the "
                            "rope scaling (vllm serve --hf-overrides, see docs/reproducing.md)", self.yarn_factor)
            return dict(base_url=self.base_url, tokenizer=self.tokenizer, max_concurrency=self.max_concurrency,
                        timeout=self.request_timeout, max_retries=self.max_retries, **ctk)
        if self.name == "vllm":
            kw: dict[str, Any] = dict(tensor_parallel_size=self.tensor_parallel, dtype=self.dtype, **ctk, **yarn)
            memory = dict(kv_cache_gib=self.kv_cache_gib, gpu_memory_utilization=self.gpu_memory_utilization)
            kw.update({k: v for k, v in memory.items() if v is not None})
            if self.enforce_eager:
                kw["enforce_eager"] = True
            if speculate != "none":
                kw["speculative_config"] = vllm_speculative_config(speculate)  # vllm.LLM(speculative_config=...)
            if self.tokenizer is not None:
                kw["tokenizer"] = self.tokenizer  # vllm.LLM(tokenizer=...)
            return kw
        return dict(**ctk, **yarn)  # a plug-in backend: the profile's chat template arguments and YaRN factor

    def load(self, model: str) -> Backend:
        """The backend for `model` (a Hugging Face id, a local path, or a served model name)."""
        return backends.load_backend(self.name, model, **self.kwargs())  # looked up when called (tests replace it)

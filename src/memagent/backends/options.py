"""How a command builds its backend: one options type shared by `memagent ask` and `memagent eval`."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from memagent.backends.base import Backend
from memagent.errors import InputError

log = logging.getLogger(__name__)


@dataclass
class BackendOptions:
    """The backend and its options (one field per command-line option, plus two a profile sets).

    An option that belongs to another backend than the chosen one is an error, not ignored.
    """

    name: str = "transformers"  # transformers | openai | vllm
    base_url: str | None = None  # openai: the server's URL
    tokenizer: str | None = None  # openai, vllm: the served model's tokenizer (HF id or path)
    device: str = "auto"  # transformers: auto | cpu | cuda | mps
    dtype: str = "auto"  # transformers, vllm: auto | float32 | bfloat16 | float16
    tensor_parallel: int = 1  # vllm: GPUs the model is split over
    max_concurrency: int = 8  # openai: requests in flight at once
    request_timeout: float = 600.0  # openai: seconds one try may take in all
    max_retries: int = 4  # openai: retries on 5xx, 429, timeouts and refused connections
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # from the profile
    yarn_factor: float | None = None  # from the profile: YaRN rope scaling (transformers, vllm)

    def flags(self) -> dict[str, Any]:
        """The command-line options these came from ({parameter name: value}, `--backend` for `name`), for
        `memagent.flags.check_flags`."""
        values = {f: getattr(self, f) for f in ("base_url", "tokenizer", "device", "dtype", "tensor_parallel",
                                                  "max_concurrency", "request_timeout", "max_retries")}
        return dict(backend=self.name, **values)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `load_backend` for the chosen backend."""
        defaults = BackendOptions()
        if self.name != "openai" and self.base_url is not None:
            raise InputError(f"--base-url is for --backend openai, not {self.name}")
        if self.name != "vllm" and self.tensor_parallel != defaults.tensor_parallel:
            raise InputError(f"--tensor-parallel is for --backend vllm, not {self.name}")
        ctk = dict(chat_template_kwargs=dict(self.chat_template_kwargs)) if self.chat_template_kwargs else {}
        yarn = dict(yarn_factor=self.yarn_factor) if self.yarn_factor is not None else {}
        if self.name == "transformers":
            if self.tokenizer is not None:
                raise InputError("--tokenizer is for --backend openai or vllm; transformers uses the model's own")
            return dict(device=self.device, dtype=self.dtype, **ctk, **yarn)
        if self.name == "openai":
            if self.yarn_factor is not None:
                log.warning("yarn_factor %s is not applied by the openai backend: start the server with the "
                            "rope scaling (vllm serve --hf-overrides, see docs/reproducing.md)", self.yarn_factor)
            return dict(base_url=self.base_url, tokenizer=self.tokenizer, max_concurrency=self.max_concurrency,
                        timeout=self.request_timeout, max_retries=self.max_retries, **ctk)
        if self.name == "vllm":
            kw: dict[str, Any] = dict(tensor_parallel_size=self.tensor_parallel, dtype=self.dtype, **ctk, **yarn)
            if self.tokenizer is not None:
                kw["tokenizer"] = self.tokenizer  # vllm.LLM(tokenizer=...)
            return kw
        return {}

    def load(self, model: str) -> Backend:
        """The backend for `model` (a Hugging Face id, a local path, or a served model name)."""
        from memagent.backends import load_backend

        return load_backend(self.name, model, **self.kwargs())

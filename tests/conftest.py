"""Shared fixtures: the tiny tokenizer and model are built once per test session, locally."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from memagent.backends.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    from memagent.backends.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0, tokenizer=tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_dir):
    from memagent.backends.hf import TransformersBackend

    return TransformersBackend.from_pretrained(tiny_model_dir, device="cpu", dtype="float32")

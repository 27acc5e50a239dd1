"""Shared fixtures: the tiny model (built once per session) and a loopback OpenAI-shaped server."""
from __future__ import annotations

import socket

import pytest

from fake_openai_server import FakeOpenAIServer
from memagent.backends.hf import TransformersBackend
from memagent.backends.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_dir):
    return TransformersBackend.from_pretrained(tiny_model_dir, device="cpu", dtype="float32")


@pytest.fixture
def openai_server(tiny_backend):
    """A fresh server (no faults, zeroed counters) over the session's tiny model, on a free port."""
    server = FakeOpenAIServer(tiny_backend).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def refused_url():
    """A loopback URL on which nothing listens (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"

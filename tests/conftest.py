"""Shared fixtures: the tiny tokenizer and model (built once per session, locally) and a loopback
OpenAI-shaped server."""
from __future__ import annotations

import os
import socket
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network

from fake_openai_server import FakeOpenAIServer  # noqa: E402
from qa_fixtures import hotpot_file, hotpot_large_file, squad_file, tokenizer  # noqa: E402, F401  (data tests)


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


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `memagent ARGS...` in-process through `memagent.cli.main`: (exit code, stdout, stderr)."""
    from memagent.cli import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["memagent", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(scope="session")
def real_model_dir(request):
    """SmolLM2-135M-Instruct as an ordinary model folder, converted from its GGUF once (tests/real_model.py)."""
    from real_model import require_real_gguf

    from memagent.backends.gguf import cached_import

    gguf = require_real_gguf()
    root = request.config.cache.mkdir("memagent-real-model")  # persists between sessions; keyed by sha256 inside
    return cached_import(gguf, root=root, progress=lambda _msg: None)


@pytest.fixture(scope="session")
def real_backend(real_model_dir):
    """The real model in process (greedy decoding is deterministic on one thread count)."""
    from memagent.backends.hf import TransformersBackend

    return TransformersBackend.from_pretrained(real_model_dir, device="cpu", dtype="float32")

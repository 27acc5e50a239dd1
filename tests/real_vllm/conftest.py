"""The real vLLM for CPU (vllm-cpu, in .venv-vllm: `make vllm-env`), driven by the real model (SmolLM2-135M-Instruct,
tests/real_model.py). In the project's .venv, which has no vLLM, this folder is not collected; `make test` runs it
in .venv-vllm after the main suite (tests/real_vllm/run), `make test-vllm` runs only it.

Every engine here runs float32 (vLLM's `auto` is bfloat16 on CPU; the transformers backend is float32 there), eager
(--enforce-eager: ~1 min to start), with a 0.5 GiB KV cache (each takes ~3-4 GB of RSS).

tests/real_vllm/run starts two pytest processes side by side, one a core: test_2_server.py in one,
test_1_in_process.py then test_3_rl.py in the other; at most two engines are up at once. vLLM's CPU worker pins
its threads to the first core not kept for its scheduler (VLLM_CPU_OMP_THREADS_BIND=auto), the same core for every
engine on the machine; here it is `nobind` (one thread, OMP_NUM_THREADS=1, placed by the OS), so two engines use
two cores. A value set outside is kept.
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("vllm") is None:  # the project's .venv: nothing here can run
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # read by every engine started from here (docstring)

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


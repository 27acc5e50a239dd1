"""`memagent ask` with a real pretrained model (SmolLM2-135M-Instruct, tests/real_model.py) over real essays, in
process and through `transformers serve` (a real OpenAI-compatible server nobody here wrote), greedy.

What a real model exercises that the tiny ones do not: a real BPE tokenizer and chat template taken from the model
file, free-text memories cut at M tokens mid-sentence (finish reason "length" recorded as a cut), answers with and
without \\boxed{}. Five documents of about 180 words, each with one needle sentence, chunks of 128 tokens and a
memory of 32: three model calls a document.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from real_model import essay_document

pytestmark = pytest.mark.slow

M, CHUNK = 32, 128
NEEDLES = [("The secret code of the blue door is 4172.", "What is the secret code of the blue door?", "4172"),
           ("The capital of the island of Varno is Pelmet.", "What is the capital of the island of Varno?", "Pelmet"),
           ("Maria's favourite number is 83.", "What is Maria's favourite number?", "83"),
           ("The red train leaves at 7:45.", "When does the red train leave?", "7:45"),
           ("The password for the vault is tangerine.", "What is the password for the vault?", "tangerine")]
WORDS = 180  # about 230 tokens: two chunks and the answer
FLAGS = ["--chunk-tokens", CHUNK, "--memory-tokens", M, "--query-tokens", 64, "--answer-tokens", 16]


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("real-docs") / "questions.jsonl"
    rows = []
    for k, (needle, question, answer) in enumerate(NEEDLES):
        text = " ".join(essay_document(WORDS * (k + 1)).split()[WORDS * k:])  # a different stretch of essays each
        words = text.split()
        words.insert(int(len(words) * (0.2 + 0.15 * k)), needle)
        rows.append({"id": f"doc{k}", "question": question, "context": " ".join(words), "answers": [answer]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ask(model, docs_file, out_dir, *extra, env=None):
    out, trace = out_dir / "answers.jsonl", out_dir / "trace.jsonl"
    cmd = [sys.executable, "-m", "memagent.cli", "ask", "--model", str(model), "--input", str(docs_file),
           "--output", str(out), "--trace", str(trace), "--trace-chunks", "--batch-docs", "1", "--no-progress",
           *map(str, FLAGS), *map(str, extra)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert run.returncode == 0, run.stderr[-3000:]
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return answers, records


@pytest.fixture(scope="module")
def in_process(real_model_dir, docs_file, tmp_path_factory):
    return _ask(real_model_dir, docs_file, tmp_path_factory.mktemp("in-process"))


def test_memories_are_within_m_tokens_and_cuts_are_recorded(in_process, real_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model_dir)
    answers, records = in_process
    memories = [r for r in records if r.get("kind", "memory") == "memory" and "memory" in r and "chunk_start" in r]
    assert len(memories) >= 10 and {r["doc_id"] for r in memories} == {f"doc{k}" for k in range(5)}
    for r in memories:
        n = len(tok(r["memory"], add_special_tokens=False)["input_ids"])
        assert n <= M and r["memory_tokens"] == n, r
        if n == M:  # a memory that filled its budget stopped at M tokens: it is a cut, not an ending
            assert r["truncated"] is True, r
    assert any(r["truncated"] for r in memories)  # this model writes past 32 tokens on every real chunk


def test_offsets_are_exact_and_the_chunks_are_the_documents_text(in_process, docs_file, real_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model_dir)
    _, records = in_process
    contexts = {json.loads(l)["id"]: json.loads(l)["context"] for l in docs_file.read_text().splitlines()}
    for doc_id, context in contexts.items():
        steps = sorted((r for r in records if r["doc_id"] == doc_id and "chunk_start" in r), key=lambda r: r["step"])
        ids = tok(context, add_special_tokens=False)["input_ids"]
        start = 0
        for r in steps:
            assert r["chunk_start"] == start and r["chunk_tokens"] <= CHUNK
            assert r["chunk_text"] == tok.decode(ids[start:start + r["chunk_tokens"]])
            start += r["chunk_tokens"]
        assert start == len(ids)  # the chunks cover the document, in order, nothing skipped


def test_every_answer_is_extracted_or_explicitly_missing(in_process):
    """An answer is the content of the last \\boxed{} of the reply, or null with the raw reply kept (the
    command line prints "(no answer: the model wrote no \\boxed{}) RAW")."""
    from memagent.agent.answer import extract_boxed

    answers, _ = in_process
    assert [a["id"] for a in answers] == [f"doc{k}" for k in range(5)]
    for a in answers:
        assert isinstance(a["raw_answer"], str) and a["raw_answer"].strip(), a
        assert a["answer"] == extract_boxed(a["raw_answer"]), a


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_server(real_model_dir, tmp_path_factory):
    """`transformers serve` on a loopback port, the same model folder, float32 on the CPU."""
    pytest.importorskip("fastapi")
    exe = Path(sys.executable).parent / "transformers"
    port = _free_port()
    log = tmp_path_factory.mktemp("transformers-serve") / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([str(exe), "serve", str(real_model_dir), "--host", "127.0.0.1", "--port", str(port),
                                 "--device", "cpu", "--dtype", "float32"], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                    if "loaded" in r.read().decode():
                        break
            except OSError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "transformers serve did not load the model in 240 s"
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_transformers_serve_agrees_call_for_call(in_process, transformers_server, real_model_dir, docs_file,
                                                 tmp_path):
    answers, records = _ask(real_model_dir, docs_file, tmp_path, "--backend", "openai", "--base-url",
                            transformers_server, "--tokenizer", real_model_dir, "--max-concurrency", "1",
                            env={"OPENAI_API_KEY": "unused"})
    want_answers, want_records = in_process

    def calls(rs):
        return [(r["doc_id"], r["step"], r.get("memory"), r.get("raw_answer"), r.get("truncated")) for r in rs]

    assert len(records) == len(want_records) >= 15  # 5 documents, 3 calls each at least
    assert calls(sorted(records, key=lambda r: (r["doc_id"], r["step"]))) == \
        calls(sorted(want_records, key=lambda r: (r["doc_id"], r["step"])))
    assert [a["answer"] for a in answers] == [a["answer"] for a in want_answers]

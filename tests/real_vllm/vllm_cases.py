"""What the real-vLLM tests share: the documents, the engine flags, running memagent, comparing traces."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

M, CHUNK = 32, 128
NEEDLES = [("The secret code of the blue door is 4172.", "What is the secret code of the blue door?", "4172"),
           ("The capital of the island of Varno is Pelmet.", "What is the capital of the island of Varno?", "Pelmet"),
           ("Maria's favourite number is 83.", "What is Maria's favourite number?", "83")]
WORDS = 180  # about 230 tokens: two chunks and the answer, three model calls a document
FLAGS = ["--chunk-tokens", str(CHUNK), "--memory-tokens", str(M), "--query-tokens", "64", "--answer-tokens", "16"]
KV_GIB = "0.5"  # 11.6K tokens of SmolLM2-135M in float32: the 8,192-token window fits; less RSS
ENGINE_FLAGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-gib", KV_GIB]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_memagent(*args, env, timeout=900):
    run = subprocess.run([sys.executable, "-m", "memagent.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def ask(model, docs_file, out_dir, *extra, env):
    """`memagent ask --input` over the documents, one at a time, greedy; (answers, trace records)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out, trace = out_dir / "answers.jsonl", out_dir / "trace.jsonl"
    run_memagent("ask", "--model", model, "--input", docs_file, "--output", out, "--trace", trace, "--batch-docs", 1,
                 "--no-progress", *FLAGS, *extra, env=env)
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return sorted(answers, key=lambda a: a["id"]), records


CALL_FIELDS = ("doc_id", "step", "kind", "chunk_start", "chunk_tokens", "prompt_tokens", "memory_tokens", "memory",
               "truncated", "answer", "raw_answer")


def calls(records):
    """Each model call of a trace, as the fields that must not depend on the backend (no timings)."""
    return [{k: r.get(k) for k in CALL_FIELDS} for r in records]


def results(answers):
    return [{k: a.get(k) for k in ("id", "answer", "raw_answer", "memory")} for a in answers]

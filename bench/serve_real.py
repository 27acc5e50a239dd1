"""Documents per second on the real model: `memagent ask` in process vs `--backend openai` against
`transformers serve` (an OpenAI-compatible server nobody here wrote), at 1, 4 and 16 documents in flight.

16 real-essay documents (Paul Graham's essays, a needle each, about 384 tokens), chunks of 128 tokens, M = 32,
answers of 16 tokens, greedy: 4 model calls a document. In process, N documents in flight is `--batch-docs N`
(their prompts batched); against the server it is `--max-concurrency N` (N requests in flight; the server
batches them when started with --continuous-batching, which is tried first). Each setting reads all 16
documents; the same answers are expected from both (checked and reported).

    python bench/serve_real.py          # about 10 minutes on 2 cores

Results: bench/results/serve_real.json.
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

from common import WORK, write_result
from real_model import real_model

PY = sys.executable
FLIGHT = (1, 4, 16)
FLAGS = ["--chunk-tokens", "128", "--memory-tokens", "32", "--answer-tokens", "16", "--query-tokens", "64"]
ENV = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1",
       "OPENAI_API_KEY": "unused", "TOKENIZERS_PARALLELISM": "false"}


def documents(path: Path, n: int = 16) -> Path:
    from memagent.tasks.essays import essays_text

    words = essays_text().split()
    rows = []
    for k in range(n):
        ws = words[300 * k: 300 * (k + 1)]
        ws.insert(100 + 10 * k, f"The secret code of door {k} is {4100 + k}.")
        rows.append({"id": f"d{k}", "question": f"What is the secret code of door {k}?", "context": " ".join(ws)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ask(model: Path, data: Path, out: Path, extra: list[str]) -> tuple[float, list]:
    t0 = time.perf_counter()
    run = subprocess.run([PY, "-m", "memagent.cli", "ask", "--model", str(model), "--input", str(data), "--output",
                          str(out), "--no-progress", *FLAGS, *extra], capture_output=True, text=True, env=ENV)
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        sys.exit(f"error: ask failed: {run.stderr[-2000:]}")
    return seconds, [json.loads(line)["raw_answer"] for line in out.read_text().splitlines()]


def start_server(model: Path, continuous: bool) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(PY).parent / "transformers"), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--device", "cpu", "--dtype", "float32"]
    if continuous:
        cmd.append("--continuous-batching")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                if "loaded" in r.read().decode():
                    return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(1)
    proc.kill()
    raise RuntimeError("transformers serve did not start")


def main() -> None:
    out = WORK / "serve-real"
    out.mkdir(parents=True, exist_ok=True)
    model = real_model()
    data = documents(out / "docs.jsonl")
    rows: dict = {"in_process": {}, "transformers_serve": {}}
    answers: dict = {}
    for n in FLIGHT:
        seconds, answers[("in", n)] = ask(model, data, out / f"in-{n}.jsonl", ["--batch-docs", str(n)])
        rows["in_process"][str(n)] = {"seconds": round(seconds, 1), "docs_per_s": round(16 / seconds, 3)}
        print("in process", n, rows["in_process"][str(n)], flush=True)
    continuous = True
    try:
        proc, url = start_server(model, continuous=True)
    except RuntimeError:
        continuous = False
        proc, url = start_server(model, continuous=False)
    try:
        for n in FLIGHT:
            seconds, answers[("serve", n)] = ask(model, data, out / f"serve-{n}.jsonl", [
                "--backend", "openai", "--base-url", url, "--tokenizer", str(model), "--max-concurrency", str(n)])
            rows["transformers_serve"][str(n)] = {"seconds": round(seconds, 1), "docs_per_s": round(16 / seconds, 3)}
            print("serve", n, rows["transformers_serve"][str(n)], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    base = answers[("in", 1)]
    same = {f"{kind}-{n}": answers[(kind, n)] == base for kind, n in answers}
    write_result("serve_real", {
        "command": "python bench/serve_real.py", "documents": 16, "flags": " ".join(FLAGS),
        "continuous_batching": continuous, "rows": rows, "answers_equal_to_in_process_batch_1": same,
        "ratio_serve_over_in_process": {str(n): round(rows["transformers_serve"][str(n)]["docs_per_s"]
                                                      / rows["in_process"][str(n)]["docs_per_s"], 3) for n in FLIGHT}})


if __name__ == "__main__":
    main()

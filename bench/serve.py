"""Benchmark: `memagent serve` under load. Requests/s and p50/p99 latency of chat completions with 1, 8
and 32 concurrent clients, against a simulated backend (a fixed delay per model call, no model), so
the numbers measure the service (HTTP, jobs, SQLite progress, polling), not a model. Every reply is
checked: it must carry its own question's answer (nothing lost or mixed).
Run: .venv/bin/python bench/serve.py   ->  bench/results/serve.json, summary key serve_rps_32
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, table, write_result

sys.path.insert(0, str(ROOT / "tests" / "serve"))


class DelayBackend:
    """Backend Protocol: sleeps `delay` seconds a batch; every reply is the question's tag (`q-<n>`) in
    \\boxed{} (so the final answer is the tag). Safe to call from many threads."""

    def __init__(self, tokenizer, delay: float) -> None:
        from memagent.backends.base import Generation

        self.tokenizer, self.max_window, self.delay, self._gen = tokenizer, None, delay, Generation

    def prompt_length(self, prompt: str) -> int:
        return len(prompt) // 4

    def generate(self, prompts, params):
        time.sleep(self.delay)
        out = []
        for p in prompts:
            tag = re.search(r"q-\d+", p).group(0)
            out.append(self._gen(text=f"\\boxed{{{tag}}}", token_ids=[1, 2, 3], prompt_token_ids=None))
        return out


def run_level(url: str, clients: int, per_client: int, doc: str) -> dict:
    """`clients` concurrent clients (asyncio, one connection each), each sending `per_client` chat
    completions one after another; every reply must be its own question's tag."""
    import asyncio

    import httpx

    latencies: list[float] = []
    wrong: list[str] = []

    async def client(c: int) -> None:
        async with httpx.AsyncClient(timeout=300) as http:
            for k in range(per_client):
                tag = f"q-{c * 1000 + k}"
                t0 = time.perf_counter()
                r = await http.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": doc}, {"role": "user", "content": tag}]})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200 or r.json()["choices"][0]["message"]["content"] != tag:
                    wrong.append(f"{tag}: {r.status_code} {r.text[:200]}")

    async def all_clients() -> None:
        await asyncio.gather(*(client(c) for c in range(clients)))

    t0 = time.perf_counter()
    asyncio.run(all_clients())
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return dict(clients=clients, requests=len(lat), failed=len(wrong), failures=wrong[:5], seconds=round(wall, 3),
                rps=round(len(lat) / wall, 2), p50_ms=round(1000 * statistics.median(lat), 1),
                p99_ms=round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=0.02, help="seconds per simulated model call")
    ap.add_argument("--chunks", type=int, default=4, help="chunks per document")
    ap.add_argument("--requests", type=int, default=128, help="requests per concurrency level")
    ap.add_argument("--max-jobs", type=int, default=32, help="the server's --max-jobs (jobs run at once)")
    args = ap.parse_args()
    from serve_helpers import ThreadServer

    from memagent.backends.tiny import build_tokenizer

    tok = build_tokenizer()
    chunk_tokens = 16  # serve_helpers.SMALL
    doc = tok.decode(tok("the river city album song " * 200, add_special_tokens=False)["input_ids"][: args.chunks * chunk_tokens])
    rows = []
    with tempfile.TemporaryDirectory() as state:
        backend = DelayBackend(tok, args.delay)
        with ThreadServer(backend, Path(state), serialize=False, max_jobs=args.max_jobs, max_queue=64) as server:
            run_level(server.url, 2, 2, doc)  # warm-up
            for clients in (1, 8, 32):
                rows.append(run_level(server.url, clients, max(1, args.requests // clients), doc))
    keys = ["clients", "requests", "failed", "rps", "p50_ms", "p99_ms"]
    table([[r[k] for k in keys] for r in rows], keys)
    calls = args.chunks + 1
    write_result("serve", dict(settings=dict(delay_s=args.delay, chunks=args.chunks, calls_per_request=calls,
                                             floor_ms=round(1000 * calls * args.delay, 1)),
                               levels=rows, headline=dict(serve_rps_32=rows[-1]["rps"])))
    if any(r["failed"] for r in rows):
        raise SystemExit("some requests failed or got another request's answer: see bench/results/serve.json")


if __name__ == "__main__":
    main()

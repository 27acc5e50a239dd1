"""Benchmark 3, batching across documents: documents per second with 16 documents in flight
against one at a time, same model, same documents. Target >= 3x.
Run: .venv/bin/python bench/batching.py
"""
from __future__ import annotations

import argparse
import time

from common import filler_text, table, tiny_model, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--memory-tokens", type=int, default=32)
    args = ap.parse_args()
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig

    backend = TransformersBackend.from_pretrained(tiny_model(), device="cpu", dtype="float32")
    docs = [filler_text(backend.tokenizer, args.tokens, seed=i) for i in range(args.docs)]
    items = [AgentInput(f"What is kept in document {i}?", d, str(i)) for i, d in enumerate(docs)]
    rows, rates = [], {}
    for in_flight in (1, args.docs):
        cfg = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=16,
                          max_batch_docs=in_flight)
        t0 = time.perf_counter()
        MemoryAgent(backend, cfg).run(items)
        dt = time.perf_counter() - t0
        rates[in_flight] = args.docs / dt
        rows.append([in_flight, dt, rates[in_flight]])
    speedup = rates[args.docs] / rates[1]
    table(rows, ["docs in flight", "seconds", "docs/s"])
    print(f"speed-up {speedup:.2f}x")
    write_result("batching", dict(
        config=vars(args), docs_per_s={str(k): v for k, v in rates.items()},
        headline=dict(batching_speedup=round(speedup, 3)), targets=dict(batching_speedup=">= 3"),
    ))


if __name__ == "__main__":
    main()

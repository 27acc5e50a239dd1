"""Benchmark 3, batching across documents: documents per second with 16 documents in flight
against one at a time, same model, same documents. Target >= 3x.
The two settings alternate `--repeats` times and each keeps its best time (the machine is shared,
its load changes within a run; the best time is the one least disturbed by other processes).
Run: .venv/bin/python bench/batching.py
"""
from __future__ import annotations

import argparse
from typing import Callable

from common import best_times, filler_text, table, tiny_model, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--memory-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig

    backend = TransformersBackend.from_pretrained(tiny_model(), device="cpu", dtype="float32")
    docs = [filler_text(backend.tokenizer, args.tokens)] * args.docs  # same text; the questions differ
    items = [AgentInput(f"What is kept in document {i}?", d, str(i)) for i, d in enumerate(docs)]
    def run(in_flight: int) -> Callable[[], object]:
        cfg = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=16,
                          max_batch_docs=in_flight)
        return lambda: MemoryAgent(backend, cfg).run(items)

    best, _, timings = best_times({k: run(k) for k in (1, args.docs)}, args.repeats)
    runs = [dict(in_flight=t["run"], seconds=t["seconds"]) for t in timings]
    rates = {k: args.docs / v for k, v in best.items()}
    rows = [[k, best[k], rates[k]] for k in best]
    speedup = rates[args.docs] / rates[1]
    table(rows, ["docs in flight", "best s", "docs/s"])
    print(f"speed-up {speedup:.2f}x")
    write_result("batching", dict(
        config=vars(args), docs_per_s={str(k): v for k, v in rates.items()}, runs=runs,
        headline=dict(batching_speedup=round(speedup, 3)), targets=dict(batching_speedup=">= 3"),
    ))


if __name__ == "__main__":
    main()

"""Benchmark 2, overhead: end-to-end time of a batch run divided by the time spent inside the
backend's generate calls (chunking, prompt rendering, memory capping, tracing, bookkeeping).
Target <= 1.05. Run: .venv/bin/python bench/overhead.py
"""
from __future__ import annotations

import argparse
import time

from common import WORK, filler_text, table, tiny_model, write_result


class TimedBackend:
    """Wraps a backend; accumulates the seconds spent inside generate()."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0
        self.tokenizer, self.max_window = inner.tokenizer, inner.max_window

    def prompt_length(self, prompt):
        return self.inner.prompt_length(prompt)

    def generate(self, prompts, params):
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, params)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--memory-tokens", type=int, default=32)
    args = ap.parse_args()
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig

    backend = TimedBackend(TransformersBackend.from_pretrained(tiny_model(), device="cpu", dtype="float32"))
    docs = [filler_text(backend.tokenizer, args.tokens)] * args.docs  # same text; the questions differ
    items = [AgentInput(f"What is kept in document {i}?", d, str(i)) for i, d in enumerate(docs)]
    cfg = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=16,
                      max_batch_docs=args.docs)
    agent = MemoryAgent(backend, cfg, trace_path=WORK / "overhead_trace.jsonl")
    t0 = time.perf_counter()
    agent.run(items)
    total = time.perf_counter() - t0
    ratio = total / backend.seconds
    table([[args.docs, args.tokens, backend.calls, total, backend.seconds, ratio]],
          ["docs", "tokens/doc", "backend calls", "total s", "in generate s", "ratio"])
    write_result("overhead", dict(
        config=vars(args), total_s=total, generate_s=backend.seconds, backend_calls=backend.calls,
        headline=dict(overhead_ratio=round(ratio, 4)), targets=dict(overhead_ratio="<= 1.05"),
    ))


if __name__ == "__main__":
    main()

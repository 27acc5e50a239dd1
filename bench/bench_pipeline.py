"""Per-document pipelining against lock-step batches, through a simulated OpenAI-compatible server (issue 14).

32 documents in flight (`max_batch_docs = max_concurrency = 32`), each read in 28 chunks plus one final call
(29 calls), against `bench/sim_server.py` run as its own process on 127.0.0.1:
- stragglers: every reply takes 0.1 s, or 1.0 s for 10% of the prompts (fixed by a hash of the prompt, so
  both schedules meet the same stragglers) -> `pipeline_speedup` (target >= 2.5);
- no stragglers: every reply 0.1 s -> `pipeline_no_straggler_ratio` (target >= 0.95);
- zero latency: the client's own time per call, pipelined -> `client_ms_per_call` (target <= 5).
Both schedules run in the same process one after the other, and their answers are compared (greedy, equal).
Writes bench/results/pipeline.json.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from common import toy_documents, write_result
from sim_server import launch

from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.openai import OpenAIBackend
from memagent.backends.tiny import build_tokenizer
from memagent.config import AgentConfig

DOCS, CHUNKS, CHUNK_TOKENS = 32, 28, 64
CONFIG = AgentConfig(chunk_tokens=CHUNK_TOKENS, memory_tokens=32, answer_tokens=16, query_tokens=16,
                     max_batch_docs=DOCS)


def documents(tok) -> list[AgentInput]:
    return toy_documents(tok, DOCS, CHUNKS, CHUNK_TOKENS, "city", "river")


def timed(backend, items, schedule: str) -> dict:
    agent = MemoryAgent(backend, CONFIG, schedule=schedule)
    t0 = time.perf_counter()
    results = agent.run(items)
    seconds = time.perf_counter() - t0
    return dict(schedule=schedule, seconds=round(seconds, 3), docs_per_s=round(len(items) / seconds, 3),
                calls=agent.stats.calls, max_calls_in_flight=agent.stats.max_calls_in_flight,
                max_docs_in_flight=agent.stats.max_docs_in_flight,
                ms_per_call=round(1000 * seconds / agent.stats.calls, 3),
                answers=[r.answer for r in results], chunks=[r.num_chunks for r in results])


def compare(tok, items, server_args: list[str], schedules=("pipelined", "lockstep")) -> dict:
    proc, url = launch(*server_args)
    try:
        backend = OpenAIBackend("sim", url, tok, max_concurrency=DOCS, max_retries=0)
        runs = {s: timed(backend, items, s) for s in schedules}
        backend.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    answers = {s: r.pop("answers") for s, r in runs.items()}
    same = len({tuple(a) for a in answers.values()}) == 1
    return dict(server=" ".join(server_args), same_answers=same, runs=runs)


def main() -> None:
    tok = build_tokenizer()
    items = documents(tok)
    strag = compare(tok, items, ["--latency", "0.1", "--straggler-p", "0.1", "--straggler-x", "10"])
    plain = compare(tok, items, ["--latency", "0.1"])
    zero = compare(tok, items, ["--latency", "0"], schedules=("pipelined",))
    speedup = strag["runs"]["pipelined"]["docs_per_s"] / strag["runs"]["lockstep"]["docs_per_s"]
    ratio = plain["runs"]["pipelined"]["docs_per_s"] / plain["runs"]["lockstep"]["docs_per_s"]
    client_ms = zero["runs"]["pipelined"]["ms_per_call"]
    headline = dict(pipeline_speedup=round(speedup, 3), pipeline_no_straggler_ratio=round(ratio, 3),
                    client_ms_per_call=round(client_ms, 3))
    for name, c in (("stragglers", strag), ("no stragglers", plain), ("zero latency", zero)):
        for s, r in c["runs"].items():
            print(f"{name:14s} {s:9s} {r['seconds']:7.2f} s  {r['docs_per_s']:6.2f} docs/s  {r['calls']} calls  "
                  f"{r['ms_per_call']:.2f} ms/call  max in flight {r['max_calls_in_flight']}")
    print(headline)
    write_result("pipeline", dict(
        config=dict(docs=DOCS, chunks_per_doc=CHUNKS, calls_per_doc=CHUNKS + 1, chunk_tokens=CHUNK_TOKENS,
                    max_batch_docs=DOCS, max_concurrency=DOCS, server="bench/sim_server.py (own process)"),
        stragglers=strag, no_stragglers=plain, zero_latency=zero,
        targets=dict(pipeline_speedup=">= 2.5", pipeline_no_straggler_ratio=">= 0.95", client_ms_per_call="<= 5"),
        headline=headline))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()

"""Benchmark 6, the cost model: the `memagent flops` accounting for the tiny model's shape next to
the measured wall-clock of the MemAgent workflow and of the full-context baseline on that model,
at the same lengths. Where do they cross?

The FLOP side uses the same budget as the measured runs (query, output, chunk, template
overheads measured on the tiny model), so the two columns compare like with like.
Run: .venv/bin/python bench/cost_model.py [--lengths 2048,4096,...]
"""
from __future__ import annotations

import argparse
import time

from common import filler_text, table, tiny_model, write_result


def crossover(lengths: list[int], full: list[float], mem: list[float]) -> int | None:
    """The first length at which full-context costs more than MemAgent (None if never)."""
    for n, f, m in zip(lengths, full, mem):
        if f > m:
            return n
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    args = ap.parse_args()
    from memagent.prompts import render
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.backends.base import SamplingParams
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig
    from memagent.eval.baselines import render_baseline
    from memagent.eval.flops import CostModel, cost_table, load_shape

    lengths = [int(x) for x in args.lengths.split(",")]
    path = tiny_model("tiny-long", max_position_embeddings=max(lengths) + 4096)
    backend = TransformersBackend.from_pretrained(path, device="cpu", dtype="float32")
    question = "What does the city keep near the river?"
    cfg = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                      answer_tokens=args.output_tokens, query_tokens=64)
    q = len(backend.tokenizer(question, add_special_tokens=False)["input_ids"])
    mem_overhead = backend.prompt_length(render(cfg.memory_template, question="", memory="", chunk=""))
    fin_overhead = backend.prompt_length(render(cfg.final_template, question="", memory=""))
    cost = CostModel(query=q, output=args.memory_tokens, chunk=args.chunk_tokens,
                     memory_overhead=mem_overhead, final_overhead=fin_overhead)
    flops = cost_table(load_shape(str(path)), lengths, cost)["rows"]
    agent = MemoryAgent(backend, cfg)
    rows, runs = [], []
    for n, fl in zip(lengths, flops):
        doc = filler_text(backend.tokenizer, n)
        t0 = time.perf_counter()
        agent.run([AgentInput(question, doc, str(n))])
        t_mem = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend.generate([render_baseline(question, doc)], SamplingParams(max_new_tokens=args.output_tokens))
        t_full = time.perf_counter() - t0
        runs.append(dict(tokens=n, chunks=fl["chunks"], full_flops=fl["full_flops"], memagent_flops=fl["memagent_flops"],
                         flops_ratio=fl["ratio"], full_s=t_full, memagent_s=t_mem, time_ratio=t_full / t_mem))
        rows.append([n, fl["chunks"], fl["ratio"], t_full, t_mem, t_full / t_mem])
        print(f"{n} tokens: full {t_full:.2f} s, memagent {t_mem:.2f} s", flush=True)
    table(rows, ["tokens", "chunks", "FLOPs full/mem", "full s", "memagent s", "time full/mem"])
    x_flops = crossover(lengths, [r["full_flops"] for r in runs], [r["memagent_flops"] for r in runs])
    x_time = crossover(lengths, [r["full_s"] for r in runs], [r["memagent_s"] for r in runs])
    print(f"crossover: FLOPs at {x_flops} tokens, wall-clock at {x_time} tokens")
    write_result("cost_model", dict(
        config=vars(args), cost_model=vars(cost) if hasattr(cost, "__dict__") else str(cost), runs=runs,
        crossover_tokens=dict(flops=x_flops, wall_clock=x_time),
    ))


if __name__ == "__main__":
    main()

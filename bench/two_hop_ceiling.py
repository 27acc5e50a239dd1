"""How well can the two-hop demo's model read with an overwritten memory at all? A ceiling for `memagent` on
the two-hop task (issue 26), measured without RL: the demo's model (demo/model.py, `--hidden` wide) trained
SUPERVISED on the rows of the best one-fact policy, which is question-aware (no part of any demo recipe):

    copy the chunk's fact when its key is the question's (the pointer "A B") or the key the memory points to
    (the value "B V"); else keep the memory; answer with the memory's second word.

That policy answers every pointer-first document and no value-first one (the overwrite limit). Whether the
model can hold it at all, and with how many rows: if it can, a `memagent-rl` that falls short on pointer-first
is Multi-Conv DAPO not finding the policy, not the model's size. Documents: the two-hop
demo's evaluation documents (demo/two_hop.py: `make_samples(spec, 4 * m, docs, seed + 10_000, prefix="eval",
two_hop=True)`), greedy, memagent workflow.

Run: .venv/bin/python bench/two_hop_ceiling.py [--hidden 64] [--rows 24000,96000] [--docs 256]
Writes bench/results/two_hop_ceiling.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from common import write_result

from memagent.prompts import render
from memagent.demo.config import EMPTY_MEMORY, FINAL_TEMPLATE, MEMORY_TEMPLATE, boxed
from memagent.demo.evaluate import run_memagent
from memagent.demo.pipeline import encode_rows, warm_up
from memagent.demo.two_hop import EXTRA_WORDS, TwoHopConfig, by_order
from memagent.tasks.toy import MARKER, build_toy_tokenizer, make_samples


def chunk_fact(chunk: str) -> tuple[str, str]:
    """The (key, value) of a one-fact toy chunk."""
    words = chunk.split()
    at = words.index(MARKER)
    return words[at + 1], words[at + 2]


def best_policy_rows(cfg: TwoHopConfig, n: int, seed: int) -> list[tuple[str, str]]:
    """n (prompt, response) rows of the policy in the module doc, over two-hop documents of train_chunks chunks."""
    spec, rng, rows = cfg.spec, random.Random(seed), []
    size = spec.chunk_tokens
    while len(rows) < n:
        s = make_samples(spec, cfg.train_chunks, 1, rng.randrange(10**9), prefix="ceiling", two_hop=True)[0]
        words = s["context"].split()
        memory = EMPTY_MEMORY
        for i in range(0, len(words), size):
            chunk = " ".join(words[i:i + size])
            key, value = chunk_fact(chunk)
            new = f"{key} {value}" if key in (s["question"], memory.split()[1]) else memory
            rows.append((render(MEMORY_TEMPLATE, question=s["question"], memory=memory, chunk=chunk), new))
            memory = new
        rows.append((render(FINAL_TEMPLATE, question=s["question"], memory=memory), boxed(memory.split()[1])))
    return rows[:n]


def measure(hidden: int, rows: int, docs: int, multiples: tuple[int, ...], seed: int) -> dict[str, Any]:
    import torch  # lazy: torch

    cfg = dataclasses.replace(TwoHopConfig(seed=seed), hidden=hidden, warmup_rows=rows)
    tokenizer = build_toy_tokenizer(cfg.spec, EXTRA_WORDS)
    torch.manual_seed(seed)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        model = warm_up(cfg, tokenizer, encode_rows(tokenizer, best_policy_rows(cfg, rows, seed)), Path(out))
    found: dict[str, Any] = {"train_s": round(time.perf_counter() - t, 1), "accuracy": {}}
    for mult in multiples:
        samples = make_samples(cfg.spec, cfg.train_chunks * mult, docs, seed + 10_000, prefix="eval", two_hop=True)
        acc = by_order(run_memagent(model, tokenizer, samples, cfg.spec), samples)
        found["accuracy"][str(mult)] = {k: round(100 * v, 1) for k, v in acc.items() if v is not None}
        print(f"hidden {hidden}, {rows} rows, {mult}x: {found['accuracy'][str(mult)]}", flush=True)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="64")
    ap.add_argument("--rows", default="24000,96000")
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--multiples", default="1,4,16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    multiples = tuple(int(m) for m in a.multiples.split(","))
    runs = [{"hidden": int(h), "rows": int(n), **measure(int(h), int(n), a.docs, multiples, a.seed)}
            for h in a.hidden.split(",") for n in a.rows.split(",")]
    write_result("two_hop_ceiling", {
        "policy": "copy the chunk's fact if its key is the question's or the memory's second word, else keep",
        "docs": a.docs, "seed": a.seed, "runs": runs,
        "command": f"python bench/two_hop_ceiling.py --hidden {a.hidden} --rows {a.rows} --docs {a.docs}"})


if __name__ == "__main__":
    main()

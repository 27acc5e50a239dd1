"""Benchmark 4, chunking: tokens per second of the streaming chunker (file read in blocks,
tokenised, cut into C-token chunks, each decoded back to text) against the tokenizer's own
encode of the same text held in memory. Target >= 0.8x.
Run: .venv/bin/python bench/chunker.py
"""
from __future__ import annotations

import argparse

from common import WORK, best_times, filler_text, table, tiny_model, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2_000_000)
    ap.add_argument("--chunk-tokens", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from memagent.agent.chunking import iter_chunks

    tok = AutoTokenizer.from_pretrained(tiny_model())
    path = WORK / "chunker_doc.txt"
    block = filler_text(tok, 65536)
    with open(path, "w") as f:
        for _ in range(args.tokens // 65536):
            f.write(block)
    text = path.read_text()
    best, n, _ = best_times({"stream": lambda: sum(len(c.token_ids) for c in iter_chunks(path, tok, args.chunk_tokens)),
                             "batch": lambda: len(tok(text, add_special_tokens=False)["input_ids"])}, args.repeats)
    n_stream, n_batch = n["stream"], n["batch"]
    assert n_stream == n_batch, (n_stream, n_batch)
    rate = {k: n_batch / v for k, v in best.items()}
    ratio = rate["stream"] / rate["batch"]
    table([["streaming chunker (file)", n_stream, best["stream"], rate["stream"]],
           ["tokenizer encode (in memory)", n_batch, best["batch"], rate["batch"]]],
          ["method", "tokens", "best s", "tokens/s"])
    print(f"ratio {ratio:.3f}")
    write_result("chunker", dict(
        config=vars(args), tokens=n_batch, seconds=best, tokens_per_s=rate,
        headline=dict(chunker_ratio=round(ratio, 4)), targets=dict(chunker_ratio=">= 0.8"),
    ))


if __name__ == "__main__":
    main()

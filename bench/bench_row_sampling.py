"""The per-row seeded sampler's cost: generation time with SamplingParams.seeds against the default sampled path.

    python bench/bench_row_sampling.py [--prompts 64] [--tokens 32] [--reps 5]  ->  bench/results/row_sampling.json

The tiny model of `memagent tiny-model` (float32, CPU), built in a temporary folder; one batch of prompts of
spread lengths, generated `reps` times by each path in turn (interleaved, so drift hits both alike). Prints the
median seconds of each and their ratio (per-row / default), summary key row_sampling_time_ratio.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import write_result  # noqa: E402  (puts src/ on the path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--step-vocab", type=int, default=0, help="also time one step's token choice at this vocabulary")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from memagent.backends.base import SamplingParams
    from memagent.backends.hf import TransformersBackend
    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "tiny", tokenizer=build_tokenizer())
        be = TransformersBackend.from_pretrained(path, device=args.device, dtype="float32")
    words = "the river city memory key value old blue long road lake green".split()
    prompts = [" ".join(words[j % len(words)] for j in range(4 + 3 * (i % 12))) for i in range(args.prompts)]
    default = SamplingParams(args.tokens, temperature=1.0, seed=1)
    per_row = SamplingParams(args.tokens, temperature=1.0, seeds=tuple(range(args.prompts)))
    times: dict[str, list[float]] = {"default": [], "per_row": []}
    tokens: dict[str, int] = {}
    be.generate(prompts[:4], default)  # warm-up
    be.generate(prompts[:4], SamplingParams(args.tokens, temperature=1.0, seeds=(0, 1, 2, 3)))
    for _ in range(args.reps):
        for name, params in (("default", default), ("per_row", per_row)):
            t0 = time.perf_counter()
            gens = be.generate(prompts, params)
            times[name].append(time.perf_counter() - t0)
            tokens[name] = sum(len(g.token_ids) for g in gens)  # EOS can end rows early: compare like with like
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.prompts} prompts x {args.tokens} new tokens, {args.reps} reps, device {args.device}")
    for k, v in times.items():
        print(f"  {k:8s} median {med[k]:.4f} s  ({tokens[k]} tokens)  runs {[round(x, 4) for x in v]}")
    ratio = round(med["per_row"] / med["default"], 3)
    print(f"  ratio per_row / default: {ratio}")
    steps = step_cost(args.prompts, args.step_vocab, args.reps) if args.step_vocab else None
    write_result("row_sampling", {"prompts": args.prompts, "new_tokens": args.tokens, "reps": args.reps,
                                  "seconds": times, "tokens": tokens, "one_step_choice_s": steps,
                                  "headline": {"row_sampling_time_ratio": ratio}})


def step_cost(rows: int, vocab: int, reps: int) -> dict[str, float]:
    """One decode step's token choice alone at a real vocabulary: the per-row sampler (float64 softmax, cumsum,
    searchsorted) against transformers' default (float32 softmax, multinomial)."""
    from memagent.backends.row_sampling import row_uniforms, sample_rows

    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3  # (B, V) float32
    u = row_uniforms(range(rows), 1)[:, 0]

    def default() -> torch.Tensor:
        return torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(1)

    out = {}
    for name, fn in (("default", default), ("per_row", lambda: sample_rows(logits, u, 1.0, 1.0)),
                     ("per_row top_p=0.9", lambda: sample_rows(logits, u, 1.0, 0.9))):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out[name] = (time.perf_counter() - t0) / reps
    print(f"one step's token choice, {rows} rows x vocab {vocab}: " +
          ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()

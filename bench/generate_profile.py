"""Where the time of the transformers backend goes (the profile behind benchmark 3, batching).

Times `model.generate` of the tiny model on prompts of the batching benchmark's size (about 620
tokens: a 512-token chunk, the template, a short memory), at 1 row and at N rows: the prefill
(generate with 1 new token) and the cost of each further decode step (generate with 1 + T new
tokens, minus the prefill, over T). Batching helps only what is not compute: the per-step
overhead of the decode loop. A prefill of N rows costs about N prefills of one row, so the
batching speed-up of the workflow is bounded by the prefill's share of the batched time.
Then the torch profiler's top operators of one batched generate call.
Run: .venv/bin/python bench/generate_profile.py
"""
from __future__ import annotations

import argparse

from common import best_times, table, tiny_model, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=620)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model(), dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def inputs(rows: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(10, vocab, (rows, args.prompt_tokens), generator=gen)  # (B, L)
        mask = torch.ones_like(ids)
        mask[1:, :3] = 0  # a little left padding, as in real batches of prompts of unequal length
        return dict(input_ids=ids, attention_mask=mask)

    def generate(batch: dict[str, torch.Tensor], new: int) -> None:
        model.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False, temperature=None,
                       top_p=None, top_k=None, pad_token_id=0)

    def seconds(batch: dict[str, torch.Tensor], new: int) -> float:
        generate(batch, new)  # warm-up
        return best_times({new: lambda: generate(batch, new)}, args.repeats)[0][new]

    rows, res = [], {}
    for b in (1, args.rows):
        batch = inputs(b)
        prefill = seconds(batch, 1)
        step = (seconds(batch, 1 + args.new_tokens) - prefill) / args.new_tokens
        call = prefill + args.new_tokens * step
        res[str(b)] = dict(prefill_s=prefill, decode_step_s=step, call_s=call, per_row_s=call / b,
                           prefill_share=prefill / call)
        rows.append([b, 1000 * prefill, 1000 * step, 1000 * call / b, f"{100 * prefill / call:.0f}%"])
    one, many = res["1"], res[str(args.rows)]
    bound = one["per_row_s"] / many["per_row_s"]
    table(rows, ["rows", "prefill ms", "decode step ms", "ms per row-call", "prefill share"])
    print(f"prefill per row: x{many['prefill_s'] / args.rows / one['prefill_s']:.2f} of one row's; "
          f"decode step per row: x{many['decode_step_s'] / args.rows / one['decode_step_s']:.2f}; "
          f"speed-up bound of batching from the model alone: {bound:.2f}x")

    batch = inputs(args.rows)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(batch, 1 + args.new_tokens)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    top = [dict(op=e.key, calls=e.count, self_ms=e.self_cpu_time_total / 1000, share=e.self_cpu_time_total / total)
           for e in ops[:10]]
    table([[t["op"], t["calls"], t["self_ms"], f"{100 * t['share']:.0f}%"] for t in top],
          ["operator (batched call)", "calls", "self ms", "share"])
    write_result("generate_profile", dict(config=vars(args), timings=res, batching_bound=bound, top_ops=top))


if __name__ == "__main__":
    main()

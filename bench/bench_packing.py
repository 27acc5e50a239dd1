"""Padding-free packing and gradient checkpointing on an update step (issue 17).

1. Speed: tokens per second of one update step (forward + backward of every micro-batch, then AdamW) on a
   batch whose row lengths spread 10x, padded micro-batches (update.micro_batch_size rows, each padded to
   the longest) against packed ones (update.micro_batch_tokens, rows back to back, per-row varlen attention
   as the trainer switches it on), timed alternately in
   one run; the median of each is compared. Headline: packing_speedup.
2. Memory: the peak resident memory added by one update step with and without gradient checkpointing, each
   measured in a fresh subprocess (Linux VmHWM after resetting it through /proc/self/clear_refs).

Run: python bench/bench_packing.py  ->  bench/results/packing.json, summary keys packing_speedup,
gradient_checkpointing_memory_ratio.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, write_result  # noqa: F401  (puts src/ on the path, one torch thread)

MODEL = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab=2048)
ROWS, MICRO_ROWS = 32, 8  # rows of the update batch; padded micro-batch size
SHORT, LONG = 40, 400  # row lengths spread 10x (prompt + response tokens)
REPS = 7


def build_model(seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM

    from memagent.backends.tiny import tiny_config

    m = dict(MODEL)
    cfg = tiny_config(m.pop("vocab"), max_position_embeddings=2048, **m)
    cfg.pad_token_id = 0
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)


def batch(seed: int = 0, rows: int = ROWS, short: int = SHORT, long: int = LONG):
    """Rows of lengths spread evenly over [short, long] in a shuffled order; responses are a quarter of a row."""
    import torch

    from memagent.rl.objectives import MiniBatch

    g = torch.Generator().manual_seed(seed)
    lengths = [short + (long - short) * i // (rows - 1) for i in range(rows)]
    lengths = [lengths[i] for i in torch.randperm(rows, generator=g).tolist()]
    prompts, responses = [], []
    for n in lengths:
        r = max(1, n // 4)
        prompts.append(torch.randint(1, MODEL["vocab"], (n - r,), generator=g).tolist())
        responses.append(torch.randint(1, MODEL["vocab"], (r,), generator=g).tolist())
    old = [-7.6 + 0.1 * torch.randn(len(r), generator=g) for r in responses]
    adv = torch.randn(rows, generator=g)
    return MiniBatch(prompts, responses, old, None, adv, torch.arange(rows))


def update_step(model, opt, mb, micro_batch_tokens: int) -> float:
    """Seconds of one update step: accumulate the DAPO gradient over the batch, then AdamW."""
    from memagent.rl.config import LossConfig
    from memagent.rl.distributed import DistInfo
    from memagent.rl.objectives import DAPO, Term, accumulate_gradients

    objective = DAPO.from_config(LossConfig(kl_coef=0.0))
    t0 = time.perf_counter()
    accumulate_gradients(model, [Term(objective, 1.0, mb)], micro_batch_size=MICRO_ROWS, pad_id=0, info=DistInfo(),
                         micro_batch_tokens=micro_batch_tokens)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def speed() -> dict:
    """Padded against packed with a budget of 2 longest rows (the headline), as the trainer runs it: packing
    switches "auto" attention to per-row varlen attention (memagent.rl.varlen). Also packed with transformers'
    sdpa and its dense block-diagonal mask (attention over the whole pack: what packing gave before varlen),
    and varlen with a budget as large as the padded micro-batch's real tokens."""
    import torch

    from memagent.rl.config import ModelOptions
    from memagent.rl.model_options import prepare_model

    mb = batch()
    real = sum(len(p) + len(r) for p, r in zip(mb.prompt_ids, mb.response_ids))
    chunks = [range(k, min(k + MICRO_ROWS, ROWS)) for k in range(0, ROWS, MICRO_ROWS)]
    padded_tokens = sum(len(c) * (max(len(mb.prompt_ids[i]) for i in c) + max(len(mb.response_ids[i]) for i in c))
                        for c in chunks)  # (B, P + R) per padded micro-batch
    budgets = {"padded": 0, "packed": 2 * LONG, "packed_sdpa_mask": 2 * LONG, "packed_large": MICRO_ROWS * real // ROWS}
    variants = {}
    for name, budget in budgets.items():  # one model each, the same initial weights
        model = prepare_model(build_model(), ModelOptions(), packed=budget > 0 and name != "packed_sdpa_mask")
        variants[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-6), budget)
    attention = {k: m.config._attn_implementation for k, (m, _, _) in variants.items()}
    for model, opt, budget in variants.values():  # warm-up
        update_step(model, opt, mb, budget)
    times: dict[str, list[float]] = {k: [] for k in budgets}
    for _ in range(REPS):  # alternate, so a change of machine load hits every variant
        for name, (model, opt, budget) in variants.items():
            times[name].append(update_step(model, opt, mb, budget))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rows": ROWS, "row_lengths": [SHORT, LONG], "real_tokens": real, "padded_tokens_computed": padded_tokens,
            "micro_batch_size": MICRO_ROWS, "micro_batch_tokens": budgets, "attention": attention, "seconds": times,
            "tokens_per_s": {k: real / v for k, v in med.items()},
            "packing_speedup": round(med["padded"] / med["packed"], 3),
            "packing_speedup_sdpa_mask": round(med["padded"] / med["packed_sdpa_mask"], 3),
            "packing_speedup_large_budget": round(med["padded"] / med["packed_large"], 3)}


def peak_rss_mb(checkpointing: bool, tokens: int) -> dict:
    """In this process: RSS added at the peak of one packed update step of `tokens` tokens (MB)."""
    import torch

    from memagent.rl.config import ModelOptions
    from memagent.rl.model_options import prepare_model

    model = prepare_model(build_model(), ModelOptions(gradient_checkpointing=checkpointing))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    mb = batch(seed=1, rows=8, short=tokens // 8, long=tokens // 8)  # 8 rows, one micro-batch of `tokens`
    update_step(model, opt, mb, tokens)  # AdamW states and allocator pools exist from here on

    def status(key: str) -> float:
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) / 1024
        raise RuntimeError(key)

    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    base = status("VmRSS")
    seconds = update_step(model, opt, mb, tokens)
    return {"checkpointing": checkpointing, "tokens": tokens, "base_rss_mb": base,
            "peak_added_mb": status("VmHWM") - base, "seconds": seconds}


def memory(tokens: int = 4096) -> dict:
    out = {}
    for ckpt in (False, True):
        proc = subprocess.run([sys.executable, __file__, "--memory", str(int(ckpt)), str(tokens)], check=True,
                              capture_output=True, text=True)
        out["on" if ckpt else "off"] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["gradient_checkpointing_memory_ratio"] = round(out["on"]["peak_added_mb"] / out["off"]["peak_added_mb"], 3)
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--memory":
        print(json.dumps(peak_rss_mb(bool(int(sys.argv[2])), int(sys.argv[3]))))
        return
    s = speed()
    tps = s["tokens_per_s"]
    print(f"update step, rows {SHORT}-{LONG} tokens: padded {tps['padded']:.0f} tok/s, packed (varlen attention) "
          f"{tps['packed']:.0f} tok/s -> packing_speedup {s['packing_speedup']}; packed with sdpa's block mask "
          f"{tps['packed_sdpa_mask']:.0f} tok/s ({s['packing_speedup_sdpa_mask']}x); budget "
          f"{s['micro_batch_tokens']['packed_large']}: {tps['packed_large']:.0f} tok/s "
          f"({s['packing_speedup_large_budget']}x)")
    m = memory()
    print(f"peak RSS added by an update of {m['on']['tokens']} tokens: checkpointing off {m['off']['peak_added_mb']:.0f} MB, "
          f"on {m['on']['peak_added_mb']:.0f} MB (ratio {m['gradient_checkpointing_memory_ratio']}); step "
          f"{m['off']['seconds']:.2f} s vs {m['on']['seconds']:.2f} s")
    write_result("packing", {"model": MODEL, "speed": s, "memory": m,
                             "headline": {"packing_speedup": s["packing_speedup"],
                                          "packing_speedup_sdpa_mask": s["packing_speedup_sdpa_mask"],
                                          "gradient_checkpointing_memory_ratio": m["gradient_checkpointing_memory_ratio"]}})


if __name__ == "__main__":
    main()

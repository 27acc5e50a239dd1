"""Which step reward lets Multi-Conv DAPO learn the two-hop chain? The two-hop demo's `memagent` model
(demo/two_hop.py: the same warm-up, model, steps, batch and group; `train_workflow` with the demo's own rng, so a
row with the demo's step reward is the demo's memagent-rl) trained with each step reward in turn, evaluated
greedy on the demo's evaluation documents, split by order. Only the step reward and its mix change.

    none            the paper's final-answer reward alone (`--outcome-only`)
    evidence        word shares of the gold facts (ReMemR1-style difference; rewards/step.py)
    evidence-chain  progress along the chain of hops (pointer 1/2, value fact 1)

Run: .venv/bin/python bench/two_hop_rewards.py --seeds 0 --rewards none,evidence,evidence-chain [--mix 0.8] [--scale]
     [--multiples 1,16] [--docs 256] [--threads 1] [--out bench/results/two_hop_rewards.json]
A run adds its rows to --out (one row per seed, reward and mix; a row run again is replaced), so variants can
run side by side in separate processes and be merged. Reward curves (each step's mean outcome reward and step
reward) are kept per row for docs/rewards.md's plot.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, machine

from memagent.demo.evaluate import run_memagent
from memagent.demo.two_hop import EXTRA_WORDS, TwoHopConfig, by_order, train_workflow
from memagent.io import atomic_write_text
from memagent.tasks.toy import build_toy_tokenizer, make_samples


def curves(metrics: Path, step_reward: str) -> dict[str, list[float]]:
    """Each step's mean outcome reward and mean step reward (metrics.jsonl of the RL run)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward" in r]
    out = {"reward": [round(r["reward"], 4) for r in rows]}
    if step_reward:
        out["step_reward"] = [round(r.get(f"step_reward/{step_reward}", float("nan")), 4) for r in rows]
    return out


def run_one(seed: int, step_reward: str, mix: float, scale: bool, multiples: tuple[int, ...],
            docs: int) -> dict[str, Any]:
    import torch  # lazy: torch

    cfg = dataclasses.replace(TwoHopConfig(seed=seed), step_reward=step_reward, step_mix=mix, step_scale=scale)
    tokenizer = build_toy_tokenizer(cfg.spec, EXTRA_WORDS)
    torch.manual_seed(cfg.seed)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = train_workflow(cfg, "memagent", tokenizer, random.Random(f"{seed}-memagent"), Path(tmp))
        found: dict[str, Any] = {"train_s": round(time.perf_counter() - t, 1),
                                 "curves": curves(Path(tmp) / "memagent" / "rl" / "metrics.jsonl", step_reward)}
    found["accuracy"] = {}
    for mult in multiples:
        samples = make_samples(cfg.spec, cfg.train_chunks * mult, docs, seed + 10_000, prefix="eval", two_hop=True)
        acc = by_order(run_memagent(model, tokenizer, samples, cfg.spec), samples)
        found["accuracy"][str(mult)] = {k: round(100 * v, 1) for k, v in acc.items() if v is not None}
        print(f"seed {seed}, {step_reward or 'none'} (a={mix}{', scaled' if scale else ''}), {mult}x: {found['accuracy'][str(mult)]}", flush=True)
    return {"seed": seed, "step_reward": step_reward or "none", "mix": mix, "scale": scale, **found}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--rewards", default="none,evidence,evidence-chain")
    ap.add_argument("--mix", type=float, default=0.8)
    ap.add_argument("--scale", action="store_true", help="divide the centred step rewards by their std")
    ap.add_argument("--multiples", default="1,16")
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=str(RESULTS / "two_hop_rewards.json"))
    a = ap.parse_args()
    if a.threads:
        import torch  # lazy: torch
        torch.set_num_threads(a.threads)
    multiples = tuple(int(m) for m in a.multiples.split(","))
    out = Path(a.out)
    for seed in (int(s) for s in a.seeds.split(",")):
        for name in a.rewards.split(","):
            row = run_one(seed, "" if name == "none" else name, a.mix, a.scale, multiples, a.docs)
            data = json.loads(out.read_text()) if out.exists() else {
                "benchmark": "two_hop_rewards", "machine": machine(), "docs": a.docs, "rows": [],
                "command": "python bench/two_hop_rewards.py --seeds S --rewards R --mix A"}
            same = ("seed", "step_reward", "mix", "scale")
            data["rows"] = [r for r in data["rows"] if [r.get(k) for k in same] != [row[k] for k in same]] + [row]
            atomic_write_text(out, json.dumps(data, indent=2) + "\n")
            print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()

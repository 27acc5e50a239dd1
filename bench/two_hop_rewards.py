"""Which step reward lets Multi-Conv DAPO learn the two-hop chain? The two-hop demo's `memagent` model
(demo/two_hop.py: the same warm-up, model, steps, batch and group; `train_workflow` with the demo's own rng, so a
row with the demo's step reward is the demo's memagent-rl) trained with each step reward in turn, evaluated
greedy on the demo's evaluation documents, split by order. Only the step reward and its mix change.

    none            the paper's final-answer reward alone (`--outcome-only`)
    evidence        word shares of the gold facts (ReMemR1-style difference; rewards/step.py)
    evidence-chain  progress along the chain of hops (pointer 1/2, value fact 1)

Run: .venv/bin/python bench/two_hop_rewards.py --seeds 0 --rewards none,evidence,evidence-chain [--mix 0.8] [--scale] [--steps N]
     [--group G] [--loss-weight W] [--multiples 1,16] [--docs 256] [--threads 1] [--out bench/results/two_hop_rewards.json]
     .venv/bin/python bench/two_hop_rewards.py --merge A.json B.json   (rows of side runs into --out, then the plot)
     .venv/bin/python bench/two_hop_rewards.py --plot-only             (docs/img/two_hop_rewards.png)
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
from two_hop_ceiling import chunk_fact

from memagent.demo.config import EMPTY_MEMORY
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


def actions(model: Any, tokenizer: Any, samples: list[dict[str, Any]], spec: Any) -> dict[str, dict[str, float]]:
    """What the greedy policy does at each kind of decision of the chain, over pointer-first documents (%):
    at the pointer chunk from a memory without a chain fact (copy it?), at the value chunk holding the pointer
    (swap?), at a distractor holding a chain fact (keep?)."""
    picked = [s for s in samples if s["order"] == "pointer-first"]
    results = run_memagent(model, tokenizer, picked, spec, keep_conversations=True)
    tally: dict[str, dict[str, int]] = {}
    size = spec.chunk_tokens  # one toy word a token: chunk i is words [i * size, (i + 1) * size)
    for s, r in zip(picked, results, strict=True):
        a, (b, v) = s["question"], s["evidence"][1].split()
        text, memory = s["context"].split(), EMPTY_MEMORY
        for conv in (c for c in r.conversations if c.kind == "memory"):
            fact = " ".join(chunk_fact(" ".join(text[conv.step * size:(conv.step + 1) * size])))
            if fact == f"{a} {b}" and memory not in (f"{a} {b}", f"{b} {v}"):
                where = "pointer chunk"
            elif fact == f"{b} {v}" and memory == f"{a} {b}":
                where = "value chunk, pointer held"
            elif memory in (f"{a} {b}", f"{b} {v}"):
                where = "distractor, chain fact held"
            else:
                where = None
            if where:
                what = "keep" if conv.text == memory else "copy" if conv.text == fact else "other"
                tally.setdefault(where, {"keep": 0, "copy": 0, "other": 0})[what] += 1
            memory = conv.text
    return {w: {k: round(100 * n / max(1, sum(c.values())), 1) for k, n in c.items()} | {"n": sum(c.values())}
            for w, c in tally.items()}


def run_one(seed: int, step_reward: str, mix: float, scale: bool, steps: int, multiples: tuple[int, ...],
            docs: int, group: int = 0, loss_weight: float | None = None) -> dict[str, Any]:
    import torch  # lazy: torch

    cfg = dataclasses.replace(TwoHopConfig(seed=seed), step_reward=step_reward, step_mix=mix, step_scale=scale,
                              rl_steps=steps or TwoHopConfig.rl_steps, rl_group=group or TwoHopConfig.rl_group,
                              step_reward_options={} if loss_weight is None else {"loss_weight": loss_weight})
    tokenizer = build_toy_tokenizer(cfg.spec, EXTRA_WORDS)
    torch.manual_seed(cfg.seed)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = train_workflow(cfg, "memagent", tokenizer, random.Random(f"{seed}-memagent"), Path(tmp))
        found: dict[str, Any] = {"train_s": round(time.perf_counter() - t, 1),
                                 "curves": curves(Path(tmp) / "memagent" / "rl" / "metrics.jsonl", step_reward)}
    first = make_samples(cfg.spec, cfg.train_chunks, docs, seed + 10_000, prefix="eval", two_hop=True)
    found["actions_1x"] = actions(model, tokenizer, first, cfg.spec)
    print(f"seed {seed}, {step_reward or 'none'}: greedy actions at 1x, pointer-first: {found['actions_1x']}",
          flush=True)
    found["accuracy"] = {}
    for mult in multiples:
        samples = make_samples(cfg.spec, cfg.train_chunks * mult, docs, seed + 10_000, prefix="eval", two_hop=True)
        acc = by_order(run_memagent(model, tokenizer, samples, cfg.spec), samples)
        found["accuracy"][str(mult)] = {k: round(100 * v, 1) for k, v in acc.items() if v is not None}
        print(f"seed {seed}, {step_reward or 'none'} (a={mix}{', scaled' if scale else ''}, {cfg.rl_steps} steps, "
              f"group {cfg.rl_group}), {mult}x: {found['accuracy'][str(mult)]}", flush=True)
    rule = {"rule": "in order"} if step_reward == "evidence-chain" else {}  # the built-in's (rewards/step.py)
    more = {"rl_group": cfg.rl_group} if cfg.rl_group != TwoHopConfig.rl_group else {}  # a budget diagnostic
    more |= {"loss_weight": loss_weight} if loss_weight is not None else {}
    return {"seed": seed, "step_reward": step_reward or "none", "mix": mix, "scale": scale, "rl_steps": cfg.rl_steps,
            **rule, **more, **found}


PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "two_hop_rewards.png"


def plot(data: dict[str, Any], path: Path = PLOT, window: int = 20) -> None:
    """docs/img/two_hop_rewards.png: each run's sampled outcome reward and mean step reward by RL step (moving
    mean over `window` steps), one line a row of the results."""
    import matplotlib  # lazy: matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    def smooth(v: list[float]) -> list[float]:
        return [sum(v[max(0, i - window + 1):i + 1]) / len(v[max(0, i - window + 1):i + 1]) for i in range(len(v))]

    rows = data["rows"]
    legend_h = 0.2 + 0.14 * -(-len(rows) // 3)  # inches: three columns of labels below the plots
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2 + legend_h))
    colours = plt.get_cmap("tab20").colors
    for i, r in enumerate(rows):
        label = f"seed {r['seed']}, {r['step_reward']}" + (" (any gain)" if r.get("rule") == "any gain" else "") + (
            "" if r["step_reward"] == "none" else f", a {r['mix']}") + (", scaled" if r.get("scale") else "") + (
            f", lost hop x{r['loss_weight']:g}" if r.get("loss_weight") is not None else "") + (
            f", {r['rl_steps']} steps") + (f", group {r['rl_group']}" if r.get("rl_group") else "")
        style = dict(color=colours[i % len(colours)], linestyle=("-", "--", ":")[i // len(colours) % 3])
        ax1.plot(smooth(r["curves"]["reward"]), label=label, **style)
        if "step_reward" in r["curves"]:
            ax2.plot(smooth(r["curves"]["step_reward"]), **style)
    ax1.set(title="outcome reward (sampled rollouts)", xlabel="RL step", ylabel=f"mean, {window}-step moving")
    ax2.set(title="step reward per scored update", xlabel="RL step")
    fig.legend(loc="lower center", ncol=3, fontsize=6.5, frameon=False)  # one legend for both, below them
    fig.tight_layout(rect=(0, legend_h / (4.2 + legend_h), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--rewards", default="none,evidence,evidence-chain")
    ap.add_argument("--mix", type=float, default=0.8)
    ap.add_argument("--scale", action="store_true", help="divide the centred step rewards by their std")
    ap.add_argument("--steps", type=int, default=0, help="RL steps (0: the demo's, TwoHopConfig.rl_steps)")
    ap.add_argument("--group", type=int, default=0,
                    help="rollouts per question (0: the demo's); NOT the demo's budget: a diagnostic of it")
    ap.add_argument("--loss-weight", type=float, default=None,
                    help="evidence-chain's loss_weight option (what a lost hop costs; default the built-in's 1)")
    ap.add_argument("--multiples", default="1,16")
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default=str(RESULTS / "two_hop_rewards.json"))
    ap.add_argument("--merge", nargs="*", default=[], help="add the rows of these results files to --out and stop")
    ap.add_argument("--plot-only", action="store_true", help="draw docs/img/two_hop_rewards.png from --out")
    a = ap.parse_args()
    out = Path(a.out)
    if a.merge or a.plot_only:
        data = json.loads(out.read_text()) if out.exists() else None
        for f in a.merge:
            more = json.loads(Path(f).read_text())
            data = data or {**more, "rows": []}
            data["rows"] = [r for r in data["rows"] if r not in more["rows"]] + more["rows"]
        if a.merge and data is not None:
            atomic_write_text(out, json.dumps(data, indent=2) + "\n")
        if data is not None:
            plot(data)
        return
    if a.threads:
        import torch  # lazy: torch
        torch.set_num_threads(a.threads)
    multiples = tuple(int(m) for m in a.multiples.split(","))
    if a.loss_weight is not None and "evidence-chain" not in a.rewards.split(","):
        raise SystemExit("--loss-weight is an option of evidence-chain: add it to --rewards")
    for seed in (int(s) for s in a.seeds.split(",")):
        for name in a.rewards.split(","):
            weight = a.loss_weight if name == "evidence-chain" else None  # an option of evidence-chain alone
            row = run_one(seed, "" if name == "none" else name, a.mix, a.scale, a.steps, multiples, a.docs, a.group,
                          weight)
            data = json.loads(out.read_text()) if out.exists() else {
                "benchmark": "two_hop_rewards", "machine": machine(), "docs": a.docs, "rows": [],
                "command": "python bench/two_hop_rewards.py --seeds S --rewards R --mix A"}
            same = ("seed", "step_reward", "mix", "scale", "rl_steps", "rl_group", "loss_weight")
            data["rows"] = [r for r in data["rows"] if [r.get(k) for k in same] != [row.get(k) for k in same]] + [row]
            atomic_write_text(out, json.dumps(data, indent=2) + "\n")
            print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()

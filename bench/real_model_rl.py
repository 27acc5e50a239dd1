"""Does Multi-Conv DAPO fix a real model? LoRA on SmolLM2-135M-Instruct over short real-haystack NIAH documents.

Training data: RULER `niah_single_2` with Paul Graham's essays (`memagent data ruler --haystack essays`) at
TRAIN_TOKENS tokens, read in chunks of CHUNK tokens with a memory of M tokens (three chunks a document). The
reward is `--reward` (default `string_match_all`: the gold number anywhere in the final reply). The paper's
`boxed` verifier is all zero on this model: it wrote no \\boxed{} in any cell of bench/real_model.py, so every
group's rewards are equal and no update has a signal; `--reward boxed` runs the paper's reward to show it.
Held-out samples (other seeds) at 1x and 4x the training length are evaluated with
`memagent eval --methods memagent` before training (the base folder) and after (`memagent merge-lora` of the
last checkpoint). Reported: reward and rollout accuracy per step (with a 0/1 reward, the mean reward is the share
of rollouts that earn anything: the reward's sparsity), seconds per step, and accuracy before/after at 1x and 4x.

    python bench/real_model_rl.py                  # the full run: 12 steps (about an hour on one core)
    python bench/real_model_rl.py --steps 2 --eval-samples 8    # a smoke run: the time per step and the sparsity

Results: bench/results/real_model_rl.json (with the sizes and the command).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import ROOT, WORK, write_result
from real_model import PY, cell, real_model, sh


def metrics_rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def evaluate(model: Path, data: Path, out: Path, args: argparse.Namespace) -> dict:
    sh([PY, "-m", "memagent.cli", "eval", "--model", model, "--data", data, "--methods", "memagent",
        "--chunk-tokens", args.chunk_tokens, "--memory-tokens", args.memory_tokens, "--answer-tokens",
        args.answer_tokens, "--query-tokens", args.query_tokens, "--device", "cpu", "--dtype", "float32",
        "--batch-docs", 8, "--no-progress", "--out", out], out.with_suffix(".log"))
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return {str(length): cell([r for r in records if r.get("length") == length])
            for length in sorted({r.get("length") for r in records})}


def plot(d: dict, path: Path) -> None:
    """The reward per step, and held-out accuracy before/after (boxed, and the raw reply holding the gold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    rewards = d["reward_per_step"]
    left.plot(range(1, len(rewards) + 1), rewards, marker="o")
    left.set_xlabel("training step")
    left.set_ylabel(f"mean reward ({d['sizes']['reward']})")
    left.set_ylim(-0.05, 1.05)
    lengths = sorted(d["accuracy_before"], key=int)
    xs = range(len(lengths))
    for k, (key, label) in enumerate((("accuracy_before", "before"), ("accuracy_after", "after"))):
        right.bar([x + 0.2 * (2 * k - 1) for x in xs], [d[key][n]["gold_in_raw"] for n in lengths], width=0.4,
                  label=f"{label}: raw reply holds the gold")
        right.plot([x + 0.2 * (2 * k - 1) for x in xs], [d[key][n]["accuracy"] for n in lengths], "kx",
                   label="boxed accuracy" if k else None)
    right.set_xticks(list(xs), [f"{int(n) // d['sizes']['train_tokens']}x ({n} tokens)" for n in lengths])
    right.set_ylabel("held-out NIAH (%)")
    right.set_ylim(0, 100)
    right.legend(fontsize=8)
    fig.suptitle("LoRA Multi-Conv DAPO on SmolLM2-135M-Instruct, real-haystack NIAH")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--train-tokens", type=int, default=256)
    p.add_argument("--chunk-tokens", type=int, default=128)
    p.add_argument("--memory-tokens", type=int, default=32)
    p.add_argument("--answer-tokens", type=int, default=24)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", default="2e-4")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--train-samples", type=int, default=64)
    p.add_argument("--eval-samples", type=int, default=24)
    p.add_argument("--reward", default="string_match_all", help="the outcome reward (memagent.rewards), by name")
    p.add_argument("--plot-only", action="store_true", help="redraw docs/img/real_model_rl.png from the results JSON")
    args = p.parse_args()
    figure = ROOT / "docs" / "img" / "real_model_rl.png"
    if args.plot_only:
        plot(json.loads((ROOT / "bench" / "results" / "real_model_rl.json").read_text()), figure)
        return
    out = WORK / "real-rl"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = real_model()
    train_data, held_out = out / "train.jsonl", out / "held_out.jsonl"
    common = ["--task", "niah_single_2", "--haystack", "essays", "--tokenizer", model]
    sh([PY, "-m", "memagent.cli", "data", "ruler", *common, "--tokens", args.train_tokens, "--samples",
        args.train_samples, "--seed", 0, "--out", train_data], out / "data-train.log")
    sh([PY, "-m", "memagent.cli", "data", "ruler", *common, "--tokens", f"{args.train_tokens},{4 * args.train_tokens}",
        "--samples", args.eval_samples, "--seed", 1, "--out", held_out], out / "data-eval.log")
    before = evaluate(model, held_out, out / "eval-before", args)
    run = out / "run"
    finished = sorted((run / "checkpoints").glob("step_*")) if run.is_dir() else []
    if not (finished and finished[-1].name == f"step_{args.steps:06d}"):  # a finished run is read, not rerun
        sh([PY, "-m", "memagent.cli", "train", "configs/rl/tiny.yaml", f"model={model}", f"data={train_data}",
            f"out_dir={run}", f"total_steps={args.steps}", f"save_every={args.steps}", f"lora.r={args.lora_r}",
            f"lora.alpha={2 * args.lora_r}", f"optim.lr={args.lr}", "optim.warmup_steps=0",
            f"rollout.batch_size={args.batch_size}", f"rollout.group_size={args.group_size}",
            f"update.mini_batch_size={args.batch_size}", "update.packing=true", "update.micro_batch_tokens=4096",
            "update.old_logprobs=rollout", f"agent.chunk_tokens={args.chunk_tokens}",
            f"agent.memory_tokens={args.memory_tokens}", f"agent.answer_tokens={args.answer_tokens}",
            f"agent.query_tokens={args.query_tokens}", f"reward={args.reward}", "--force"], out / "train.log")
    steps = metrics_rows(run)
    train_seconds = sum(float(s.get("step_s", 0.0)) for s in steps)  # the run's own clock, read or just run
    last = sorted((run / "checkpoints").glob("step_*"))[-1]
    merged = out / "merged"
    if merged.exists():
        import shutil

        shutil.rmtree(merged)
    sh([PY, "-m", "memagent.cli", "merge-lora", last, merged], out / "merge.log")
    after = evaluate(merged, held_out, out / "eval-after", args)
    write_result("real_model_rl", {
        "command": "python bench/real_model_rl.py " + " ".join(sys.argv[1:]),
        "sizes": vars(args),
        "reward_per_step": [round(float(s.get("reward", 0.0)), 4) for s in steps],
        "accuracy_per_step": [round(float(s.get("accuracy", 0.0)), 4) for s in steps],
        "steps": [{k: s.get(k) for k in ("step", "reward", "accuracy", "loss", "rollout_s", "generated_tokens",
                                          "step_s", "kept_groups") if k in s} for s in steps],
        "seconds_per_step": round(train_seconds / max(1, len(steps)), 1),
        "accuracy_before": before, "accuracy_after": after,
        "train_seconds": round(train_seconds, 1),
        "seconds_this_invocation": round(time.perf_counter() - t0, 1)})  # a finished training run is not rerun
    plot(json.loads((ROOT / "bench" / "results" / "real_model_rl.json").read_text()), figure)


if __name__ == "__main__":
    main()

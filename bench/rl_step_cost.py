"""One Multi-Conv DAPO step of the real model on CPU: where the time goes, against the compute limit, old vs new.

The step of round 4 (bench/real_model_rl.py: SmolLM2-135M-Instruct, LoRA r 16, 2 questions x group 8, RULER
`niah_single_2` documents of 256 tokens over Paul Graham's essays in chunks of 128, M = 32, answer 24) ran its
rollouts through the policy itself (transformers `generate`) and its update over every row, and took 463 s. Here the
recipe's RL config (configs/rl/smollm2-rl.yaml: LoRA on every linear layer, from the shipped warm-up adapter, so
that rewards differ within groups; kl 0) at those sizes, every group trained (no dynamic sampling: equal work in both
runs), one step each, one after the other:

    old       rollout.engine=policy, update.old_logprobs=rollout, update.skip_zero_advantage=false (round 4's)
    new       rollouts from vLLM's CPU build in process (rollout.engine=vllm: the LoRA policy's merged weights
              synced into the engine first), and the two exact savings: update.skip_zero_advantage (rows of a group
              whose rewards are all equal have advantage 0: no forward, no backward; the token-mean's denominator
              is kept) and update.old_logprobs=policy (one optimiser step a batch: the loss forward's own
              log-probs, ratio 1). Bit-identity of those two is under test (tests/rl/test_step_cost.py). vLLM
              samples with its own generator, so the rollouts, rewards and skipped rows differ from old's.

Each run is `memagent train ... total_steps=1` in a child process that times its phases by wrapping the trainer's
own functions: rollout (collect_rollouts), old log-probs (rows_logprobs), loss forward and backward
(accumulate_gradients, torch.Tensor.backward), the optimiser and the rest. The rollout's prefill is measured by
replaying its prompts through one no-grad forward of the policy (decode = rollout - prefill, for the policy engine).
The compute limit of each phase is tokens x 2 x parameters (x 2 for a backward) over the FLOP/s that a plain fp32
matmul reaches here (measured in the same run). Needs .venv-vllm (make vllm-env) for `new`.

    .venv-vllm/bin/python bench/rl_step_cost.py --runs old,new   # what the results JSON holds (about 10 min)
    .venv-vllm/bin/python bench/rl_step_cost.py                  # also `exact`: the savings with policy rollouts

Results: bench/results/rl_step_cost.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, WORK, beside, machine, write_result

PY = sys.executable
SIZES = dict(train_tokens=256, chunk_tokens=128, memory_tokens=32, answer_tokens=24, query_tokens=64, batch_size=2,
             group_size=8, threads=2)
CONFIG = "configs/rl/smollm2-rl.yaml"  # the recipe's RL: LoRA r 16 on every linear layer, multi_value, T 0.7, kl 0
# lora.init: the shipped adapter (warm-up round 2 when bench/results/rl_step_cost.json was written)
COMMON = ["total_steps=1", "save_every=1", "lora.init=models/smollm2-memagent",
          "rollout.dynamic_sampling=false",  # every group trained, in both runs: equal work whatever the rewards
          f"rollout.batch_size={SIZES['batch_size']}", f"rollout.group_size={SIZES['group_size']}",
          f"update.mini_batch_size={SIZES['batch_size']}", "update.packing=true", "update.micro_batch_tokens=4096",
          f"agent.chunk_tokens={SIZES['chunk_tokens']}", f"agent.memory_tokens={SIZES['memory_tokens']}",
          f"agent.answer_tokens={SIZES['answer_tokens']}", f"agent.query_tokens={SIZES['query_tokens']}", "seed=0",
          "progress=false"]
RUNS = {
    "old": ["rollout.engine=policy", "update.old_logprobs=rollout", "update.skip_zero_advantage=false"],
    "exact": ["rollout.engine=policy", "update.old_logprobs=policy", "update.skip_zero_advantage=true"],
    "new": ["rollout.engine=vllm", "update.old_logprobs=policy", "update.skip_zero_advantage=true"],
}


def matmul_flops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """The fp32 FLOP/s a plain n x n matmul reaches here with `threads` threads (best of `repeats`)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def child(out: Path, train_args: list[str]) -> None:
    """Run `memagent train` in this process with its phases timed; write the phases to out (JSON)."""
    import torch

    import memagent.rl.trainer as trainer
    from memagent.cli import main as cli_main

    phases = {"rollout_s": 0.0, "old_logprobs_s": 0.0, "accumulate_s": 0.0, "backward_s": 0.0}
    tokens = {"prompt": 0, "response": 0, "old_logprobs": 0, "rows": 0}
    captured: list = []

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name] += time.perf_counter() - t0
        return wrapper

    collect, logprobs, accumulate, backward = (trainer.collect_rollouts, trainer.rows_logprobs,
                                               trainer.accumulate_gradients, torch.Tensor.backward)

    def collect_rollouts(*a, **k):
        got = timed("rollout_s", collect)(*a, **k)
        captured.append(got.batch)
        tokens["prompt"] += sum(len(p) for p in got.batch.prompt_ids)
        tokens["response"] += sum(len(r) for r in got.batch.response_ids)
        tokens["rows"] += len(got.batch.prompt_ids)
        return got

    def rows_logprobs(model, prompts, responses, **k):
        tokens["old_logprobs"] += sum(len(p) + len(r) for p, r in zip(prompts, responses))
        return timed("old_logprobs_s", logprobs)(model, prompts, responses, **k)

    trainer.collect_rollouts, trainer.rows_logprobs = collect_rollouts, rows_logprobs
    trainer.accumulate_gradients = timed("accumulate_s", accumulate)
    torch.Tensor.backward = timed("backward_s", backward)
    models: list = []
    init = trainer.MultiConvDAPO.__init__

    def keep_model(self, config, samples, reward_fn, recipe, *a, **k):
        models.append(recipe.model)
        init(self, config, samples, reward_fn, recipe, *a, **k)

    trainer.MultiConvDAPO.__init__ = keep_model
    t0 = time.perf_counter()
    try:
        sys.argv = ["memagent", "train", *train_args]
        cli_main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    total = time.perf_counter() - t0
    torch.Tensor.backward = backward
    # the rollout's prefill, replayed: every prompt through one no-grad forward of the policy (micro-batches of 8)
    prefill = 0.0
    if captured and models:
        model = models[0]
        prompts = captured[0].prompt_ids
        with torch.no_grad():
            for i in range(0, len(prompts), 8):
                part = prompts[i:i + 8]
                width = max(len(p) for p in part)
                ids = torch.tensor([list(p) + [0] * (width - len(p)) for p in part])
                mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in part])
                prefill += _timed(lambda: model(input_ids=ids, attention_mask=mask))
    params = sum(p.numel() for p in models[0].parameters()) if models else 0
    metrics = [json.loads(line) for line in (Path(_arg(train_args, "out_dir")) / "metrics.jsonl").read_text()
               .splitlines() if line.strip()]
    out.write_text(json.dumps({"phases": phases, "tokens": tokens, "prefill_replay_s": prefill, "params": params,
                               "process_s": total, "metrics": metrics[-1]}))


def _arg(args: list[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(key + "="))


def breakdown(r: dict, flops: float, policy: bool) -> dict:
    """Seconds per phase, and each phase's compute limit (tokens x 2 x params, x2 for backward, over flops)."""
    m, ph, tok, p = r["metrics"], r["phases"], r["tokens"], r["params"]
    step = m["step_s"]
    update = m["update_s"]
    loss_forward = ph["accumulate_s"] - ph["backward_s"]
    forward_tokens = tok["prompt"] + tok["response"]
    trained = forward_tokens * (1 - m.get("skipped_rows", 0.0) / max(1, tok["rows"]))  # rows that ran
    limit = lambda t, k=1: round(k * 2 * p * t / flops, 1)  # noqa: E731
    rows = {
        "rollout": {"s": round(ph["rollout_s"], 1), "tokens": forward_tokens, "limit_s": limit(forward_tokens)},
        # the policy engine's prefill, replayed (a vLLM engine's prefill is its own: not split)
        "rollout_prefill_replayed": {"s": round(r["prefill_replay_s"], 1) if policy else None,
                                     "tokens": tok["prompt"], "limit_s": limit(tok["prompt"])},
        "rollout_decode": {"s": round(ph["rollout_s"] - r["prefill_replay_s"], 1) if policy else None,
                           "tokens": tok["response"], "limit_s": limit(tok["response"])},
        "old_logprobs": {"s": round(ph["old_logprobs_s"], 1), "tokens": tok["old_logprobs"],
                         "limit_s": limit(tok["old_logprobs"])},
        "loss_forward": {"s": round(loss_forward, 1), "tokens": round(trained), "limit_s": limit(trained)},
        "backward": {"s": round(ph["backward_s"], 1), "tokens": round(trained), "limit_s": limit(trained, 2)},
        "optimizer_and_rest": {"s": round(update - ph["old_logprobs_s"] - ph["accumulate_s"], 1)},
    }
    return {"step_s": round(step, 1), "rollout_s": round(m["rollout_s"], 1), "update_s": round(update, 1),
            "reward": m.get("reward"), "loss": m.get("loss"), "grad_norm": m.get("grad_norm"),
            "skipped_rows": m.get("skipped_rows"), "rows": tok["rows"], "generated_tokens": m.get("generated_tokens"),
            "phases": rows, "params": p, "process_s": round(r["process_s"], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--child", nargs=2, metavar=("OUT", "ARGS_JSON"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(Path(args.child[0]), json.loads(args.child[1]))
    from real_model import real_model, sh

    work = WORK / "rl-step-cost"
    work.mkdir(parents=True, exist_ok=True)
    model = real_model()
    data = work / "train.jsonl"
    if not data.is_file():
        sh([PY, "-m", "memagent.cli", "data", "ruler", "--task", "niah_single_2", "--haystack", "essays",
            "--tokenizer", model, "--tokens", SIZES["train_tokens"], "--samples", 16, "--seed", 0, "--out", data],
           work / "data.log")
    flops = matmul_flops(SIZES["threads"])
    env = {**os.environ, "OMP_NUM_THREADS": str(SIZES["threads"])}
    runs, seen = {}, {"load_avg_start": os.getloadavg(), "processes_start": beside("rl_step_cost")}
    for name in args.runs.split(","):
        out = work / f"{name}.json"
        train = [CONFIG, f"model={model}", f"data={data}", f"out_dir={work / name}", *COMMON,
                 *RUNS[name], "--force"]
        shutil.rmtree(work / name, ignore_errors=True)  # each run one fresh step
        t0 = time.perf_counter()
        subprocess.run([PY, __file__, "--child", str(out), json.dumps(train)], check=True, cwd=ROOT, env=env)
        runs[name] = {"overrides": RUNS[name], "wall_s": round(time.perf_counter() - t0, 1),
                      "load_avg_after": os.getloadavg()}
        flops = max(flops, matmul_flops(SIZES["threads"]))  # the best this machine gave in this run
    seen.update(load_avg_end=os.getloadavg(), processes_end=beside("rl_step_cost"))
    # every phase's limit at the best FLOP/s measured (before and after the runs)
    results: dict = {name: {**breakdown(json.loads((work / f"{name}.json").read_text()), flops,
                                        "rollout.engine=policy" in RUNS[name]), **info} for name, info in runs.items()}
    for name, r in list(results.items()):
        print(name, json.dumps({k: r[k] for k in ("step_s", "rollout_s", "update_s", "loss")}))
        if name != "old" and "old" in results:
            results[f"ratio_old_over_{name}"] = round(results["old"]["step_s"] / r["step_s"], 2)
    write_result("rl_step_cost", {"command": "python bench/rl_step_cost.py " + " ".join(sys.argv[1:]),
                                  "sizes": SIZES, "config": CONFIG, "overrides": COMMON,
                                  "matmul_gflops": round(flops / 1e9, 1), "beside": seen,
                                  "machine": machine(), "runs": results})


if __name__ == "__main__":
    main()

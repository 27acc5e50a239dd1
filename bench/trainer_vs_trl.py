"""Benchmark 5, the trainer: generated tokens per second of Multi-Conv DAPO steps (memagent.rl)
against TRL's GRPOTrainer (loss_type "dapo") on the same tiny model, the same prompts, the same
group size and the same number of new tokens, on the CPU. Target >= 1.0x.

What each side does (like for like):
- The work is plain prompt -> completion. MemAgent reads an EMPTY document, so its workflow makes
  no memory call: each rollout is exactly one conversation, the final call, whose prompt is the
  final template filled with the question and the initial memory ("No previous memory"). TRL gets
  that same rendered text as a one-message conversational prompt, so both sides apply the same
  chat template and feed the model the same prompt ids (checked below). A document of K chunks
  would give memagent K + 1 conversations per rollout, K of them sequential: different work from
  what GRPOTrainer does, so it is not compared here.
- Per step: B questions x G completions of at most T new tokens, sampled at temperature 1.0,
  top_p 1.0, no top-k, with the same stop tokens; one HF `generate` call on each side (all B*G
  rows in one batch); the same verifier (last \\boxed{} equals a gold answer).
- Update: on-policy, one optimiser step per rollout batch (memagent: rollout.batch_size =
  update.mini_batch_size = B, one micro-batch of B*G rows; TRL: per_device_train_batch_size =
  generation_batch_size = B*G, gradient_accumulation_steps = 1, num_iterations = 1). Token-mean
  loss over the batch (memagent "token-mean", TRL "dapo"), clip 0.2 / 0.28, k3 KL to a frozen
  reference with beta = 1e-3 (both load a reference model and score it), no std scaling of
  advantages (Dr. GRPO: TRL scale_rewards "none"), AdamW lr 1e-6 constant, weight decay 0.01,
  gradient clip 1.0, float32.
- Differences left in, because they are what each trainer does by default: memagent's dual clip
  (c = 3, a few tensor ops) and its old log-probs (a forward pass with the policy before the
  update; TRL skips it when the batch is on-policy and uses the detached current log-probs).

Timing: both trainers run in this process, one after the other, `--rounds` times alternating
(memagent, TRL, memagent, TRL, ...) so a change of machine load hits both; each run does
`--warmup` + `--steps` steps and only the last `--steps` are timed. A step's time is the
interval between consecutive end-of-step callbacks (so it includes each trainer's own per-step
bookkeeping and logging). It splits into
    generate  sampling the completions (memagent: the workflow run; TRL: `_generate_single_turn`)
    score     no-grad forward passes for old / reference log-probs
    update    everything else: loss forward/backward, optimiser, rewards, bookkeeping, logging
The headline `trainer_vs_trl` is memagent tokens/s over TRL tokens/s, each summed over the timed
steps of all rounds. Needs the `bench` extra: pip install -e '.[bench]' (trl, datasets).
Run: .venv/bin/python bench/trainer_vs_trl.py
"""
from __future__ import annotations

import argparse
import logging
import shutil
import time
from contextlib import contextmanager
from typing import Any, Callable

from common import WORK, table, tiny_model, write_result

PHASES = ("generate", "score", "update")


def make_samples(n: int) -> list[dict[str, Any]]:
    """n questions of equal token length over empty documents (answers the tiny model never gets)."""
    return [dict(id=f"q{i}", question=f"What is the special magic number for key {i:04d}?", document="",
                 answers=[str(7000 + i)]) for i in range(n)]


class StepClock:
    """Per-step phase seconds and tokens, from cumulative counters read at each step's end."""

    def __init__(self) -> None:
        self.acc = {p: 0.0 for p in ("generate", "score")}
        self.tokens = 0
        self.steps: list[dict[str, float]] = []
        self._last: tuple[float, dict[str, float], int] | None = None

    def add(self, phase: str, seconds: float) -> None:
        self.acc[phase] += seconds

    def step_end(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            t, acc, tok = self._last
            interval = now - t
            gen, score = self.acc["generate"] - acc["generate"], self.acc["score"] - acc["score"]
            self.steps.append(dict(step_s=interval, generate=gen, score=score, update=interval - gen - score,
                                   tokens=self.tokens - tok))
        self._last = (now, dict(self.acc), self.tokens)

    def start(self) -> None:
        """Mark the start of step 1 (so step 1 also has an interval, dropped later as warm-up)."""
        self._last = (time.perf_counter(), dict(self.acc), self.tokens)


@contextmanager
def patched(obj: Any, name: str, wrapper: Callable[[Callable], Callable]):
    original = getattr(obj, name)
    setattr(obj, name, wrapper(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


def timed(clock: StepClock, phase: str, fn: Callable, when: Callable[[], bool] = lambda: True) -> Callable:
    def inner(*a: Any, **kw: Any) -> Any:
        if not when():
            return fn(*a, **kw)
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            clock.add(phase, time.perf_counter() - t0)
    return inner


def load_model(path: Any) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def run_memagent(path: Any, samples: list[dict[str, Any]], args: argparse.Namespace, seed: int) -> list[dict[str, float]]:
    import memagent.rl.trainer as trainer_mod
    from memagent.config import AgentConfig
    from memagent.rl.config import LossConfig, OptimConfig, RolloutConfig, TrainConfig, UpdateConfig

    B, G, T = args.prompts, args.group, args.new_tokens
    out = WORK / "trainer_vs_trl" / "memagent"
    shutil.rmtree(out, ignore_errors=True)
    cfg = TrainConfig(
        out_dir=str(out), seed=seed, total_steps=args.warmup + args.steps, save_every=0, keep_last=1,
        dtype="float32", device="cpu", progress=False,
        agent=AgentConfig(memory_tokens=T, answer_tokens=T, temperature=1.0, top_p=1.0),
        rollout=RolloutConfig(batch_size=B, group_size=G, max_batch_size=B * G),
        loss=LossConfig(clip_low=0.2, clip_high=0.28, agg="token-mean", kl_coef=1e-3, kl_kind="k3"),
        optim=OptimConfig(lr=1e-6, warmup_steps=0, weight_decay=0.01, grad_clip=1.0),
        update=UpdateConfig(mini_batch_size=B, micro_batch_size=B * G, epochs=1),
    )
    model, tok = load_model(path)
    clock = StepClock()

    def on_step(step: int, rec: dict[str, Any]) -> None:
        clock.add("generate", rec["rollout_s"])
        clock.tokens += rec["generated_tokens"]
        clock.step_end()

    logging.getLogger("memagent.agent.workflow").setLevel(logging.ERROR)  # "document is empty", by design
    with patched(trainer_mod, "rows_logprobs", lambda f: timed(clock, "score", f)):
        clock.start()
        trainer_mod.train(cfg, samples, model=model, tokenizer=tok, callback=on_step)
    return clock.steps[args.warmup:]


def run_trl(path: Any, samples: list[dict[str, Any]], args: argparse.Namespace, seed: int) -> list[dict[str, float]]:
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from memagent.prompts import render
    from memagent.config import AgentConfig
    from memagent.tasks.metrics import boxed_reward

    B, G, T = args.prompts, args.group, args.new_tokens
    agent = AgentConfig()
    rows = [dict(prompt=[{"role": "user", "content": render(agent.final_template, question=s["question"],
                                                             memory=agent.empty_memory)}],
                 answers=s["answers"]) for s in samples]

    def reward(prompts: list, completions: list, answers: list, **_: Any) -> list[float]:
        return [boxed_reward(c[-1]["content"], a) for c, a in zip(completions, answers)]

    out = WORK / "trainer_vs_trl" / "trl"
    shutil.rmtree(out, ignore_errors=True)
    cfg = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, fp16=False, seed=seed, data_seed=seed,
        per_device_train_batch_size=B * G, gradient_accumulation_steps=1, num_generations=G,
        generation_batch_size=B * G, num_iterations=1, max_completion_length=T,
        temperature=1.0, top_p=1.0, top_k=0, loss_type="dapo", beta=1e-3, epsilon=0.2, epsilon_high=0.28,
        scale_rewards="none", learning_rate=1e-6, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.01, max_grad_norm=1.0, max_steps=args.warmup + args.steps, logging_steps=1,
        report_to="none", save_strategy="no", disable_tqdm=True, shuffle_dataset=False,
        dataloader_num_workers=0, log_completions=False,
    )
    model, tok = load_model(path)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok)
    clock = StepClock()

    class Clock(TrainerCallback):
        def on_train_begin(self, *a: Any, **kw: Any) -> None:
            clock.start()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            clock.step_end()

    def count_tokens(fn: Callable) -> Callable:
        def inner(*a: Any, **kw: Any) -> Any:
            completion_ids, logprobs = fn(*a, **kw)
            clock.tokens += sum(len(c) for c in completion_ids)
            return completion_ids, logprobs
        return inner

    trainer.add_callback(Clock())
    trainer.remove_callback(PrinterCallback)  # no per-step dict on stdout (its metrics are still computed)
    with patched(trainer, "_generate_single_turn", lambda f: timed(clock, "generate", count_tokens(f))), \
            patched(trainer, "_get_per_token_logps_and_entropies",
                    lambda f: timed(clock, "score", f, when=lambda: not torch.is_grad_enabled())):
        trainer.train()
    return clock.steps[args.warmup:]


def check_same_prompt(path: Any, sample: dict[str, Any]) -> None:
    """Both sides must feed the model the same prompt ids (same template, same chat rendering)."""
    from memagent.prompts import render
    from memagent.backends.hf import TransformersBackend
    from memagent.config import AgentConfig

    model, tok = load_model(path)
    text = render(AgentConfig().final_template, question=sample["question"], memory=AgentConfig().empty_memory)
    ours = TransformersBackend(model, tok).encode(text)
    theirs = tok.apply_chat_template([[{"role": "user", "content": text}]], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"][0]
    assert ours == list(theirs), "memagent and TRL would feed different prompt ids"


def totals(steps: list[dict[str, float]]) -> dict[str, float]:
    t = {k: sum(s[k] for s in steps) for k in ("step_s", "tokens", *PHASES)}
    t["tokens_per_s"] = t["tokens"] / t["step_s"]
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4, help="B questions per step")
    ap.add_argument("--group", type=int, default=8, help="G completions per question")
    ap.add_argument("--new-tokens", type=int, default=64, help="T, max new tokens per completion")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each trainer")
    args = ap.parse_args()
    import warnings

    import transformers
    import trl

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, raised inside TRL
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = tiny_model()
    samples = make_samples(args.prompts * (args.warmup + args.steps))
    check_same_prompt(path, samples[0])
    runs: dict[str, list[dict[str, float]]] = {"memagent": [], "trl": []}
    for r in range(args.rounds):
        for name, fn in (("memagent", run_memagent), ("trl", run_trl)):
            steps = fn(path, samples, args, seed=r)
            runs[name].extend(steps)
            print(f"round {r + 1} {name}: {totals(steps)['tokens_per_s']:.1f} tokens/s", flush=True)
    res = {k: totals(v) for k, v in runs.items()}
    ratio = res["memagent"]["tokens_per_s"] / res["trl"]["tokens_per_s"]
    rows = []
    for name, t in res.items():
        n = len(runs[name])
        rows.append([name, n, t["tokens"] / n, t["step_s"] / n, t["tokens_per_s"],
                     *[f"{t[p] / n:.3f} s ({100 * t[p] / t['step_s']:.0f}%)" for p in PHASES]])
    table(rows, ["trainer", "steps", "tokens/step", "s/step", "tokens/s", *[f"{p} /step" for p in PHASES]])
    print(f"trainer_vs_trl {ratio:.3f}")
    write_result("trainer_vs_trl", dict(
        config=dict(vars(args), model="tiny (random)", trl=trl.__version__, transformers=transformers.__version__),
        totals=res, steps=runs,
        headline=dict(trainer_vs_trl=round(ratio, 4)), targets=dict(trainer_vs_trl=">= 1.0"),
    ))


if __name__ == "__main__":
    main()

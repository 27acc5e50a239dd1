"""The demo's settings: its prompt templates, `DemoConfig` (every knob of the recipe) and the agent settings
of its memory agents. What was tried for each knob, and why the defaults are these: docs/experiments.md."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memagent.config import AgentConfig
from memagent.eval.baselines import render_baseline
from memagent.io import OutputError, check_output_dir, folder_holds
from memagent.tasks.toy import ToySpec

# Templates: the question comes last, next to where the model starts writing (docs/experiments.md says why).
MEMORY_TEMPLATE = "M {memory} C {chunk} Q {question} >"
FINAL_TEMPLATE = "M {memory} Q {question} >"
FULL_TEMPLATE = "C {context} Q {question} >"
EMPTY_MEMORY = "none none"  # the memory before the first chunk: two tokens, like a fact
METHODS = ("memagent-rl", "memagent-no-rl", "full-context")


@dataclass
class DemoConfig:
    """One demo run. Lengths are in chunks of `spec.chunk_tokens` tokens; rows are (prompt, response) pairs."""

    seed: int = 0  # seeds the data, the models' initialisation and training
    quick: bool = False  # the CI version (`for_run(quick=True)`): also fewer per-step error states (256)
    out: str = "runs/demo"  # the run folder
    spec: ToySpec = field(default_factory=ToySpec)  # the toy task: keys, values, chunk shape
    train_chunks: int = 4  # the training length in chunks (1x); also the full-context model's window
    multiples: tuple[int, ...] = (1, 4, 16, 64, 256)  # evaluation lengths, times the training length
    eval_docs: int = 256  # evaluation documents per length
    hidden: int = 64  # the model's hidden size
    heads: int = 4  # attention heads per attention layer
    warmup_rows: int = 48_000  # warm-up demonstrations (memory updates and answers)
    warmup_lr: float = 3e-3  # warm-up learning rate
    warmup_schedule: str = "constant"  # warm-up lr schedule: constant or cosine (to 0)
    rl_steps: int = 400  # Multi-Conv DAPO steps
    rl_chunks: tuple[int, ...] = ()  # lengths (chunks) of the RL questions, in equal shares; () = train_chunks only
    rl_batch: int = 16  # questions per rollout batch
    rl_group: int = 8  # rollouts per question (the group of the advantage)
    rl_lr: float = 1e-3  # Multi-Conv DAPO learning rate (peak, after 5 warm-up steps)
    rl_mini_batches: int = 4  # optimiser mini-batches per rollout batch (more than one: the clipping acts)
    rl_schedule: str = "cosine"  # Multi-Conv DAPO lr schedule: constant or cosine (to 0)
    rl_kl_coef: float = 0.0  # beta of the k3 KL to the warm-up model (0: none, as in DAPO)
    rl_dynamic_sampling: bool = False  # DAPO: train only on groups whose rewards differ
    rl_sampling_rounds: int = 1  # rounds of rl_batch questions sampled to fill the batch
    fc_rows: int = 48_000  # demonstrations of the full-context baseline
    fc_lr: float | None = 1e-3  # lr of the full-context baseline (None: warmup_lr)
    fc_batch: int = 32  # rows per full-context training step
    p_keep: float = 0.5  # share of warm-up memory updates that keep the old memory (the rest copy a chunk's fact)
    final_share: float = 0.2  # share of answer demonstrations among the warm-up rows
    warmup_batch: int = 32  # rows per warm-up step
    rl_copy_coef: float = 3.0  # NOT in the paper: weight of the value-copy loss mixed into RL (loss.sft_coef); 0 = pure
    rl_copy_rows: int = 16_000  # demonstrations drawn for the value-copy loss (value token only)
    # NOT in the paper: a step reward of each memory update (docs/rewards.md), mixed into memagent's advantages:
    # A = step_mix * A_outcome + (1 - step_mix) * A_step; "" = the final answer's reward alone (the paper's)
    step_reward: str = ""
    step_mix: float = 0.8  # a (ReMemR1's 0.8)
    step_scale: bool = False  # divide the centred step rewards by their std (rl.step_rewards)
    step_reward_options: dict[str, Any] = field(default_factory=dict)  # the step reward's own (e.g. loss_weight)

    @classmethod
    def for_run(cls, quick: bool, seed: int, out: str, pure_dapo: bool = False) -> "DemoConfig":
        """The default recipe, or --quick's; `pure_dapo` drops the value-copy loss (the paper's algorithm alone)."""
        if pure_dapo:
            return dataclasses.replace(cls.for_run(quick, seed, out), rl_copy_coef=0.0)
        if quick:  # the CI version: fewer lengths, documents and steps (and round 1's constant lrs)
            return cls(seed=seed, quick=True, out=out, multiples=(1, 4, 16), eval_docs=64,
                       warmup_rows=24_000, rl_steps=100, rl_schedule="constant", fc_rows=8_000, fc_lr=None)
        return cls(seed=seed, out=out)


def agent_config(spec: ToySpec, temperature: float = 0.0, batch_docs: int = 256) -> Any:
    """The demo's AgentConfig: one toy chunk a call, a two-token memory, the demo's templates."""
    return AgentConfig(chunk_tokens=spec.chunk_tokens, memory_tokens=2, answer_tokens=3, query_tokens=4,
                       memory_template=MEMORY_TEMPLATE, final_template=FINAL_TEMPLATE, empty_memory=EMPTY_MEMORY,
                       temperature=temperature, max_batch_docs=batch_docs)


def full_prompt(question: str, context: str) -> str:
    """The full-context baseline's prompt over a whole (already cut) document."""
    return render_baseline(question, context, FULL_TEMPLATE)


def boxed(value: str) -> str:
    """An answer as the demo's models write it."""
    return "\\boxed{ " + value + " }"


def check_demo_out(out: str) -> Path:
    """`demo --out`, checked before any work: given (an empty path is not the working folder), a folder that
    can be written, and not a model's folder (the demo writes results.json and model/ there; `train` refuses
    a model's folder the same way). An earlier demo's folder is fine: a rerun writes over its results."""
    p = check_output_dir(out, "--out")
    if folder_holds(p) == "a model":
        raise OutputError(f"--out {out} holds a model; the demo writes its run there (results.json, model/, ...). "
                          "Choose another folder, e.g. runs/demo")
    return p

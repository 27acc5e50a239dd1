"""`memagent train`, `memagent demo` and `memagent tiny-model`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from memagent.backends.tiny import build_tiny_model
from memagent.cli.app import app, int_list
from memagent.cli.params import options_command
from memagent.config import ConfigError, rule
from memagent.demo.config import check_demo_out
from memagent.demo.numerics import pin_mkl_branch
from memagent.demo.pipeline import DemoConfig, run_demo
from memagent.demo.seeds import markdown, run_seeds
from memagent.demo.two_hop import TwoHopConfig, run_two_hop
from memagent.demo.updates import UpdatesConfig
from memagent.demo.updates_eval import run_updates
from memagent.flags import flag, seed_rule
from memagent.io import check_output_dir, refuse_files, refuse_occupied
from memagent.lock import run_lock
from memagent.protocol.profile import dump_profile, load_profile, training_profile
from memagent.rewards.registry import check_reward_name


TINY_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
                    "merges.txt")  # what build_tiny_model writes into DIR


@dataclass(frozen=True)
class TinyModelOptions:
    """The options of `memagent tiny-model`."""

    out_dir: str = field(metadata=flag("Directory to write the model and tokenizer to.", argument=True))
    seed: int = field(default=0, metadata={**seed_rule(), **flag("Seed of the random weights.")})
    force: bool = field(default=False, metadata=flag("Overwrite a model or run already in DIR."))


@app.command("tiny-model")
@options_command(TinyModelOptions)
def tiny_model(o: TinyModelOptions) -> None:
    """Write a tiny randomly initialised Qwen2 model + byte-level tokenizer (safetensors)."""
    out = check_output_dir(o.out_dir, "DIR")
    refuse_occupied(out, "DIR", o.force)
    refuse_files(out, TINY_MODEL_FILES, "DIR", o.force)  # e.g. an unrelated config.json there
    path = build_tiny_model(out, seed=o.seed)
    typer.echo(f"wrote a tiny model to {path}")


@dataclass(frozen=True)
class TrainOptions:
    """The options of `memagent train`."""

    config: Path = field(metadata=flag("YAML file of TrainConfig fields (see memagent.rl.config).", argument=True))
    overrides: Optional[list[str]] = field(default=None, metadata=flag(
        "key=value overrides, dotted for nested fields: loss.kl_coef=0 rollout.group_size=8", argument=True))
    resume: bool = field(default=False, metadata=flag("Continue from the latest checkpoint in out_dir."))
    profile: Optional[Path] = field(default=None, metadata=flag(
        "Protocol profile (YAML): its prompts and budgets set agent.*; agent.* overrides win. Written to "
        "out_dir/profile.yaml."))
    force: bool = field(default=False, metadata=flag("Write into an out_dir that holds a model or another run."))
    dry_run: bool = field(default=False, metadata=flag(
        "Print the per-GPU memory estimate and steps per epoch; train nothing (no GPU, no weights)."))
    gpus: int = field(default=1, metadata={**rule(min=1), **flag(
        "With --dry-run: the GPU count (torchrun --nproc-per-node) to shard over.")})
    samples: Optional[int] = field(default=None, metadata={**rule(min=1), **flag(
        "With --dry-run: training samples (default: the data file's lines).")})


@app.command("train", context_settings={"help_option_names": ["-h", "--help"]})
@options_command(TrainOptions)
def train_cmd(o: TrainOptions) -> None:
    """Train with Multi-Conv DAPO. Several processes: torchrun --nproc-per-node N -m memagent.cli train ..."""
    from memagent.rl.config import build_train_config  # lazy: torch
    from memagent.rl.estimate import dry_run_report  # lazy: torch
    from memagent.rl.trainer import run_train  # lazy: torch

    chosen = load_profile(o.profile) if o.profile else None
    cfg = build_train_config(o.config, o.overrides, resume=o.resume, force=o.force, profile=chosen)
    if o.dry_run:
        line = dry_run_report(cfg, o.gpus, o.samples)
    else:
        line = run_train(cfg, dump_profile(training_profile(cfg, chosen)))
    if line:
        typer.echo(line)


@dataclass(frozen=True)
class WarmupOptions:
    """The options of `memagent warmup`."""

    config: Path = field(metadata=flag("YAML file of WarmupConfig fields (memagent.rl.warmup; e.g. "
                                       "configs/rl/smollm2-warmup.yaml).", argument=True))
    overrides: Optional[list[str]] = field(default=None, metadata=flag(
        "key=value overrides, dotted for nested fields: epochs=2 lora.r=8 optim.lr=1e-3", argument=True))
    resume: bool = field(default=False, metadata=flag("Continue from the latest checkpoint in out_dir."))
    force: bool = field(default=False, metadata=flag("Write into an out_dir that holds a model or another run."))


@app.command("warmup", context_settings={"help_option_names": ["-h", "--help"]})
@options_command(WarmupOptions)
def warmup_cmd(o: WarmupOptions) -> None:
    """Supervised warm-up on demonstrations (memagent data warmup), before Multi-Conv DAPO (lora.init)."""
    from memagent.rl.warmup import load_warmup_config, run_warmup  # lazy: torch

    typer.echo(run_warmup(load_warmup_config(o.config, o.overrides, resume=o.resume, force=o.force)))


DEMO_TASKS = ("single-hop", "two-hop", "updates")


def _seed_list(text: Optional[str], flag: str) -> Optional[list[int]]:
    return None if text is None else int_list(text, flag, minimum=0)


@dataclass(frozen=True)
class DemoOptions:
    """The options of `memagent demo`, one flag per field."""

    quick: bool = field(default=False, metadata=flag("The reduced version (CI): fewer lengths, documents and steps."))
    seed: int = field(default=0, metadata={**seed_rule(), **flag("Seed of data, initialisation and sampling.")})
    out: str = field(default="runs/demo", metadata=flag("Directory for results.json, accuracy.png and model/."))
    seeds: Optional[list[int]] = field(default=None, metadata={**seed_rule(), **flag(
        "Run every seed of this list (e.g. 200,201,202,203,204, the evaluation seeds, "
        "memagent.demo.seeds.EVALUATION_SEEDS) into OUT/seed-S and write OUT/seeds.md: mean ± sd (min).",
        parse=_seed_list)})
    jobs: int = field(default=1, metadata={**rule(min=1), **flag(
        "With --seeds: seeds run at once (the cores are shared out).")})
    pure_dapo: bool = field(default=False, metadata=flag(
        "The ablation: Multi-Conv DAPO alone, without the demo's value-copy loss (rl_copy_coef 0)."))
    outcome_only: bool = field(default=False, metadata=flag(
        "two-hop: train memagent on the final answer's reward alone (the paper's), without the evidence step "
        "reward (docs/rewards.md)."))
    step_reward: Optional[str] = field(default=None, metadata=flag(
        "memagent's step reward (docs/rewards.md; NOT in the paper), e.g. evidence or evidence-chain; none = the "
        "final answer's reward alone. Default: none for single-hop, the two-hop demo's own (TwoHopConfig)."))
    step_mix: float = field(default=DemoConfig.step_mix, metadata={**rule(min=0, max=1), **flag(
        "With a step reward: a in A = a * A_outcome + (1 - a) * A_step.")})
    task: str = field(default="single-hop", metadata={**rule(choices=DEMO_TASKS), **flag(
        "single-hop: the paper's demo; two-hop: memagent and lookup trained side by side, with skim and "
        "full-context, split by order (docs/demo.md); updates: keys reassigned along a stream, the current value "
        "asked, with rag-bm25 and the standing-question path (docs/streams.md).")})


@app.command()
@options_command(DemoOptions)
def demo(o: DemoOptions) -> None:
    """The paper reproduced at CPU scale: toy task, warm-up (no-RL ablation), Multi-Conv DAPO,
    full-context baseline, length sweep, table."""
    if o.outcome_only and o.task != "two-hop":
        raise ConfigError("--outcome-only is a flag of --task two-hop (single-hop: --step-reward chooses one)")
    if o.outcome_only and o.step_reward not in (None, "none"):
        raise ConfigError(f"--outcome-only and --step-reward {o.step_reward} contradict each other; give one")
    if (o.outcome_only or o.step_reward == "none") and o.step_mix != DemoConfig.step_mix:
        raise ConfigError(f"--step-mix {o.step_mix} mixes a step reward into the advantages, but "
                          f"{'--outcome-only' if o.outcome_only else '--step-reward none'} trains without one; give one")
    steps = demo_step_reward(o)
    if o.task != "single-hop" and o.seeds is not None:
        raise ConfigError(f"--seeds runs the single-hop demo only; run --task {o.task} once per --seed")
    out = check_demo_out(o.out)
    pin_mkl_branch()  # before any tensor work: the same table on every machine of a kind (demo/numerics.py)
    if o.seeds is not None:
        summary = run_seeds(o.seeds, out, quick=o.quick, jobs=o.jobs, log=lambda m: typer.echo(m, err=True),
                            pure_dapo=o.pure_dapo, step_reward=o.step_reward, step_mix=o.step_mix)
        typer.echo(markdown(summary))
        return
    with run_lock(out, "demo"):  # one demo per --out
        if o.task == "two-hop":
            run_two_hop(dataclasses.replace(TwoHopConfig.for_run(o.quick, o.seed, str(out), pure_dapo=o.pure_dapo,
                                                                 outcome_only=o.outcome_only), **steps))
            return
        if o.task == "updates":
            run_updates(dataclasses.replace(UpdatesConfig.for_run(o.quick, o.seed, str(out), pure_dapo=o.pure_dapo),
                                            **steps))
            return
        run_demo(dataclasses.replace(DemoConfig.for_run(o.quick, o.seed, str(out), pure_dapo=o.pure_dapo), **steps))


def demo_step_reward(o: DemoOptions) -> dict[str, object]:
    """The DemoConfig fields --step-reward and --step-mix set (step_reward only when given), the name checked."""
    steps: dict[str, object] = {"step_mix": o.step_mix}
    if o.step_reward is not None:
        name = "" if o.step_reward == "none" else o.step_reward
        if name:
            check_reward_name(name, "step", "--step-reward")
        steps["step_reward"] = name
    return steps


@dataclass(frozen=True)
class MergeLoraOptions:
    """The options of `memagent merge-lora`."""

    checkpoint: Path = field(metadata=flag(
        "A LoRA run's checkpoint (RUN/checkpoints/step_*) or its model/ folder.", argument=True))
    out_dir: Path = field(metadata=flag("Directory to write the merged model (save_pretrained) to.", argument=True))
    base: Optional[str] = field(default=None, metadata=flag(
        "The base model (default: the one the adapters name, else the `model` of the run's config.json)."))
    force: bool = field(default=False, metadata=flag("Overwrite a model or run already in OUT_DIR."))


@app.command("merge-lora")
@options_command(MergeLoraOptions)
def merge_lora_cmd(o: MergeLoraOptions) -> None:
    """Merge a LoRA run's adapters into its base model: a full checkpoint that loads with from_pretrained."""
    from memagent.rl.lora import merge_lora  # lazy: torch

    check_output_dir(o.out_dir, "OUT_DIR", {"CHECKPOINT": o.checkpoint})
    refuse_occupied(o.out_dir, "OUT_DIR", o.force)
    typer.echo(f"wrote the merged model to {merge_lora(o.checkpoint, o.out_dir, o.base)}")

"""`memagent train`, `memagent demo` and `memagent tiny-model`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from memagent.cli.app import app, int_list


TINY_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
                    "merges.txt")  # what build_tiny_model writes into DIR


@app.command("tiny-model")
def tiny_model(
    out_dir: str = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    force: bool = typer.Option(False, "--force", help="Overwrite a model or run already in DIR."),
) -> None:
    """Write a tiny randomly initialised Qwen2 model + byte-level tokenizer (safetensors)."""
    from memagent.backends.tiny import build_tiny_model
    from memagent.flags import check_flags
    from memagent.io import check_output_dir, refuse_files, refuse_occupied

    check_flags(dict(seed=seed))
    out = check_output_dir(out_dir, "DIR")
    refuse_occupied(out, "DIR", force)
    refuse_files(out, TINY_MODEL_FILES, "DIR", force)  # e.g. an unrelated config.json there
    path = build_tiny_model(out, seed=seed)
    typer.echo(f"wrote a tiny model to {path}")



@app.command("train", context_settings={"help_option_names": ["-h", "--help"]})
def train_cmd(
    config: Path = typer.Argument(..., help="YAML file of TrainConfig fields (see memagent.rl.config)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, dotted for nested fields: loss.kl_coef=0 rollout.group_size=8"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in out_dir."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Protocol profile (YAML): its prompts and budgets set agent.*; agent.* overrides win. Written to out_dir/profile.yaml."),
    force: bool = typer.Option(False, "--force", help="Write into an out_dir that holds a model or another run."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the per-GPU memory estimate and steps per epoch; train nothing (no GPU, no weights)."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="With --dry-run: the GPU count (torchrun --nproc-per-node) to shard over."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="With --dry-run: training samples (default: the data file's lines)."),
) -> None:
    """Train with Multi-Conv DAPO. Several processes: torchrun --nproc-per-node N -m memagent.cli train ..."""
    from memagent.profile import load_profile, train_config_with_profile, write_profile
    from memagent.config import ConfigError
    from memagent.rl.config import check_out_dir, load_config, parse_overrides
    from memagent.rl.trainer import train

    cfg = load_config(config, list(overrides or []) + (["resume=true"] if resume else [])
                      + (["force=true"] if force else []))
    explicit = set(parse_overrides(list(overrides or [])).get("agent", {}))
    cfg, resolved = train_config_with_profile(cfg, load_profile(profile) if profile else None, explicit)
    if dry_run:
        from memagent.rl.estimate import dry_run_report

        typer.echo(dry_run_report(cfg, gpus, samples))
        return
    check_out_dir(cfg)  # before anything is written there (the model's own folder is refused)
    if cfg.data and not Path(cfg.data).is_file():
        raise ConfigError(f"data file {cfg.data} does not exist; give a JSONL of {{id, question, answers, context}}")
    if cfg.resume:  # other settings or data than the run's: refused before profile.yaml is rewritten
        from memagent.rl.config import config_to_dict
        from memagent.rl.resume_guard import check_resume_dir, file_digest

        check_resume_dir(cfg.out_dir, config_to_dict(cfg), file_digest(cfg.data.path) if cfg.data else None)
    from contextlib import nullcontext

    from memagent.lock import run_lock

    main = int(os.environ.get("RANK", "0")) == 0
    with run_lock(cfg.out_dir, "training run", reenter=True) if main else nullcontext():  # refused before profile.yaml is written
        if main:
            write_profile(resolved, Path(cfg.out_dir) / "profile.yaml")
        result = train(cfg)  # the trainer takes the same lock again (re-entrant in this process)
    if result.checkpoint is not None and int(os.environ.get("RANK", "0")) == 0:
        typer.echo(f"trained {len(result.metrics)} step(s); checkpoint: {result.checkpoint}")



@app.command()
def demo(
    quick: bool = typer.Option(False, "--quick", help="The reduced version (CI): fewer lengths, documents and steps."),
    seed: int = typer.Option(0, "--seed", help="Seed of data, initialisation and sampling."),
    out: str = typer.Option("runs/demo", "--out", help="Directory for results.json, accuracy.png and model/."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Run every seed of this list (e.g. 100,101,102,103,104, "
                                        "the evaluation seeds) into OUT/seed-S and write OUT/seeds.md: mean ± sd (min)."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="With --seeds: seeds run at once (the cores are shared out)."),
    pure_dapo: bool = typer.Option(False, "--pure-dapo", help="The ablation: Multi-Conv DAPO alone, without the "
                                   "demo's value-copy loss (rl_copy_coef 0)."),
    task: str = typer.Option("single-hop", "--task", help="single-hop: the paper's demo; two-hop: memagent and "
                             "lookup trained side by side, with skim and full-context, split by order (docs/demo.md)."),
) -> None:
    """The paper reproduced at CPU scale: toy task, warm-up (no-RL ablation), Multi-Conv DAPO,
    full-context baseline, length sweep, table."""
    from memagent.config import ConfigError
    from memagent.demo.config import check_demo_out

    if task not in ("single-hop", "two-hop"):
        raise ConfigError(f"--task must be single-hop or two-hop, got {task!r}; pass one of them")
    if task == "two-hop" and seeds is not None:
        raise ConfigError("--seeds runs the single-hop demo only; run --task two-hop once per --seed")
    out = check_demo_out(out)
    from memagent.demo.numerics import pin_mkl_branch

    pin_mkl_branch()  # before any tensor work: the same table on every machine of a kind (demo/numerics.py)
    if seeds is not None:
        from memagent.demo.seeds import run_seeds

        summary = run_seeds(int_list(seeds, "--seeds", minimum=0), out, quick=quick, jobs=jobs,
                            log=lambda m: typer.echo(m, err=True), pure_dapo=pure_dapo)
        from memagent.demo.seeds import markdown

        typer.echo(markdown(summary))
        return
    from memagent.demo.pipeline import DemoConfig, run_demo
    from memagent.flags import check_flags

    check_flags(dict(seed=seed))
    from memagent.lock import run_lock

    with run_lock(out, "demo"):  # one demo per --out
        if task == "two-hop":
            from memagent.demo.two_hop import TwoHopConfig, run_two_hop

            run_two_hop(TwoHopConfig.for_run(quick, seed, str(out), pure_dapo=pure_dapo))
            return
        run_demo(DemoConfig.for_run(quick, seed, str(out), pure_dapo=pure_dapo))



@app.command("merge-lora")
def merge_lora_cmd(
    checkpoint: Path = typer.Argument(..., help="A LoRA run's checkpoint (RUN/checkpoints/step_*) or its model/ folder."),
    out_dir: Path = typer.Argument(..., help="Directory to write the merged model (save_pretrained) to."),
    base: Optional[str] = typer.Option(None, "--base", help="The base model (default: the one the adapters name, "
                                       "else the `model` of the run's config.json)."),
    force: bool = typer.Option(False, "--force", help="Overwrite a model or run already in OUT_DIR."),
) -> None:
    """Merge a LoRA run's adapters into its base model: a full checkpoint that loads with from_pretrained."""
    from memagent.io import check_output_dir, refuse_occupied
    from memagent.rl.lora import merge_lora

    check_output_dir(out_dir, "OUT_DIR", {"CHECKPOINT": checkpoint})
    refuse_occupied(out_dir, "OUT_DIR", force)
    typer.echo(f"wrote the merged model to {merge_lora(checkpoint, out_dir, base)}")

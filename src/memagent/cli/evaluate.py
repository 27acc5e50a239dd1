"""`memagent eval`, `memagent flops` and `memagent profile ...`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from memagent.cli.app import app, int_list
from memagent.cli.params import options_command
from memagent.cli.eval_command import EvalOptions, run_eval
from memagent.eval.flops import DEFAULT_LENGTHS, flops_report
from memagent.flags import flag
from memagent.io import check_output_file
from memagent.protocol.profile import write_profile
from memagent.protocol.reference import check_reference_out, profile_from_reference
from memagent.scale.executor import ray_executor

profile_app = typer.Typer(no_args_is_help=True, help="Protocol profiles: every setting that changes a score, in one YAML file.")
app.add_typer(profile_app, name="profile")


@dataclass(frozen=True)
class FromReferenceOptions:
    """The options of `memagent profile from-reference`."""

    path: Path = field(metadata=flag("Root of your checkout of github.com/BytedTsinghua-SIA/MemAgent.", argument=True))
    out: str = field(metadata=flag("YAML profile to write (outside the checkout)."))
    protocol: str = field(default="phrase", metadata=flag("Final-answer protocol of the run: phrase (Table 1) | boxed."))
    baseline_input_tokens: Optional[int] = field(default=None, metadata=flag(
        "Baselines' prompt limit (default: the checkout's MAX_INPUT_LEN, 120000; 990000 for the 1M models)."))
    yarn_factor: Optional[float] = field(default=None, metadata=flag(
        "YaRN rope scaling of the model (e.g. 4.0 for a 128K Qwen2.5)."))


@profile_app.command("from-reference")
@options_command(FromReferenceOptions)
def profile_from_reference_cmd(o: FromReferenceOptions) -> None:
    """Build the official evaluation profile from a checkout of the official repository (read with ast, never run)."""
    out = check_reference_out(o.path, o.out)
    profile = profile_from_reference(o.path, o.protocol, o.baseline_input_tokens, o.yarn_factor)
    typer.echo(f"wrote the official {o.protocol} profile to {write_profile(profile, out)}")


@dataclass(frozen=True)
class FlopsOptions:
    """The options of `memagent flops`."""

    model: list[str] = field(default_factory=lambda: ["qwen2.5-7b"], metadata=flag(
        "Preset (qwen2.5-7b, qwen2.5-14b) or a config.json / model dir; repeatable."))
    lengths: Optional[list[int]] = field(default=None, metadata=flag(
        "Context lengths (default 8K ... 4M, doubling).", parse=int_list))
    as_json: bool = field(default=False, metadata=flag("Print JSON instead of a table.", "--json"))
    plot: Optional[Path] = field(default=None, metadata=flag("Write a PNG of FLOPs against length."))


@app.command()
@options_command(FlopsOptions)
def flops(o: FlopsOptions) -> None:
    """The paper's FLOP comparison of full attention and MemAgent."""
    if o.plot is not None:
        check_output_file(o.plot, "--plot", {f"--model {m}": _model_config(m) for m in o.model})
        if o.plot.suffix.lower() not in ("", ".png", ".pdf", ".svg"):
            raise typer.BadParameter(f"{o.plot.name}: write a .png, .pdf or .svg", param_hint="--plot")
    report = flops_report(o.model, o.lengths or DEFAULT_LENGTHS, o.as_json, o.plot)
    if o.as_json:
        typer.echo(report)
    else:
        Console().print(report)


def _model_config(model: str) -> Optional[Path]:
    """The config.json a --model names (the file itself, or the one in a model folder); None for a preset."""
    p = Path(model)
    return p / "config.json" if p.is_dir() else p if p.is_file() else None




@app.command("eval")
@options_command(EvalOptions)
def eval_(o: EvalOptions) -> None:
    """Score methods over tasks and lengths; writes results.jsonl, table.md (paper Table 1) and plots."""
    if o.ray.address is None:
        typer.echo(run_eval(o))
    else:  # the same sweep, its units on Ray actors (memagent[ray]): the command chooses the executor
        typer.echo(run_eval(o, ray_executor(o.model, o.backend, o.ray)))

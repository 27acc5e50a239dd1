"""`memagent model import`: a GGUF file (llama.cpp's single-file format) as an ordinary model folder."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import typer

from memagent.backends.gguf import check_gguf, import_gguf
from memagent.cli.app import app
from memagent.cli.params import options_command
from memagent.flags import flag
from memagent.io import check_output_dir, refuse_occupied

model_app = typer.Typer(help="Model files: import a GGUF file as a model folder every command loads fast.",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")


@dataclass(frozen=True)
class ModelImportOptions:
    """The options of `memagent model import`."""

    file: Path = field(metadata=flag("The GGUF file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf).", argument=True))
    out: Path = field(metadata=flag("The folder to write (config.json, model.safetensors, tokenizer, chat "
                                    "template); it must not exist or be empty."))


@model_app.command("import")
@options_command(ModelImportOptions)
def import_cmd(o: ModelImportOptions) -> None:
    """Convert a GGUF file into a model folder (float32 safetensors, its tokenizer and chat template)."""
    check_gguf(o.file)  # a bad file: one error before anything is written
    out = check_output_dir(o.out, "--out", {"FILE": o.file})
    refuse_occupied(out, "--out", False)
    if out.exists():
        if any(out.iterdir()):
            raise FileExistsError(f"--out {out} is not empty; give a new folder")
        out.rmdir()  # import_gguf renames its finished folder into place
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    import_gguf(o.file, out, progress=say)
    typer.echo(f"wrote the model folder {out} (load it with --model {out})")

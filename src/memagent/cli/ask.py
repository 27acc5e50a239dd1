"""`memagent ask`, `memagent serve` and `memagent report`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from memagent.ask import AskOptions, run_ask
from memagent.cli.app import app
from memagent.cli.params import options_command
from memagent.io import given_path
from memagent.serve.main import ServeOptions, run_serve
from memagent.timeline.report import write_report


@app.command()
@options_command(AskOptions)
def ask(o: AskOptions) -> None:
    """Answer a question over a document of any length (or many, with --input)."""
    run_ask(o)


@app.command("report")
def report_cmd(
    trace: Path = typer.Argument(..., help="A JSONL trace (`ask --trace FILE`)."),
    out: str = typer.Option(..., "--out", help="HTML file to write (one self-contained file)."),
    doc: Optional[str] = typer.Option(None, "--doc", help="Only this document (its doc_id); default: every document."),
) -> None:
    """The memory timeline of a trace as one static HTML file: each chunk, the memory after it, what changed."""
    n = write_report(trace, given_path(out, "--out", "file path"), doc)
    typer.echo(f"wrote the timeline of {n} document(s) to {out}", err=True)



@app.command()
@options_command(ServeOptions)
def serve(o: ServeOptions) -> None:
    """Serve long-document QA over HTTP: OpenAI chat completions, jobs with live events, and the page at /."""
    run_serve(o)

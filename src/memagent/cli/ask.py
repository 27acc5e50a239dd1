"""`memagent ask`, `memagent serve` and `memagent report`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from memagent.ask import AskOptions, run_ask
from memagent.cli.app import app
from memagent.cli.params import options_command
from memagent.flags import flag
from memagent.io import given_path
from memagent.serve.main import ServeOptions, run_serve
from memagent.serve.page import page_assets
from memagent.timeline.report import write_report


@app.command()
@options_command(AskOptions)
def ask(o: AskOptions) -> None:
    """Answer a question over a document of any length (or many, with --input)."""
    run_ask(o)


@dataclass(frozen=True)
class ReportOptions:
    """The options of `memagent report`."""

    trace: Path = field(metadata=flag("A JSONL trace (`ask --trace FILE`).", argument=True))
    out: str = field(metadata=flag("HTML file to write (one self-contained file)."))
    doc: Optional[str] = field(default=None, metadata=flag("Only this document (its doc_id); default: every document."))


@app.command("report")
@options_command(ReportOptions)
def report_cmd(o: ReportOptions) -> None:
    """The memory timeline of a trace as one static HTML file: each chunk, the memory after it, what changed."""
    n = write_report(o.trace, given_path(o.out, "--out", "file path"), o.doc, assets=page_assets())
    typer.echo(f"wrote the timeline of {n} document(s) to {o.out}", err=True)


@app.command()
@options_command(ServeOptions)
def serve(o: ServeOptions) -> None:
    """Serve long-document QA over HTTP: OpenAI chat completions, jobs with live events, and the page at /."""
    run_serve(o)

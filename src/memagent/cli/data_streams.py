"""`memagent data import --format longmemeval|locomo|memoryagentbench` and `memagent data streams`: long-term-memory
benchmarks as streams (memagent.streams.formats, memagent.streams.samples; docs/streams.md). Registered by
memagent.cli.data."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import typer

from memagent.config import rule
from memagent.flags import flag, seed_rule
from memagent.io import check_output_file
from memagent.streams.formats import FORMATS, read_conversations
from memagent.streams.samples import look_alikes, write_conversations

FORMAT_HELP = (f"{' | '.join(FORMATS)}: a long-term-memory benchmark's released file, written as one stream file per "
               "conversation beside --out (OUT.streams/) and one sample per question (docs/streams.md); "
               "default: the formats of docs/data.md, detected.")


def import_benchmark(src: Path, fmt: str, out: str) -> None:
    """`data import --format FMT SRC --out OUT.jsonl`."""
    if out == "-":
        raise typer.BadParameter("a benchmark is written as files beside --out; give a file path", param_hint="--out")
    check_output_file(out, "--out", {"SRC": src})
    streams, questions = write_conversations(read_conversations(src, fmt), out)
    typer.echo(f"read {src} as {fmt}; wrote {streams} streams to {Path(out).with_suffix('')}.streams/ and "
               f"{questions} questions to {out}", err=True)


@dataclass(frozen=True)
class StreamsOptions:
    """The options of `memagent data streams`."""

    out: str = field(metadata=flag("JSONL file to write (its streams go to OUT.streams/ beside it)."))
    conversations: int = field(default=20, metadata={**rule(min=1, max=100_000), **flag("Conversations (streams).")})
    sessions: int = field(default=8, metadata={**rule(min=1, max=10_000), **flag("Sessions per conversation.")})
    seed: int = field(default=0, metadata={**seed_rule(), **flag("Same seed, same files.")})


def write_look_alikes(o: StreamsOptions) -> None:
    """`data streams`: multi-session chats whose facts change over time, with typed questions and evidence."""
    check_output_file(o.out, "--out", {})
    streams, questions = write_conversations(look_alikes(o.conversations, o.sessions, o.seed), o.out)
    typer.echo(f"wrote {streams} streams to {Path(o.out).with_suffix('')}.streams/ and {questions} questions to "
               f"{o.out}", err=True)

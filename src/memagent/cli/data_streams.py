"""`memagent data import --format longmemeval|locomo|memoryagentbench` and `memagent data streams`: long-term-memory
benchmarks as streams (memagent.streams.formats, memagent.streams.samples; docs/streams.md); `memagent data judge`:
their LLM-judged scores, an eval run's answers graded by the judge reward (memagent.eval.judged). Registered by
memagent.cli.data."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from memagent.config import rule
from memagent.errors import InputError
from memagent.eval.judged import judge_results
from memagent.flags import flag, seed_rule
from memagent.io import check_output_file
from memagent.streams.formats import FORMATS, read_conversations
from memagent.rewards.registry import build_reward
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


@dataclass(frozen=True)
class JudgeOptions:
    """The options of `memagent data judge`."""

    results: Path = field(metadata=flag("An eval run's folder or its results.jsonl.", argument=True))
    judge_model: str = field(metadata=flag(
        "The grading model: a served name (openai backend) or a Hugging Face id / local folder (transformers)."))
    judge_backend: str = field(default="openai", metadata=flag("The grading model's backend: openai or transformers."))
    judge_base_url: Optional[str] = field(default=None, metadata=flag(
        "openai backend: the server's URL, e.g. http://localhost:8000/v1."))
    judge_tokenizer: Optional[str] = field(default=None, metadata=flag(
        "openai backend: a tokenizer (Hugging Face id or folder) for prompt lengths."))
    retries: int = field(default=2, metadata={**rule(min=0, max=10), **flag(
        "Times an unparseable grade is asked again (then it scores 0 and is counted).")})
    out: Optional[str] = field(default=None, metadata=flag(
        "JSONL of the records with their grades (default: judged.jsonl beside results.jsonl)."))


def judge_run(o: JudgeOptions) -> None:
    """`data judge`: grade every answer of the run, write the graded records, print the table by method and ability."""
    results = o.results / "results.jsonl" if o.results.is_dir() else o.results
    if not results.is_file():
        raise InputError(f"{o.results} is not an eval run's results.jsonl (nor a folder holding one)")
    out = o.out or str(results.with_name("judged.jsonl"))
    check_output_file(out, "--out", {"RESULTS": results})
    judge = build_reward("judge", "outcome", backend=o.judge_backend, model=o.judge_model, base_url=o.judge_base_url,
                         tokenizer=o.judge_tokenizer, retries=o.retries)
    rows = judge_results(results, judge, out)
    typer.echo(f"judge {o.judge_model}: each answer of {results} graded against its gold (the judge reward's rubric)\n")
    typer.echo("| method | ability | n | rule-based score | judge |\n|---|---|---:|---:|---:|")
    for r in rows:
        typer.echo(f"| {r['method']} | {r['ability']} | {r['n']} | {r['score']:.3f} | {r['judge']:.3f} |")
    stats = judge.stats
    typer.echo(f"wrote {out}; judge calls {stats['calls']}, cached {stats['cached']}, unparseable {stats['unparseable']} "
               f"(scored 0), retried {stats['retried']}", err=True)

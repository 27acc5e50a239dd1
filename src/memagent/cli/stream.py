"""`memagent stream create|append|ask|watch|show`: a stream file (memagent.streams) from the command line."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

from memagent.agent.registry import DEFAULT_WORKFLOW
from memagent.backends.options import BackendOptions
from memagent.cli.app import app
from memagent.cli.params import options_command
from memagent.config import rule
from memagent.flags import MODEL_HELP, WORKFLOW_OPTION_HELP, BudgetOptions, SamplingOptions, flag
from memagent.protocol.profile import open_backend
from memagent.protocol.resolve import model_profile, workflow_options_for
from memagent.streams import Stream, StreamError
from memagent.streams.inputs import FORMATS, Skipped, iter_input_events

stream_app = typer.Typer(no_args_is_help=True, help="Streams of events that grow, and standing questions kept "
                         "current as text arrives (docs/streams.md).")
app.add_typer(stream_app, name="stream")

FILE_HELP = "The stream file (SQLite; made by `memagent stream create`)."


@dataclass(frozen=True)
class CreateOptions:
    file: Path = field(metadata=flag(FILE_HELP, argument=True))
    max_event_bytes: int = field(default=1 << 20, metadata={**rule(min=1, max=16 << 20), **flag(
        "The most UTF-8 bytes of one event's text.")})


@stream_app.command("create")
@options_command(CreateOptions)
def create_cmd(o: CreateOptions) -> None:
    """Create an empty stream file."""
    Stream.create(o.file, o.max_event_bytes).close()
    typer.echo(f"created the stream {o.file}", err=True)


@dataclass(frozen=True)
class AppendOptions:
    file: Path = field(metadata=flag(FILE_HELP, argument=True))
    inputs: list[str] = field(default_factory=list, metadata=flag(
        "Files to append (- or none: stdin, read as it arrives: `tail -f log | memagent stream append s.db`).",
        argument=True))
    format: str = field(default="lines", metadata={**rule(choices=FORMATS), **flag(
        "lines: each line an event; jsonl: each line {text, role, time, source}; text: each input one event.")})
    role: str = field(default="user", metadata=flag("The role of events that carry none."))
    time: Optional[str] = field(default=None, metadata=flag(
        "The time (ISO 8601; no zone: UTC) of events that carry none; default: when each is appended."))
    source: Optional[str] = field(default=None, metadata=flag("The source of events that carry none."))
    wait: float = field(default=0.0, metadata={**rule(min=0), **flag(
        "Seconds to wait for another process appending to the stream (default: refuse at once).")})


@stream_app.command("append")
@options_command(AppendOptions)
def append_cmd(o: AppendOptions) -> None:
    """Append events from files or stdin; each event is committed as it is read."""
    with Stream.open(o.file, wait=o.wait) as s:
        s.writer()  # refused (or waits) before any input is read
        defaults = dict(role=o.role, time=o.time, source=o.source)
        ids: list[int] = []
        skipped = Skipped()
        try:
            for name in o.inputs or ["-"]:
                if name == "-":
                    _append_from(s, sys.stdin.buffer, "stdin", o.format, defaults, skipped, ids)
                    continue
                path = Path(name)
                if not path.is_file():
                    raise StreamError(f"{name}: no such file (give text files, or - for stdin)")
                with open(path, "rb") as fh:
                    _append_from(s, fh, name, o.format, defaults, skipped, ids)
        except StreamError as e:
            raise StreamError(f"{e} ({_appended(ids)} before it, and kept)") from None
        except KeyboardInterrupt:  # Ctrl-C ends `tail -f | append`: what was appended is said, then "interrupted"
            typer.echo(f"{_appended(ids)} to {o.file}", err=True)
            raise
        blank = f"; {skipped.blank} blank line(s) skipped" if skipped.blank else ""
        typer.echo(f"{_appended(ids)} to {o.file}{blank}", err=True)


def _append_from(s: Stream, fh: Any, name: str, fmt: str, defaults: dict, skipped: Skipped, ids: list[int]) -> None:
    for event in iter_input_events(fh, name, fmt, s.file.max_event_bytes, defaults, skipped):
        ids.append(s.append(**event).id)


def _appended(ids: list[int]) -> str:
    if not ids:
        return "appended no event"
    return f"appended {len(ids)} event(s) (ids {ids[0]}-{ids[-1]})" if len(ids) > 1 else f"appended event {ids[0]}"


PROFILE_HELP = "Protocol profile (YAML, e.g. configs/profiles/memagent.yaml); flags override it."


@dataclass
class ReadOptions:
    """What `stream ask` and `stream watch` share: the stream file, the question, and the model that reads it with
    its settings, as `memagent ask` takes them."""

    file: Path = field(metadata=flag(FILE_HELP, argument=True))
    question: str = field(metadata=flag("The question."))
    model: str = field(metadata=flag(MODEL_HELP))
    backend: BackendOptions = field(default_factory=BackendOptions)  # the model and its reading settings, as ask's
    profile: Optional[Path] = field(default=None, metadata=flag(PROFILE_HELP))
    budgets: BudgetOptions = field(default_factory=BudgetOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)


@dataclass
class AskOptions(ReadOptions):
    question: str = field(metadata=flag("The question to answer."))  # ReadOptions' field, its own help
    standing: bool = field(default=False, metadata=flag(
        "Register it as a standing question (kept current as events arrive) and answer from its memory; a question "
        "already standing with this model and settings is answered so without it."))
    workflow: str = field(default=DEFAULT_WORKFLOW, metadata=flag(
        "Reading workflow of an ad-hoc question: memagent, lookup, skim, or one a package registers."))
    workflow_option: list[str] = field(default_factory=list, metadata=flag(WORKFLOW_OPTION_HELP, "--workflow-option"))


def _model(o: Any, workflow: str = DEFAULT_WORKFLOW, pairs: list[str] = ()) -> tuple[Any, Any, str, dict]:
    """(backend, config, the model's name as the stream records it: a local path made absolute, the workflow's
    options), the settings resolved as `memagent ask` resolves them."""
    profile = model_profile(o.model, o.profile, o.budgets, o.sampling)
    options = workflow_options_for(profile, workflow, list(pairs)) if pairs else {}  # checked before the model loads
    name = str(Path(o.model).resolve()) if Path(o.model).exists() else o.model
    return open_backend(o.model, o.backend, profile), profile.agent_config(), name, options


@stream_app.command("ask")
@options_command(AskOptions)
def ask_cmd(o: AskOptions) -> None:
    """Answer a question over the stream: from a standing question's memory (at most two calls once it is
    current), or ad hoc, reading the whole text with any workflow."""
    if not o.question.strip():
        raise StreamError("give the question: --question TEXT")
    with Stream.open(o.file) as s:  # a missing or bad stream file: refused before the model loads
        backend, config, name, options = _model(o, o.workflow, o.workflow_option)
        standing = True if o.standing else None
        a = s.ask(o.question, backend, config, name, workflow=o.workflow, standing=standing, **options)
    how = f"standing question {a.question_id}" if a.question_id is not None else f"ad hoc, workflow {o.workflow}"
    typer.echo(f"({how}: {a.events} events, {a.chunks} chunks read; {a.calls} calls)", err=True)
    print(a.answer if a.answer is not None else f"(no answer: the model wrote no \\boxed{{}}) {a.raw_answer.strip()}")


@dataclass
class WatchOptions(ReadOptions):
    question: str = field(metadata=flag("The standing question to keep current."))  # ReadOptions' field
    follow: bool = field(default=False, metadata=flag("Keep waiting for new events (Ctrl-C stops)."))
    poll: float = field(default=1.0, metadata={**rule(above=0), **flag("With --follow: seconds between looks.")})


@stream_app.command("watch")
@options_command(WatchOptions)
def watch_cmd(o: WatchOptions) -> None:
    """Register a standing question (if new) and keep its memory current: one JSON line per memory version."""
    if not o.question.strip():
        raise StreamError("give the question: --question TEXT")
    with Stream.open(o.file) as s:
        backend, config, name, _ = _model(o)
        for v in s.watch(o.question, backend, config, name, follow=o.follow, poll=o.poll):
            print(json.dumps(dict(question_id=v.question_id, chunk=v.chunk, events_read=v.events_read,
                                  memory=v.memory), ensure_ascii=False), flush=True)


@dataclass(frozen=True)
class ShowOptions:
    file: Path = field(metadata=flag(FILE_HELP, argument=True))
    events: bool = field(default=False, metadata=flag("The events, one JSON line each (--after, --limit)."))
    text: bool = field(default=False, metadata=flag("The stream's text: what every other command reads."))
    memories: Optional[int] = field(default=None, metadata=flag(
        "Every memory version of this standing question, one JSON line each."))
    trace: Optional[int] = field(default=None, metadata=flag(
        "This standing question as a trace `memagent report` draws: one document per answer given (the last 16)."))
    after: int = field(default=0, metadata={**rule(min=0), **flag("With --events: from the event after this id.")})
    limit: Optional[int] = field(default=None, metadata={**rule(min=1), **flag("With --events: at most this many.")})


@stream_app.command("show")
@options_command(ShowOptions)
def show_cmd(o: ShowOptions) -> None:
    """What a stream holds: a summary (default), its events, its text, or a standing question's memories."""
    if sum([o.events, o.text, o.memories is not None, o.trace is not None]) > 1:
        raise StreamError("give one of --events, --text, --memories, --trace")
    with Stream.open(o.file) as s:
        if o.events:
            for e in s.events(o.after, o.limit):
                print(json.dumps(e.as_dict(), ensure_ascii=False))
        elif o.text:
            for block in s.text_blocks():
                sys.stdout.write(block)
        elif o.memories is not None:
            _question(s, o.memories)
            for m in s.memories(o.memories):
                print(json.dumps(m, ensure_ascii=False))
        elif o.trace is not None:
            _question(s, o.trace)
            for line in s.trace(o.trace):
                print(json.dumps(line, ensure_ascii=False))
        else:
            print(summary(s))


def _question(s: Stream, qid: int) -> dict:
    q = next((q for q in s.questions() if q["id"] == qid), None)
    if q is None:
        raise StreamError(f"{s.path} has no standing question {qid} (`memagent stream show {s.path}` lists them)")
    return q


def summary(s: Stream) -> str:
    events = s.events(limit=1)
    last = s.events(max(0, len(s) - 1), 1)
    out = [f"{s.path}: {len(s)} events" + (f", {events[0].time} to {last[-1].time}" if events else "")
           + f"; events up to {s.file.max_event_bytes} bytes"]
    for q in s.questions():
        c = q["config"]
        answers = s.answers(q["id"])
        said = f"; last answer: {answers[-1]['answer']!r} (after {answers[-1]['events']} events)" if answers else ""
        out.append(f"question {q['id']}: {q['question']!r} (model {q['model']}, chunks of {c['chunk_tokens']}, "
                   f"memory {c['memory_tokens']}): {q['chunks']} chunks read, events up to {q['events_read']} "
                   f"tokenised{said}")
    return "\n".join(out)


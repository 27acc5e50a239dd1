"""What a reading workflow is, and what it shares with the scheduler that drives it.

A workflow is a generator function: it takes the document being read, the question and its own options, yields
one model call at a time and receives each reply, and returns the answer:

    @workflow()
    def memagent(doc, question, options):
        memory = doc.memory
        for chunk in doc.chunks():
            reply = yield Call("memory", render(..., chunk=chunk.text), M, step=chunk.index, chunk=chunk)
            memory = ...
        reply = yield Call("final", ..., A, step=doc.num_chunks)
        return Answer(...)

Everything else is the scheduler's (memagent.agent.scheduler): many documents at once (lock-step batches by
kind and budget, or pipelined), the seed of each call, the conversations kept for training, the trace records,
failures, progress. A workflow says what it kept of a reply with `reply.keep(text, **record)` (the
conversation's text and the trace record's fields); `@workflow(...)` declares beside it its own options class,
the largest prompts it can build (`Prompt`: the window check made before any call) and whether it can go on
from a saved memory (`resumable`). The paper's workflow and its reading loop are memagent.agent.workflow.

Kinds of calls are an open set: "memory" and "final" are the paper's; a workflow may add its own ("query", ...).
The trainer (Multi-Conv DAPO) turns each conversation into one training row sharing the sample's reward.
"""
from __future__ import annotations

import logging
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from memagent.agent.chunking import Chunk, DocumentSource, iter_chunks, middle_truncate
from memagent.backends.base import Generation
from memagent.config import PLACEHOLDER, AgentConfig, ConfigError
from memagent.errors import MemAgentError

log = logging.getLogger(__name__)

SCHEDULES = ("auto", "pipelined", "lockstep")
FAILURES = ("raise", "record")


class BudgetError(MemAgentError, ValueError):
    """A question, or the window budget, does not fit; nothing was sent to the model."""


class WorkflowError(MemAgentError, RuntimeError):
    """A workflow broke its contract or raised: a plug-in's fault, named as such (the document it was reading
    fails; the others go on). memagent.agent.runner turns whatever a plug-in raises into one of these."""


MAX_CALLS_PER_CHUNK = 8  # the default call cap of a document: 8 calls per chunk read, plus MAX_CALLS_SLACK
MAX_CALLS_SLACK = 64


@dataclass(frozen=True)
class Call:
    """One model call a workflow yields."""

    kind: str  # an open set: "memory" | "final" (the paper's), or a workflow's own ("query", ...)
    prompt: str
    max_new_tokens: int
    step: int = 0  # the conversation's and trace record's step (the paper's: chunk number; the final: K)
    chunk: Chunk | None = None  # the chunk read (its offsets go into the trace record: the evidence)


@dataclass
class Reply:
    """A model's reply as the workflow receives it (`reply = yield Call(...)`)."""

    gen: Generation  # text, token ids, log-probs, prompt ids
    kept: str | None = None  # set by keep(): the conversation's text (None: the reply's text)
    truncated: bool = False
    record: dict[str, Any] | None = None  # set by keep(): the trace record's own fields

    @property
    def text(self) -> str:
        return self.gen.text

    def keep(self, text: str, truncated: bool = False, /, **record: Any) -> None:
        """What the workflow kept of the reply (the conversation's text; `truncated`: it was cut) and what the
        trace record says of it. Without keep() the record carries `text` and `generated_tokens`."""
        self.kept, self.truncated, self.record = text, truncated, record


@dataclass
class Answer:
    """What a workflow returns for a document."""

    answer: str | None  # under config.answer_protocol; None when the model wrote none
    raw_answer: str
    memory: str  # the final memory (or what the workflow answered from)
    num_chunks: int
    think_removed: bool = False


@dataclass(frozen=True)
class Prompt:
    """The largest prompt of one kind of call a workflow makes, for the window check before any call: its template
    and the most tokens each field filled in and the output take."""

    template: str
    parts: dict[str, int]  # e.g. {"query": Q, "chunk": C, "memory": M, "output": M}
    call: str = "a call"  # how the error names it
    fix: str = "lower --chunk-tokens or --memory-tokens"


@dataclass
class AgentInput:
    question: str
    document: DocumentSource  # text, a path, an open file, or an iterable of text blocks
    doc_id: str = ""
    memory: str | None = None  # the memory to start from (e.g. one saved to go on reading); None: empty_memory
    start_token: int = 0  # go on reading at this token offset (a chunk boundary: step * chunk_tokens)
    start_step: int = 0  # the step number of the chunk at start_token (resuming: the steps already done)
    seed_key: int | None = None  # this document's sampling identity: its calls are seeded by (seed, key, call)
    #   instead of by batch or input position (memagent.agent.scheduler.keyed_call_seed); None: the default


@dataclass
class Conversation:
    """One independent model call of a rollout; each becomes one training row."""

    kind: str  # an open set: "memory" | "final" (the paper's), or a workflow's own ("query", ...)
    step: int  # chunk index for memory updates; number of chunks for the final call
    prompt: str
    prompt_ids: list[int] | None  # [T_in], as the model saw them (chat template included)
    response_ids: list[int]  # [T_out], terminating EOS included
    logprobs: list[float] | None  # [T_out], sampling-time log-probs when the backend gives them
    text: str  # the reply (for memory updates: the memory kept, after the M-token cap)
    truncated: bool = False  # the reply was longer than M tokens and was cut


@dataclass
class AgentResult:
    doc_id: str
    question: str
    answer: str | None  # the final answer under config.answer_protocol; None when the model wrote none
    raw_answer: str
    memory: str  # the final memory
    num_chunks: int
    conversations: list[Conversation] = field(default_factory=list)  # every call, in the order made
    think_removed: bool = False  # a think block was cut from the final reply before extraction
    error: dict[str, Any] | None = None  # a failed document: {kind, message, attempts}; answer is None
    calls: int = 0  # model calls made for this document (all kinds)


class Document:
    """The document a workflow reads, under the run's config: its chunks (after `document_tokens` middle
    truncation; a resumed one from its `start_token`), its starting memory and step."""

    def __init__(self, pos: int, item: AgentInput, config: AgentConfig, tokenizer: Any, errors: str = "strict"):
        self.pos, self.item, self.config, self.tokenizer, self.errors = pos, item, config, tokenizer, errors
        self.id = item.doc_id
        self.memory = config.empty_memory if item.memory is None else item.memory  # to start from
        self.num_chunks = item.start_step  # the chunks of the document handed out so far (resumed: counted)

    def chunks(self) -> Iterator[Chunk]:
        """The chunks of C tokens still to read, in order, read from the source as they are asked for."""
        document = self.item.document
        if self.config.document_tokens is not None:
            document = middle_truncate(document, self.tokenizer, self.config.document_tokens).context
        n = 0
        for chunk in iter_chunks(document, self.tokenizer, self.config.chunk_tokens, errors=self.errors):
            if chunk.start_token < self.item.start_token:  # resuming: skip the chunks read
                continue
            n += 1
            self.num_chunks += 1
            yield chunk
        if n == 0 and self.item.start_token == 0:
            log.warning("document %s is empty: answering from an empty memory", self.id)

    def count(self, text: str) -> int:
        """Tokens of `text` (no special tokens)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def paper_window(config: AgentConfig, options: Any = None) -> list[Prompt]:
    """The paper's two calls: a memory update (question, memory, chunk; up to M new tokens) and the final answer."""
    c = config
    return [Prompt(c.memory_template, dict(query=c.query_tokens, chunk=c.chunk_tokens, memory=c.memory_tokens,
                                           output=c.memory_tokens)),
            Prompt(c.final_template, dict(query=c.query_tokens, memory=c.memory_tokens, output=c.answer_tokens))]


def workflow(options: type | None = None, window: Callable[[AgentConfig, Any], list[Prompt]] = paper_window,
             resumable: bool = False) -> Callable[[Callable], Callable]:
    """Declare a generator function a workflow: `options`, a class built from the workflow's own keyword options
    (it checks them; None: no options); `window(config, options)`, the largest prompts it builds (default: the
    paper's two); `resumable`, whether it goes on from AgentInput.memory / start_token (a saved memory)."""

    def declare(fn: Callable) -> Callable:
        fn.options, fn.window, fn.resumable = options, window, resumable  # type: ignore[attr-defined]
        return fn

    return declare


def _hint_types(hint: Any) -> tuple[set[Any], bool]:
    """(the plain types a field's annotation allows, whether it allows None); ({Any}, True) for one it cannot read."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = {a for a in args if a is not type(None)}
    if not all(isinstance(a, type) for a in kinds):
        return {Any}, True
    return kinds, type(None) in args


def check_option_types(cls: type, name: str, given: dict[str, Any]) -> None:
    """ConfigError for a value of `given` that its field of the options class `cls` cannot take, read off the field's
    annotation: a bool field takes true or false only (not "maybe"), an int field an integer (or a string of ASCII
    digits, as a command line gives it), a number field a finite number, a text field a string, a path field (Path) a
    non-empty path or null (an empty one would be the working folder). Fields with other annotations are the
    class's own to check. The one type check of a workflow's options, whatever entry they come from."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation this Python cannot resolve: the class checks its own
        return
    for key, value in given.items():
        kinds, optional = _hint_types(hints.get(key, Any))
        if Any in kinds or (value is None and optional):
            continue
        where = f"workflow {name}: {key}"
        if Path in kinds:
            if not (isinstance(value, str) and value.strip()) and not isinstance(value, Path):
                raise ConfigError(f"{where} must be a folder path (text){' or null' if optional else ''}, "
                                  f"got {value!r}")
        elif kinds == {bool}:
            if not isinstance(value, bool):
                raise ConfigError(f"{where} must be true or false, got {value!r}")
        elif kinds == {int}:
            digits = isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()) is not None
            if not digits and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{where} must be an integer, got {value!r}")
        elif kinds <= {int, float}:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{where} must be a finite number, got {value!r}")
        elif kinds == {str}:
            if not isinstance(value, str):
                raise ConfigError(f"{where} must be a string, got {type(value).__name__}")


def template_overhead(backend: Any, template: str) -> int:
    """The tokens a prompt of `template` has besides its fields, as a bound for filled fields: the backend's
    prompt length of the empty render, plus what its text pieces (between placeholders) count one by one
    over the empty render. A tokenizer may merge the pieces of an empty render ("<problem>\\n" + "\\n</problem>"
    -> one "\\n\\n" token) that filled fields keep apart, so the empty render alone can undercount."""
    tok = backend.tokenizer
    empty = PLACEHOLDER.sub("", template)
    n_empty = len(tok(empty, add_special_tokens=False)["input_ids"])
    pieces = [p for p in PLACEHOLDER.split(template)[::2] if p]  # split keeps the field names at odd places
    n_pieces = sum(len(ids) for ids in tok(pieces, add_special_tokens=False)["input_ids"]) if pieces else 0
    return backend.prompt_length(empty) + max(0, n_pieces - n_empty)


def check_window(backend: Any, prompts: list[Prompt]) -> None:
    """BudgetError for the first prompt that cannot fit the backend's window (none: no limit)."""
    window = backend.max_window
    if window is None:
        return
    for p in prompts:
        overhead = template_overhead(backend, p.template)  # an upper bound: see its docstring
        need = overhead + sum(p.parts.values())
        if need > window:
            parts = " + ".join(f"{k} {v}" for k, v in p.parts.items())
            raise BudgetError(f"{p.call} needs up to {need} tokens (template {overhead} + {parts}) but the model's "
                              f"window is {window}; {p.fix}")


def check_questions(backend: Any, config: AgentConfig, items: Any) -> None:
    """BudgetError for an empty question, one over config.query_tokens, or a starting memory over M tokens."""
    tok = backend.tokenizer
    for it in items:
        n = len(tok(it.question, add_special_tokens=False)["input_ids"])
        if n > config.query_tokens:
            raise BudgetError(f"question of document {it.doc_id or '#?'} has {n} tokens, over its budget of "
                              f"{config.query_tokens}; shorten it or raise --query-tokens")
        if not it.question.strip():
            raise BudgetError(f"question of document {it.doc_id or '#?'} is empty")
        if it.memory is not None:
            n = len(tok(it.memory, add_special_tokens=False)["input_ids"])
            if n > config.memory_tokens:
                raise BudgetError(f"starting memory of document {it.doc_id or '#?'} has {n} tokens, over the "
                                  f"memory budget of {config.memory_tokens}; shorten it or raise --memory-tokens")


@dataclass
class WorkflowOptions:
    """How a run is observed and scheduled: the same keyword options for every workflow.

    keep_conversations: keep every call's prompt/response ids in the result (the trainer needs them; for
    inference over long documents leave it off, so RAM does not grow with length).
    on_step: called with each trace record as it is made (memory records carry `chunk_text`); an exception it
    raises stops the run (e.g. a cancelled job).
    trace_chunks: also write each memory record's `chunk_text` to the trace file.
    schedule: "auto" (pipelined for a concurrent backend, lock-step batches for an in-process one), "pipelined"
    or "lockstep" (memagent.agent.scheduler).
    failures: "raise" (a failed call stops the run) or "record" (the document gets a result with `error`).
    max_calls: the most model calls one document may make (a workflow that asks for more fails that document);
    None: MAX_CALLS_PER_CHUNK (8) per chunk read so far, plus MAX_CALLS_SLACK (64): `memagent` makes 1 per chunk
    and 1 more, `lookup` at most 37 more.
    """

    trace_path: str | Path | TextIO | None = None  # a path (rewritten) or an open text stream
    progress: bool = False
    errors: str = "strict"  # how undecodable bytes of a document are handled (iter_chunks)
    keep_conversations: bool = False
    on_step: Callable[[dict[str, Any]], None] | None = None
    trace_chunks: bool = False
    schedule: str = "auto"
    failures: str = "raise"
    max_calls: int | None = None

    def __post_init__(self) -> None:
        if self.failures not in FAILURES:
            raise ValueError(f"failures must be one of {', '.join(FAILURES)}, got {self.failures!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.max_calls is not None and (not isinstance(self.max_calls, int) or isinstance(self.max_calls, bool)
                                           or self.max_calls < 1):
            raise ValueError(f"max_calls must be a positive integer or None, got {self.max_calls!r}")

    def call_cap(self, chunks: int) -> int:
        """The most calls a document that has been handed `chunks` chunks may make."""
        return self.max_calls if self.max_calls is not None else MAX_CALLS_PER_CHUNK * chunks + MAX_CALLS_SLACK


WORKFLOW_OPTIONS = tuple(WorkflowOptions.__dataclass_fields__)


def split_options(options: dict[str, Any]) -> tuple[WorkflowOptions, dict[str, Any]]:
    """(the shared run options, the rest: the workflow's own options) of a factory's keyword options."""
    shared = {k: v for k, v in options.items() if k in WORKFLOW_OPTIONS}
    return WorkflowOptions(**shared), {k: v for k, v in options.items() if k not in WORKFLOW_OPTIONS}

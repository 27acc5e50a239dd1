"""What every reading workflow shares: its inputs and results, the options a run is observed and scheduled
with, the `Workflow` protocol the scheduler drives, and the run helpers (`run_workflow`, `stream_workflow`).

A workflow is a per-document state machine (memagent.agent.scheduler.Steps: start, next call, take the reply,
fail) plus a window check made before any call. Its result carries the answer and every conversation it had
with the model; the trainer (Multi-Conv DAPO) turns each conversation into one training row that shares the
sample's final reward, whatever its kind. The paper's workflow is `memagent.agent.workflow.MemoryAgent`; the
registry of workflows by name is memagent.agent.registry.

Kinds of calls and conversations are an open set: "memory" and "final" are the paper's; a workflow may add its
own ("query", ...). In the lock-step schedule the calls of one kind (and output budget) form one batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence, TextIO

from memagent.agent.chunking import DocumentSource
from memagent.agent.scheduler import (FAILURES, SCHEDULES, Call, RunStats, resolve_schedule, run_lockstep,
                                      run_pipelined)
from memagent.agent.trace import TraceWriter
from memagent.backends.base import Backend, Generation, SamplingParams
from memagent.config import AgentConfig
from memagent.errors import MemAgentError
from memagent.progress import CallRate, StepProgress


class BudgetError(MemAgentError, ValueError):
    """A question, or the window budget, does not fit; nothing was sent to the model."""


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
    calls: int = 0  # model calls made for this document (all kinds; 0 where the workflow does not count them)


@dataclass
class WorkflowOptions:
    """How a run is observed and scheduled: the same keyword options for every workflow's factory.

    keep_conversations: keep every call's prompt/response ids in the result (the trainer needs them; for
    inference over long documents leave it off, so RAM does not grow with length).
    on_step: called with each trace record as it is made (memory records carry `chunk_text`); an exception it
    raises stops the run (e.g. a cancelled job).
    trace_chunks: also write each memory record's `chunk_text` to the trace file.
    schedule: "auto" (pipelined for a concurrent backend, lock-step batches for an in-process one), "pipelined"
    or "lockstep" (memagent.agent.scheduler).
    failures: "raise" (a failed call stops the run) or "record" (the document gets a result with `error`).
    """

    trace_path: str | Path | TextIO | None = None  # a path (rewritten) or an open text stream
    progress: bool = False
    errors: str = "strict"  # how undecodable bytes of a document are handled (iter_chunks)
    keep_conversations: bool = False
    on_step: Callable[[dict[str, Any]], None] | None = None
    trace_chunks: bool = False
    schedule: str = "auto"
    failures: str = "raise"
    _trace: TraceWriter | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.failures not in FAILURES:
            raise ValueError(f"failures must be one of {', '.join(FAILURES)}, got {self.failures!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")

    @property
    def observed(self) -> bool:
        """Whether records are wanted (a trace file is open or on_step is set): build them only then."""
        return self._trace is not None or self.on_step is not None

    def emit(self, record: dict[str, Any], chunk_text: str | None = None) -> None:
        """Write `record` to the trace (with the chunk's text under trace_chunks) and pass it to on_step.

        A record of a kind other than the paper's memory update carries `kind`."""
        full = record if chunk_text is None else dict(record, chunk_text=chunk_text)
        if self._trace:
            self._trace.write(full if self.trace_chunks else record)
        if self.on_step is not None:
            self.on_step(full)


WORKFLOW_OPTIONS = tuple(f for f in WorkflowOptions.__dataclass_fields__ if not f.startswith("_"))


def split_options(options: dict[str, Any]) -> tuple[WorkflowOptions, dict[str, Any]]:
    """(the shared run options, the rest: the workflow's own options) of a factory's keyword options."""
    shared = {k: v for k, v in options.items() if k in WORKFLOW_OPTIONS}
    return WorkflowOptions(**shared), {k: v for k, v in options.items() if k not in WORKFLOW_OPTIONS}


class Workflow(Protocol):
    """A reading strategy the scheduler drives, one state per document (memagent.agent.scheduler.Steps).

    A document state has `pos` (input position) and `calls` (model calls made so far; the scheduler counts
    them). Build one with `factory(backend, config, **options)` (memagent.agent.registry)."""

    name: str
    backend: Backend
    config: AgentConfig
    options: WorkflowOptions
    stats: RunStats  # of the last run

    def check_budget(self, items: Sequence[AgentInput]) -> None:
        """Raise BudgetError for a question over its budget or a window that cannot hold one of the workflow's
        calls; `check_budget([])` checks the window alone. Called before any model call."""
        ...

    def start(self, pos: int, item: AgentInput) -> Any: ...

    def next_call(self, doc: Any) -> Call: ...

    def take(self, doc: Any, call: Call, gen: Generation, seconds: float, batch_size: int) -> AgentResult | None:
        """Apply the reply; the document's result when it is done, else None."""
        ...

    def fail(self, doc: Any, exc: BaseException) -> AgentResult:
        """The error result of a document whose call failed (`doc` may be a bare (pos, item) record)."""
        ...

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams: ...


def check_questions(backend: Backend, config: AgentConfig, items: Sequence[AgentInput]) -> None:
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


def with_ids(items: Iterable[AgentInput]) -> Iterable[AgentInput]:
    """Each item with a doc_id: its own, or its input position."""
    return (replace(it, doc_id=it.doc_id or str(i)) for i, it in enumerate(items))


def run_workflow(wf: Workflow, items: Sequence[AgentInput],
                 on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
    """Run every (question, document) pair through `wf`; results come back in input order.

    on_result: called with each result as soon as its document finishes (finishing order), e.g. to write it
    out, so an error in a later document does not lose it. `wf.stats` holds the run's counts afterwards."""
    items = list(with_ids(items))
    wf.check_budget(items)
    results, wf.stats = _drive(wf, wf, items, on_result, len(items), collect=True)
    return results


def stream_workflow(wf: Workflow, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None],
                    total: int | None = None) -> RunStats:
    """Run `items` as they come: the iterable is read only when a document can start, each result goes to
    `on_result` as its document finishes, and none is kept (memory stays bounded by max_batch_docs documents).
    The window is checked first; a question over its budget fails its own document (raised under
    failures="raise"). `total`: the number of items, for the progress bar."""
    wf.check_budget([])
    _, wf.stats = _drive(_CheckEach(wf), wf, with_ids(items), on_result, total, collect=False)
    return wf.stats


class _CheckEach:
    """`wf`'s steps, each document's question checked as it starts (a stream is not checked up front)."""

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.next_call, self.take, self.fail, self.params = wf.next_call, wf.take, wf.fail, wf.params

    def start(self, pos: int, item: AgentInput) -> Any:
        self.wf.check_budget([item])
        return self.wf.start(pos, item)


def _drive(steps: Any, wf: Workflow, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None] | None,
           total: int | None, collect: bool) -> tuple[list[AgentResult], RunStats]:
    o = wf.options
    o._trace = TraceWriter(o.trace_path) if o.trace_path else None
    schedule = resolve_schedule(o.schedule, wf.backend)
    bar = _Progress(total) if o.progress and total is not None else None
    go = run_pipelined if schedule == "pipelined" else run_lockstep
    try:
        return go(steps, wf.backend, items, wf.config.max_batch_docs, wf.config.seed, o.failures,
                  on_result, bar.update if bar else None, collect)
    finally:
        if o._trace:
            o._trace.close()
        o._trace = None
        if bar:
            bar.close()


class _Progress:
    """Documents finished, calls in flight and calls/s, on stderr (a bar on a terminal, a plain line every 5%
    in a log)."""

    def __init__(self, n_docs: int) -> None:
        self._p = StepProgress("read", n_docs, unit="documents")
        self._rate = CallRate()

    def update(self, docs: int, calls_done: int, in_flight: int) -> None:
        self._p.update(docs, self._rate.info(calls_done, in_flight))

    def close(self) -> None:
        self._p.close()

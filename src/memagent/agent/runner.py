"""Running a workflow: `Runner` is a workflow (memagent.agent.protocol: a generator function that yields model calls)
ready to run on a backend under a config, its own options and the shared run options (WorkflowOptions);
`run_workflow` and `stream_workflow` run one over many documents through the scheduler (memagent.agent.scheduler).

The runner does everything besides the reading itself: each document's generator becomes the per-document state
machine the scheduler drives (which batches and seeds the calls); it keeps the conversations for training, writes
the trace records (with the chunks' offsets: the evidence), makes a failed document's result (and closes its
generator, so its `finally` blocks run), and shows progress.

A command binds its workflow once (`BoundWorkflow`: the generator function found by name, its own options built
and checked) and builds one `Runner`; a run with other run options, another backend or config (a repeat's seed,
a serve job's backend) is `Runner.bind(...)`, which checks nothing again.
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Callable, Generator, Iterable, Sequence

from memagent.agent.guards import check_answer, check_call, check_call_fits, close_quietly, is_plugin, plugin_fault
from memagent.agent.protocol import (MAX_CALLS_PER_CHUNK, MAX_CALLS_SLACK, AgentInput, AgentResult, Answer,
                                     Call, Conversation, Document, Prompt, Reply, WorkflowError,
                                     check_option_types, check_questions, check_window, paper_window,
                                     split_options)
from memagent.agent.scheduler import RunStats, resolve_schedule, run_lockstep, run_pipelined
from memagent.agent.trace import TraceWriter, draft_fields
from memagent.backends.base import BackendError, Generation, SamplingParams
from memagent.config import AgentConfig, ConfigError
from memagent.errors import MemAgentError
from memagent.progress import CallRate, StepProgress

log = logging.getLogger(__name__)

Workflow = Callable[[Document, str, Any], Generator[Call, Reply, Answer]]  # (doc, question, options) -> Answer


@dataclass
class _Doc:
    """One document being read: its workflow generator, the call it waits on, what the scheduler records."""

    pos: int
    item: AgentInput
    gen: Generator[Call, Reply, Answer]
    call: Call | None = None
    calls: int = 0  # model calls made (seeds the next one)
    seed_key: int | None = None
    memory: str = ""  # the memory kept by the last "memory" call (a failed document's result shows it)
    num_chunks: int = 0  # chunks read so far (the final call's step once it is asked for)
    conversations: list[Conversation] = field(default_factory=list)
    doc: Document | None = None  # what the workflow reads (its chunks handed out so far bound its calls)


@dataclass(frozen=True)
class BoundWorkflow:
    """A workflow found by name and bound to its own options, built and checked once
    (memagent.agent.registry.bind_workflow): `options` as given (profile.yaml and the records' fingerprints hold
    them), `own` the built options object (None: the workflow declares none)."""

    name: str
    function: Workflow
    options: dict[str, Any]
    own: Any


def own_options(workflow: Workflow, name: str, own: dict[str, Any]) -> Any:
    """The workflow's own options object (its declared `options` class, which checks them; None: it has none);
    ConfigError for a name it does not have (listing those it has), a value of the wrong type for its field
    (memagent.agent.protocol.check_option_types), or whatever else the class refuses."""
    cls = getattr(workflow, "options", None)
    if cls is not None and not (isinstance(cls, type) and is_dataclass(cls)):
        raise WorkflowError(f"workflow {name} declares options={cls!r}"[:200] + ", which is not a dataclass; "
                            "@workflow(options=...) takes the dataclass of its own options")
    valid = [f.name for f in fields(cls)] if cls is not None else []
    unknown = sorted(set(own) - set(valid))
    if unknown:
        raise ConfigError(f"workflow {name} has no option {', '.join(unknown)}; its options are "
                          f"{', '.join(valid) or 'none'} (and the shared run options)")
    if cls is None:
        return None
    check_option_types(cls, name, own)
    try:
        return cls(**own)
    except MemAgentError:
        raise
    except Exception as e:  # noqa: BLE001 - a plug-in's options class: its refusal is the user's to fix
        raise ConfigError(f"workflow {name}: its options ({cls.__name__}) refused {sorted(own)}: "
                          f"{type(e).__name__}: {str(e)[:300]}") from None


class Runner:
    """A workflow (a generator function, memagent.agent.protocol) ready to run on `backend` under `config`:
    `options` are the shared run options (WorkflowOptions) and the workflow's own (its `options` class).
    It is the per-document `Steps` the schedules drive; `run` and `stream` run it over many documents."""

    def __init__(self, workflow: Workflow | BoundWorkflow, backend: Any, config: AgentConfig | None = None,
                 **options: Any) -> None:
        self.options, own = split_options(options)
        if isinstance(workflow, BoundWorkflow):  # its own options built and checked already
            if own:
                raise ConfigError(f"workflow {workflow.name} is bound to its options already; got {sorted(own)} "
                                  "again (give them to bind_workflow)")
            self.workflow, self.name, self.own = workflow.function, workflow.name, workflow.own
        else:
            self.workflow, self.name = workflow, getattr(workflow, "__name__", "")
            self.own = own_options(workflow, self.name, own)
        self.backend, self.config = backend, config or AgentConfig()
        self.plugin = is_plugin(self.workflow)  # a third party's: its faults are named as its own, its calls checked
        self.stats = RunStats()  # of the last run
        self.trace: TraceWriter | None = None  # the trace file of the run under way
        self._window_checked: AgentConfig | None = None  # the config whose window check passed
        resolve_schedule(self.options.schedule, backend)

    def bind(self, backend: Any = None, config: AgentConfig | None = None, **run_options: Any) -> "Runner":
        """This runner on another `backend` or `config` (None: its own), with other shared run options
        (WorkflowOptions: trace_path, on_step, failures, ...; the rest kept); the workflow and its own options
        as they were built (nothing checked again), the window check kept for the same config."""
        out = copy.copy(self)
        if backend is not None:
            resolve_schedule(self.options.schedule if "schedule" not in run_options else run_options["schedule"],
                             backend)
            out.backend, out._window_checked = backend, None
        if config is not None and config is not self.config:
            out.config, out._window_checked = config, None
        out.options = replace(self.options, **run_options)
        out.stats, out.trace = RunStats(), None
        return out

    @property
    def schedule(self) -> str:
        return self.options.schedule

    @property
    def failures(self) -> str:
        return self.options.failures

    def check_budget(self, items: Sequence[AgentInput]) -> None:
        """BudgetError for a question over its budget or a window that cannot hold one of the workflow's prompts
        (its declared `window`); `check_budget([])` checks the window alone. Made before any model call."""
        check_questions(self.backend, self.config, items)
        if self._window_checked is not self.config:  # once per config (a stream checks each document)
            try:
                prompts = getattr(self.workflow, "window", paper_window)(self.config, self.own)
                if self.plugin and (not isinstance(prompts, list) or not all(isinstance(p, Prompt) for p in prompts)):
                    raise TypeError(f"window() must return a list of Prompt, got {type(prompts).__name__}")
            except MemAgentError:
                raise
            except Exception as e:  # noqa: BLE001 - a plug-in's window declaration
                if not self.plugin:
                    raise
                raise plugin_fault(self.name, self.workflow, "declaring its window", e) from None
            check_window(self.backend, prompts)
            self._window_checked = self.config

    def run(self, items: Sequence[AgentInput],
            on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
        """`run_workflow(self, items, on_result)`."""
        return run_workflow(self, items, on_result)

    def stream(self, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None],
               total: int | None = None) -> RunStats:
        """`stream_workflow(self, items, on_result, total)`."""
        return stream_workflow(self, items, on_result, total)

    # -- the steps of one document (Steps) ------------------------------------------------------
    def start(self, pos: int, item: AgentInput) -> _Doc:
        doc = Document(pos, item, self.config, self.backend.tokenizer, self.options.errors)
        try:
            gen = self.workflow(doc, item.question, self.own)
            if not inspect.isgenerator(gen):
                raise WorkflowError(f"workflow {self.name} must be a generator function (it yields its calls), "
                                    f"but calling it gave {type(gen).__name__}")
        except Exception as e:  # noqa: BLE001
            raise self._fault(e, f"starting document {item.doc_id}") from None
        d = _Doc(pos, item, gen, seed_key=item.seed_key, memory=doc.memory, num_chunks=item.start_step, doc=doc)
        try:
            self._ask(d, next(d.gen))  # runs the workflow to its first call (reads the first chunk)
        except StopIteration:
            raise WorkflowError(f"workflow {self.name} returned without a model call (document {item.doc_id})") \
                from None
        except BaseException as e:
            close_quietly(d.gen)  # its finally blocks run (e.g. an index removed)
            if isinstance(e, Exception):
                raise self._fault(e, f"reading document {item.doc_id}") from None
            raise
        return d

    def next_call(self, d: _Doc) -> Call:
        return d.call  # type: ignore[return-value]

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens, self.config.temperature, self.config.top_p, seed)

    def take(self, d: _Doc, call: Call, gen: Generation, seconds: float, batch_size: int) -> AgentResult | None:
        """Send the reply to the workflow, record the call (as the workflow kept it); the result once it returns."""
        reply, finished, answer = Reply(gen), False, None
        try:
            self._ask(d, d.gen.send(reply))
        except StopIteration as stop:
            finished, answer = True, stop.value
        except Exception as e:  # noqa: BLE001 - a plug-in's error fails its document, named as its own
            raise self._fault(e, f"reading document {d.item.doc_id}") from None
        finally:
            self._record(d, call, reply, seconds, batch_size)
        if not finished:
            return None
        check_answer(self.name, answer, d.item.doc_id)
        return AgentResult(d.item.doc_id, d.item.question, answer.answer, answer.raw_answer, answer.memory,
                           answer.num_chunks, d.conversations, answer.think_removed, calls=d.calls)

    def fail(self, d: Any, exc: BaseException) -> AgentResult:
        """The result of a document whose call failed: no answer, and `error` {kind, message, attempts}."""
        log.warning("document %s failed: %s", d.item.doc_id, exc)
        if not isinstance(d, _Doc):  # failed before its first call
            return AgentResult(d.item.doc_id, d.item.question, None, "", "", 0, error=_error(exc, 1))
        close_quietly(d.gen)
        attempts = 1
        if isinstance(exc, BackendError):  # the tries the request made (replicas: more; a 4xx: one), else the most
            attempts = getattr(exc, "attempts", None) or 1 + int(getattr(self.backend, "max_retries", 0) or 0)
        return AgentResult(d.item.doc_id, d.item.question, None, "", d.memory, d.num_chunks, d.conversations,
                           error=_error(exc, attempts), calls=d.calls)

    def _fault(self, exc: Exception, what: str) -> Exception:
        """What a workflow's exception becomes: a plug-in's (not a MemAgentError) a WorkflowError naming it."""
        if isinstance(exc, MemAgentError) or not self.plugin:
            return exc
        return plugin_fault(self.name, self.workflow, what, exc)

    def _ask(self, d: _Doc, call: Any) -> None:
        """Take the call the workflow yielded: checked (a Call of sound fields; within the document's call cap; for
        a plug-in, its prompt counted against the window) before the scheduler sends it."""
        check_call(self.name, call, d.item.doc_id)
        chunks = d.doc.num_chunks if d.doc is not None else 0
        cap = self.options.call_cap(chunks)
        if d.calls + 1 > cap:
            rule = "max_calls" if self.options.max_calls else \
                f"{MAX_CALLS_PER_CHUNK} per chunk read ({chunks}) + {MAX_CALLS_SLACK}"
            raise WorkflowError(f"workflow {self.name} asked for call {d.calls + 1} of document {d.item.doc_id}, "
                                f"over its cap of {cap} calls ({rule}); a workflow that never finishes is stopped "
                                "here (raise the run option max_calls if it needs more)")
        if self.plugin:
            check_call_fits(self.backend, call, self.name, d.item.doc_id)
        d.call = call
        if call.kind == "final":
            d.num_chunks = call.step

    def _record(self, d: _Doc, call: Call, reply: Reply, seconds: float, batch_size: int) -> None:
        """The call's conversation (keep_conversations) and trace record (when observed), as the workflow kept it."""
        gen, o = reply.gen, self.options
        if self.plugin and reply.kept is not None and not isinstance(reply.kept, str):
            raise WorkflowError(f"workflow {self.name} kept a reply's text of type {type(reply.kept).__name__} "
                                f"(document {d.item.doc_id}); reply.keep(text, ...) takes a string")
        text = gen.text if reply.kept is None else reply.kept
        if call.kind == "memory":
            d.memory, d.num_chunks = text, max(d.num_chunks, call.step + 1)
        if o.keep_conversations:
            d.conversations.append(Conversation(call.kind, call.step, call.prompt, gen.prompt_token_ids, gen.token_ids,
                                                gen.logprobs, text, reply.truncated))
        if self.trace is None and o.on_step is None:  # nobody reads the records: none is made
            return
        n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else \
            self.backend.prompt_length(call.prompt)
        own = reply.record if reply.record is not None else dict(text=text, generated_tokens=len(gen.token_ids))
        if self.plugin and reply.record is not None:  # what it kept must be a JSON record (a trace line, an event)
            try:
                json.dumps(own, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise WorkflowError(f"workflow {self.name} kept a trace record that is not plain JSON ({e}; "
                                    f"document {d.item.doc_id}); reply.keep() takes text, numbers, lists and "
                                    "mappings") from None
        record: dict[str, Any] = dict(doc_id=d.item.doc_id, step=call.step)
        if call.kind != "memory":
            record["kind"] = call.kind
        if call.chunk is not None:
            record.update(chunk_start=call.chunk.start_token, chunk_tokens=len(call.chunk.token_ids))
        at = next((k for k in own if k in ("memory_tokens", "generated_tokens")), None)  # prompt_tokens goes first
        if at is None:
            record["prompt_tokens"] = n_prompt
        for k, v in own.items():
            if k == at:
                record["prompt_tokens"] = n_prompt
            record[k] = v
        record.update(seconds=round(seconds, 6), batch_size=batch_size)
        record.update(draft_fields(gen))  # a speculatively decoded call: draft tokens proposed and accepted
        if call.chunk is not None and call.chunk.source is not None:  # a PDF, HTML or EPUB: the page, heading, chapter
            record["source"] = call.chunk.source
        self._emit(record, call.chunk.text if call.chunk is not None else None)

    def _emit(self, record: dict[str, Any], chunk_text: str | None) -> None:
        """Write `record` to the trace (with the chunk's text under trace_chunks) and pass it to on_step."""
        full = record if chunk_text is None else dict(record, chunk_text=chunk_text)
        if self.trace is not None:
            self.trace.write(full if self.options.trace_chunks else record)
        if self.options.on_step is not None:
            self.options.on_step(full)


def _error(exc: BaseException, attempts: int) -> dict[str, Any]:
    return dict(kind=type(exc).__name__, message=str(exc), attempts=attempts)


def with_ids(items: Iterable[AgentInput]) -> Iterable[AgentInput]:
    """Each item with a doc_id: its own, or its input position."""
    return (replace(it, doc_id=it.doc_id or str(i)) for i, it in enumerate(items))


def run_workflow(wf: Any, items: Sequence[AgentInput],
                 on_result: Callable[[AgentResult], None] | None = None) -> list[AgentResult]:
    """Run every (question, document) pair through `wf` (a Runner); results come back in input order.

    on_result: called with each result as soon as its document finishes (finishing order), e.g. to write it
    out, so an error in a later document does not lose it. `wf.stats` holds the run's counts afterwards."""
    items = list(with_ids(items))
    wf.check_budget(items)
    results, wf.stats = _drive(wf, wf, items, on_result, len(items), collect=True)
    return results


def stream_workflow(wf: Any, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None],
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

    def __init__(self, wf: Any) -> None:
        self.wf = wf
        self.next_call, self.take, self.fail, self.params = wf.next_call, wf.take, wf.fail, wf.params

    def start(self, pos: int, item: AgentInput) -> Any:
        self.wf.check_budget([item])
        return self.wf.start(pos, item)


def _drive(steps: Any, wf: Any, items: Iterable[AgentInput], on_result: Callable[[AgentResult], None] | None,
           total: int | None, collect: bool) -> tuple[list[AgentResult], RunStats]:
    o = wf.options
    wf.trace = TraceWriter(o.trace_path) if o.trace_path else None
    schedule = resolve_schedule(o.schedule, wf.backend)
    bar = _Progress(total) if o.progress and total is not None else None
    go = run_pipelined if schedule == "pipelined" else run_lockstep
    try:
        return go(steps, wf.backend, items, wf.config.max_batch_docs, wf.config.seed, o.failures,
                  on_result, bar.update if bar else None, collect)
    finally:
        if wf.trace is not None:
            wf.trace.close()
        wf.trace = None
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

"""`memagent ask`: build the backend and the agent from CLI options and run one or many questions.

The settings come from `memagent.protocol.resolve.model_profile` (built-in profile, the model's memagent.json,
--profile, the flags); the files (--input, --output, the output checks) from `memagent.ask.io`.
"""
from __future__ import annotations

import errno
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

from memagent.agent.registry import DEFAULT_WORKFLOW, AgentInput, BoundWorkflow, build_workflow, run_workflow
from memagent.ask.io import ResultLog, check_ask_outputs, document_inputs, failures_error, profile_path_for, read_inputs
from memagent.backends.options import BackendOptions
from memagent.errors import InputError
from memagent.config import AgentConfig, rule
from memagent.documents import check_document
from memagent.documents.reading import open_document
from memagent.flags import ERRORS, MODEL_HELP, WORKFLOW_OPTION_HELP, BudgetOptions, SamplingOptions, check_options, flag
from memagent.io import is_sink, read_text
from memagent.lock import file_lock
from memagent.protocol.profile import Profile, open_backend, write_profile
from memagent.protocol.resolve import workflow_profile
from memagent.scale.options import RayOptions
from memagent.scale.runs import ray_ask
from memagent.split_prompt import parse_rule, split_prompt


@dataclass
class AskOptions:
    """What `memagent ask` was asked: one field per command-line option (the CLI is built from them)."""

    model: str = field(metadata=flag(MODEL_HELP))
    question: Optional[str] = field(default=None, metadata=flag("The question to answer."))
    document: Optional[str] = field(default=None, metadata=flag(
        "File to read: text, PDF, HTML or EPUB (told apart by content; docs/documents.md), or - for text on stdin."))
    prompt: Optional[str] = field(default=None, metadata=flag(
        "Text file (or -) holding document and question in ONE prompt, as harnesses send it; the question is "
        "found by --prompt-split."))
    prompt_split: str = field(default="auto", metadata=flag(
        "With --prompt: where the question is: auto (= paragraph) | paragraph | line | separator:TEXT "
        "(docs/harnesses.md)."))
    input: Optional[Path] = field(default=None, metadata=flag(
        "JSONL of many: {id, question, context | document}; runs as one batch."))
    output: Optional[Path] = field(default=None, metadata=flag(
        "With --input: where to write one JSON result a line (default stdout)."))
    backend: BackendOptions = field(default_factory=BackendOptions)
    profile: Optional[Path] = field(default=None, metadata=flag(
        "Protocol profile (YAML, e.g. configs/profiles/memagent.yaml); flags override it."))
    # None: the profile's value (the built-in profile, the model's memagent.json, then --profile)
    budgets: BudgetOptions = field(default_factory=BudgetOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    trace: Optional[Path] = field(default=None, metadata=flag("Write one JSONL record per model call."))
    trace_chunks: bool = field(default=False, metadata=flag(
        "With --trace: also write each chunk's text (chunk_text), for `memagent report`."))
    errors: str = field(default="strict", metadata={**rule(choices=ERRORS), **flag(
        "strict: invalid UTF-8 is an error; replace: substitute U+FFFD.")})
    batch_docs: int = field(default=16, metadata={**rule(min=1), **flag("Documents in flight at once.")})
    progress: bool = field(default=True, metadata=flag("Progress bar on stderr.", "--progress/--no-progress"))
    workflow: str = field(default=DEFAULT_WORKFLOW, metadata=flag(
        "Reading workflow: memagent (the paper's overwrite loop), lookup, skim, or one a package registers."))
    workflow_option: list[str] = field(default_factory=list, metadata=flag(WORKFLOW_OPTION_HELP, "--workflow-option"))
    ray: RayOptions = field(default_factory=RayOptions)  # --ray [ADDRESS], --ray-workers: shard over Ray actors

    checks_itself: ClassVar[bool] = True  # checked as built (the CLI and a Python caller alike), once

    def __post_init__(self) -> None:
        check_options(self)  # each option's rule, beside its field


@dataclass(frozen=True)
class AskRun:
    """What `ask` runs with, resolved once from its options: the profile, the one agent config built from it,
    and the workflow bound to its options (the profile's, then --workflow-option's: parsed and checked once)."""

    profile: Profile
    config: AgentConfig
    workflow: BoundWorkflow


def run_ask(o: AskOptions) -> None:
    """Answer one question (printed) or every line of --input (written as each finishes; a rerun resumes)."""
    if o.prompt is not None:
        if o.question is not None or o.document is not None or o.input is not None:
            raise InputError("--prompt holds document and question together; do not combine it with "
                             "--question/--document/--input")
        if o.output is not None:
            raise InputError("--output is for --input (many questions); the answer of --prompt is printed to stdout")
        return _ask_prompt(o, _resolve(o))
    if o.input is None and (o.question is None or o.document is None):
        raise InputError("give --question and --document, or --input FILE.jsonl")
    if o.input is not None and (o.question is not None or o.document is not None):
        raise InputError("--input runs many questions; do not combine it with --question/--document")
    if o.output is not None and o.input is None:
        raise InputError("--output is for --input (many questions); one answer is printed to stdout")
    if o.ray.address is not None and o.input is None:
        raise InputError("--ray shards many questions over Ray actors; give them with --input FILE.jsonl")
    run = _resolve(o)  # settings checked before any file is read
    if o.input is not None:
        items = read_inputs(o.input, o.errors)
        if not items:
            raise InputError(f"{o.input} holds no questions")
    else:
        doc = open_document(o.document)
        if isinstance(doc, Path) and not doc.exists():
            raise InputError(f"document file not found: {doc}")
        if isinstance(doc, Path) and doc.is_dir():
            raise InputError(f"--document {doc} is a folder; give a text file (or - for stdin)")
        if isinstance(doc, Path):
            check_document(doc, o.errors)  # a PDF, HTML or EPUB file is checked before any model call
        items = [AgentInput(o.question, doc, "0")]
    if o.input is not None:
        inputs = {"--input": o.input, **document_inputs(items)}
    else:
        inputs = {"--document": items[0].document}
    inputs["--profile"] = o.profile
    check_ask_outputs(o.output, o.trace, o.model, inputs)
    with file_lock(o.output, "ask") if o.output is not None else nullcontext():  # one run per --output
        _answer(o, items, run)


def _resolve(o: AskOptions) -> AskRun:
    """The profile (memagent.protocol.resolve.model_profile), its agent config and the workflow's options."""
    profile, workflow = workflow_profile(o.model, o.profile, o.budgets, o.sampling, o.workflow, o.workflow_option)
    return AskRun(profile, profile.agent_config(max_batch_docs=o.batch_docs), workflow)


def _ask_prompt(o: AskOptions, run: AskRun) -> None:
    """`ask --prompt FILE`: split the one-message prompt by --prompt-split, then answer it as one question."""
    rule = parse_rule(o.prompt_split)
    if rule.kind == "messages":
        raise InputError("--prompt-split messages is for chat requests; for --prompt use auto, paragraph, line or "
                         "separator:TEXT")
    path = None if o.prompt == "-" else Path(o.prompt)
    if path is not None and not path.is_file():
        raise InputError(f"--prompt {o.prompt}: no such file; give a text file (or - for stdin)")
    text = sys.stdin.read() if path is None else read_text(path, "--prompt file", InputError)
    try:
        document, question = split_prompt(text, rule)
    except InputError as e:
        raise InputError(f"--prompt: {e}; choose another --prompt-split, or give --document and --question") from None
    check_ask_outputs(o.output, o.trace, o.model, {"--prompt": path} if path is not None else {})
    _answer(o, [AgentInput(question, document, "0")], run)


def _answer(o: AskOptions, items: list[AgentInput], run: AskRun) -> None:
    """Run the questions not yet answered in --output (all of them without it); print or write the results."""
    profile, config = run.profile, run.config
    results = ResultLog(o.output if o.input is not None else None)
    todo = [it for it in items if it.doc_id not in results.done]
    if not todo:
        print(f"all {len(items)} questions of {o.input} are already answered in {o.output}", file=sys.stderr)
        return
    backend = open_backend(o.model, o.backend, profile) if o.ray.address is None else None  # a model that cannot
    #   start (a vLLM engine that fails, a missing model) leaves nothing written
    if o.output and not is_sink(o.output):  # a sink (/dev/null) gets no side file beside it
        write_profile(profile, profile_path_for(o.output))
    if o.ray.address is not None:  # the same batches on Ray actors (memagent[ray]); results written here
        with _open_trace(o.trace, append=bool(results.done)) as trace, results:
            ray_ask(o.model, o.backend, profile, config, todo, results.write, trace, o.ray, errors=o.errors,
                    trace_chunks=o.trace_chunks, progress=o.progress, workflow=o.workflow,
                    workflow_options=run.workflow.options)
        if results.failed:
            raise failures_error(results, len(todo))
        return
    with _open_trace(o.trace, append=bool(results.done)) as trace:
        agent = build_workflow(run.workflow, backend, config, trace_path=trace, progress=o.progress, errors=o.errors,
                               trace_chunks=o.trace_chunks, failures="raise" if o.input is None else "record")
        if o.input is None:
            r = run_workflow(agent, todo)[0]
            missing = "\\boxed{}" if config.answer_protocol == "boxed" else '"the answer is"'
            print(r.answer if r.answer is not None else f"(no answer: the model wrote no {missing}) {r.raw_answer.strip()}")
            return
        with results:
            run_workflow(agent, todo, on_result=results.write)
        if results.failed:
            raise failures_error(results, len(todo))


def _open_trace(path: Optional[Path], append: bool) -> Any:
    """The --trace file (appended to when a rerun resumes), or no trace."""
    if path is None:
        return nullcontext(None)
    return _trace_file(path, append)


@contextmanager
def _trace_file(path: Path, append: bool) -> Iterator[Any]:
    """The open --trace file; a full disk (or device, /dev/full) while writing it names the file."""
    if not is_sink(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "a" if append else "w", encoding="utf-8") as fh:
            yield fh
    except OSError as e:
        if e.filename is None and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            e.filename = str(path)
        raise

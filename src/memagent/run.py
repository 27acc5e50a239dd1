"""`memagent ask`: build the backend and the agent from CLI options and run one or many questions."""
from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from memagent.agent.chunking import open_document
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.ask_io import ResultLog, check_ask_outputs, document_inputs, read_jsonl_inputs
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig
from memagent.errors import InputError
from memagent.flags import check_flags
from memagent.io import atomic_write_text, read_text
from memagent.lock import file_lock
from memagent.profile import Profile, profile_from_dict, resolve_profile, write_profile


@dataclass
class AskOptions:
    model: str
    question: Optional[str] = None
    document: Optional[str] = None
    input: Optional[Path] = None
    output: Optional[Path] = None
    backend: BackendOptions = field(default_factory=BackendOptions)
    profile: Optional[Path] = None  # a protocol profile (YAML); None: the built-in one
    # None: the profile's value (the built-in profile, the model's memagent.json, then --profile)
    chunk_tokens: Optional[int] = None
    memory_tokens: Optional[int] = None
    answer_tokens: Optional[int] = None
    query_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    trace: Optional[Path] = None
    trace_chunks: bool = False  # the trace's memory records also hold their chunk's text
    errors: str = "strict"
    batch_docs: int = 16
    progress: bool = True


AGENT_SETTINGS_FILE = "memagent.json"  # optional, in a model directory: the prompt settings it was trained with
_SETTING_KEYS = ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens", "memory_template",
                 "final_template", "empty_memory")


def model_agent_settings(model: str) -> dict[str, Any]:
    """The AgentConfig fields saved beside a model (`memagent.json`), e.g. by `memagent demo`; {} if none."""
    path = Path(model) / AGENT_SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(read_text(path, "model settings file", InputError))
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e.msg}); fix it or remove it") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must be a JSON object of settings ({', '.join(_SETTING_KEYS)})")
    unknown = sorted(set(data) - set(_SETTING_KEYS))
    if unknown:
        raise InputError(f"{path}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(_SETTING_KEYS)}")
    for key, value in data.items():
        if key.endswith("_tokens"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"{path}: {key} must be a positive integer, got {value!r}")
        elif not isinstance(value, str):
            raise InputError(f"{path}: {key} must be a string, got {type(value).__name__}")
    return dict(data)


def save_agent_settings(model_dir: str | Path, config: AgentConfig) -> Path:
    """Write `config`'s prompt settings beside a saved model, where `model_agent_settings` reads them."""
    path = Path(model_dir) / AGENT_SETTINGS_FILE
    return atomic_write_text(path, json.dumps({k: getattr(config, k) for k in _SETTING_KEYS}, indent=2) + "\n")


def ask_profile(o: AskOptions) -> Profile:
    """The settings `ask` runs with: built-in profile, the model's memagent.json, --profile, then flags."""
    settings = model_agent_settings(o.model)
    sections = dict(prompts=("memory_template", "final_template", "empty_memory"),
                    budgets=("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens"))
    base = profile_from_dict({name: {k: settings[k] for k in keys if k in settings} for name, keys in sections.items()},
                             source=str(Path(o.model) / AGENT_SETTINGS_FILE))
    return resolve_profile(o.profile, base, chunk_tokens=o.chunk_tokens, memory_tokens=o.memory_tokens,
                           answer_tokens=o.answer_tokens, query_tokens=o.query_tokens, temperature=o.temperature,
                           top_p=o.top_p, seed=o.seed)


def profile_path_for(output: Path) -> Path:
    """Where the resolved profile of `ask --output X` goes: beside X, as X's stem + .profile.yaml."""
    return output.with_name(output.stem + ".profile.yaml")


def run_ask(o: AskOptions) -> None:
    """Answer one question (printed) or every line of --input (written as each finishes; a rerun resumes)."""
    check_flags({**{k: v for k, v in dataclasses.asdict(o).items() if k not in ("input", "backend")},
                 **o.backend.flags()})
    if o.input is None and (o.question is None or o.document is None):
        raise InputError("give --question and --document, or --input FILE.jsonl")
    if o.input is not None and (o.question is not None or o.document is not None):
        raise InputError("--input runs many questions; do not combine it with --question/--document")
    if o.output is not None and o.input is None:
        raise InputError("--output is for --input (many questions); one answer is printed to stdout")
    profile = ask_profile(o)
    profile.agent_config(max_batch_docs=o.batch_docs)  # settings checked before any file is read
    if o.input is not None:
        items = read_jsonl_inputs(o.input)
        if not items:
            raise InputError(f"{o.input} holds no questions")
    else:
        doc = open_document(o.document)
        if isinstance(doc, Path) and not doc.exists():
            raise InputError(f"document file not found: {doc}")
        if isinstance(doc, Path) and doc.is_dir():
            raise InputError(f"--document {doc} is a folder; give a text file (or - for stdin)")
        items = [AgentInput(o.question, doc, "0")]
    if o.input is not None:
        inputs = {"--input": o.input, **document_inputs(items)}
    else:
        inputs = {"--document": items[0].document}
    check_ask_outputs(o.output, o.trace, o.model, inputs)
    with file_lock(o.output, "ask") if o.output is not None else nullcontext():  # one run per --output
        _answer(o, items, profile)


def _answer(o: AskOptions, items: list[AgentInput], profile: Profile) -> None:
    """Run the questions not yet answered in --output (all of them without it); print or write the results."""
    config = profile.agent_config(max_batch_docs=o.batch_docs)
    results = ResultLog(o.output if o.input is not None else None)
    todo = [it for it in items if it.doc_id not in results.done]
    if not todo:
        print(f"all {len(items)} questions of {o.input} are already answered in {o.output}", file=sys.stderr)
        return
    backend = replace(o.backend, chat_template_kwargs=profile.chat_template_kwargs,
                      yarn_factor=profile.budgets.yarn_factor).load(o.model)
    if o.output:
        write_profile(profile, profile_path_for(o.output))
    with _open_trace(o.trace, append=bool(results.done)) as trace:
        agent = MemoryAgent(backend, config, trace_path=trace, progress=o.progress, errors=o.errors,
                            trace_chunks=o.trace_chunks)
        if o.input is None:
            r = agent.run(todo)[0]
            missing = "\\boxed{}" if config.answer_protocol == "boxed" else '"the answer is"'
            print(r.answer if r.answer is not None else f"(no answer: the model wrote no {missing}) {r.raw_answer.strip()}")
            return
        with results:
            agent.run(todo, on_result=results.write)


def _open_trace(path: Optional[Path], append: bool) -> Any:
    """The --trace file (appended to when a rerun resumes), or no trace."""
    if path is None:
        return nullcontext(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a" if append else "w", encoding="utf-8")

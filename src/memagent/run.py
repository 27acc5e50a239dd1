"""`memagent ask`: build the backend and the agent from CLI options and run one or many questions."""
from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from memagent.agent.chunking import open_document
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.ask_io import ResultLog, check_ask_outputs, document_inputs, read_jsonl_inputs
from memagent.backends import load_backend
from memagent.config import AgentConfig
from memagent.errors import InputError
from memagent.flags import check_flags
from memagent.io import atomic_write_text, read_text


@dataclass
class AskOptions:
    model: str
    question: Optional[str] = None
    document: Optional[str] = None
    input: Optional[Path] = None
    output: Optional[Path] = None
    backend: str = "transformers"
    chunk_tokens: Optional[int] = None  # None: the model's memagent.json, else AgentConfig's default
    memory_tokens: Optional[int] = None
    answer_tokens: Optional[int] = None
    query_tokens: Optional[int] = None
    trace: Optional[Path] = None
    errors: str = "strict"
    temperature: float = 0.0
    batch_docs: int = 16
    base_url: Optional[str] = None
    tokenizer: Optional[str] = None
    device: str = "auto"
    dtype: str = "auto"
    tensor_parallel: int = 1
    max_concurrency: int = 8
    request_timeout: float = 600.0
    max_retries: int = 4
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


def backend_kwargs(o: AskOptions) -> dict[str, Any]:
    """The options of the chosen backend; an option of another backend is an error, not ignored."""
    if o.backend != "openai" and o.base_url is not None:
        raise InputError(f"--base-url is for --backend openai, not {o.backend}")
    if o.backend == "transformers":
        if o.tokenizer is not None:
            raise InputError("--tokenizer is for --backend openai or vllm; transformers uses the model's own")
        return dict(device=o.device, dtype=o.dtype)
    if o.backend == "openai":
        return dict(base_url=o.base_url, tokenizer=o.tokenizer, max_concurrency=o.max_concurrency,
                    timeout=o.request_timeout, max_retries=o.max_retries)
    if o.backend == "vllm":
        kw: dict[str, Any] = dict(tensor_parallel_size=o.tensor_parallel, dtype=o.dtype)
        if o.tokenizer is not None:
            kw["tokenizer"] = o.tokenizer  # vllm.LLM(tokenizer=...)
        return kw
    return {}


def run_ask(o: AskOptions) -> None:
    """Answer one question (printed) or every line of --input (written as each finishes; a rerun resumes)."""
    check_flags({k: v for k, v in dataclasses.asdict(o).items() if k != "input"})
    if o.input is None and (o.question is None or o.document is None):
        raise InputError("give --question and --document, or --input FILE.jsonl")
    if o.input is not None and (o.question is not None or o.document is not None):
        raise InputError("--input runs many questions; do not combine it with --question/--document")
    if o.output is not None and o.input is None:
        raise InputError("--output is for --input (many questions); one answer is printed to stdout")
    settings = model_agent_settings(o.model)
    for name in ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens"):
        if getattr(o, name) is not None:
            settings[name] = getattr(o, name)
    config = AgentConfig(**settings, temperature=o.temperature, max_batch_docs=o.batch_docs)
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
    results = ResultLog(o.output if o.input is not None else None)
    todo = [it for it in items if it.doc_id not in results.done]
    if not todo:
        print(f"all {len(items)} questions of {o.input} are already answered in {o.output}", file=sys.stderr)
        return
    backend = load_backend(o.backend, o.model, **backend_kwargs(o))
    with _open_trace(o.trace, append=bool(results.done)) as trace:
        agent = MemoryAgent(backend, config, trace_path=trace, progress=o.progress, errors=o.errors)
        if o.input is None:
            r = agent.run(todo)[0]
            print(r.answer if r.answer is not None else f"(no answer: the model wrote no \\boxed{{}}) {r.raw_answer.strip()}")
            return
        with results:
            agent.run(todo, on_result=results.write)


def _open_trace(path: Optional[Path], append: bool) -> Any:
    """The --trace file (appended to when a rerun resumes), or no trace."""
    if path is None:
        return nullcontext(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a" if append else "w", encoding="utf-8")

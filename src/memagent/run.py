"""`memagent ask`: build the backend and the agent from CLI options and run one or many questions."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from memagent.agent.chunking import open_document
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends import load_backend
from memagent.config import AgentConfig
from memagent.errors import InputError
from memagent.jsonl import iter_jsonl


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


def read_jsonl_inputs(path: Path) -> Iterator[AgentInput]:
    """Lines of {id?, question, context | document (a path, relative to the JSONL file), memory? (to start
    from, e.g. the final memory of an earlier run over the text before)}."""
    if not path.exists():
        raise InputError(f"input file not found: {path}")
    for n, rec in iter_jsonl(path, InputError):
        if not isinstance(rec, dict) or "question" not in rec:
            raise InputError(f"{path}:{n}: each line needs a 'question' field")
        if "context" in rec:
            doc: Any = rec["context"]
        elif "document" in rec:
            doc = Path(rec["document"]) if Path(rec["document"]).is_absolute() else path.parent / rec["document"]
        else:
            raise InputError(f"{path}:{n}: each line needs 'context' (text) or 'document' (a file path)")
        memory = rec.get("memory")
        if memory is not None and not isinstance(memory, str):
            raise InputError(f"{path}:{n}: 'memory' (the memory to start from) must be a string")
        yield AgentInput(rec["question"], doc, str(rec.get("id", n)), memory)


AGENT_SETTINGS_FILE = "memagent.json"  # optional, in a model directory: the prompt settings it was trained with
_SETTING_KEYS = ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens", "memory_template",
                 "final_template", "empty_memory")


def model_agent_settings(model: str) -> dict[str, Any]:
    """The AgentConfig fields saved beside a model (`memagent.json`), e.g. by `memagent demo`; {} if none."""
    path = Path(model) / AGENT_SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e.msg})") from None
    unknown = sorted(set(data) - set(_SETTING_KEYS))
    if unknown:
        raise InputError(f"{path}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(_SETTING_KEYS)}")
    return dict(data)


def save_agent_settings(model_dir: str | Path, config: AgentConfig) -> Path:
    """Write `config`'s prompt settings beside a saved model, where `model_agent_settings` reads them."""
    path = Path(model_dir) / AGENT_SETTINGS_FILE
    path.write_text(json.dumps({k: getattr(config, k) for k in _SETTING_KEYS}, indent=2) + "\n", encoding="utf-8")
    return path


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
    if o.input is None and (o.question is None or o.document is None):
        raise InputError("give --question and --document, or --input FILE.jsonl")
    if o.input is not None and (o.question is not None or o.document is not None):
        raise InputError("--input runs many questions; do not combine it with --question/--document")
    settings = model_agent_settings(o.model)
    for name in ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens"):
        if getattr(o, name) is not None:
            settings[name] = getattr(o, name)
    config = AgentConfig(**settings, temperature=o.temperature, max_batch_docs=o.batch_docs)
    if o.input is not None:
        items = list(read_jsonl_inputs(o.input))
        if not items:
            raise InputError(f"{o.input} holds no questions")
    else:
        doc = open_document(o.document)
        if isinstance(doc, Path) and not doc.exists():
            raise InputError(f"document file not found: {doc}")
        items = [AgentInput(o.question, doc, "0")]
    backend = load_backend(o.backend, o.model, **backend_kwargs(o))
    agent = MemoryAgent(backend, config, trace_path=o.trace, progress=o.progress, errors=o.errors)
    results = agent.run(items)
    if o.input is None:
        r = results[0]
        print(r.answer if r.answer is not None else f"(no answer: the model wrote no \\boxed{{}}) {r.raw_answer.strip()}")
        return
    out = open(o.output, "w", encoding="utf-8") if o.output else sys.stdout
    try:
        for r in results:
            out.write(json.dumps(dict(id=r.doc_id, question=r.question, answer=r.answer,
                                      raw_answer=r.raw_answer, memory=r.memory, num_chunks=r.num_chunks),
                                 ensure_ascii=False) + "\n")
    finally:
        if o.output:
            out.close()

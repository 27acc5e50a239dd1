"""`memagent ask`: build the backend and the agent from CLI options and run one or many questions."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional

from memagent.agent.chunking import open_document
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig
from memagent.errors import InputError
from memagent.jsonl import iter_jsonl
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
    errors: str = "strict"
    batch_docs: int = 16
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
    if o.input is None and (o.question is None or o.document is None):
        raise InputError("give --question and --document, or --input FILE.jsonl")
    if o.input is not None and (o.question is not None or o.document is not None):
        raise InputError("--input runs many questions; do not combine it with --question/--document")
    profile = ask_profile(o)
    config = profile.agent_config(max_batch_docs=o.batch_docs)
    if o.input is not None:
        items = list(read_jsonl_inputs(o.input))
        if not items:
            raise InputError(f"{o.input} holds no questions")
    else:
        doc = open_document(o.document)
        if isinstance(doc, Path) and not doc.exists():
            raise InputError(f"document file not found: {doc}")
        items = [AgentInput(o.question, doc, "0")]
    backend = replace(o.backend, chat_template_kwargs=profile.chat_template_kwargs,
                      yarn_factor=profile.budgets.yarn_factor).load(o.model)
    agent = MemoryAgent(backend, config, trace_path=o.trace, progress=o.progress, errors=o.errors)
    results = agent.run(items)
    if o.input is None:
        r = results[0]
        missing = "\\boxed{}" if config.answer_protocol == "boxed" else '"the answer is"'
        print(r.answer if r.answer is not None else f"(no answer: the model wrote no {missing}) {r.raw_answer.strip()}")
        return
    if o.output:
        write_profile(profile, profile_path_for(o.output))
    out = open(o.output, "w", encoding="utf-8") if o.output else sys.stdout
    try:
        for r in results:
            out.write(json.dumps(dict(id=r.doc_id, question=r.question, answer=r.answer,
                                      raw_answer=r.raw_answer, memory=r.memory, num_chunks=r.num_chunks),
                                 ensure_ascii=False) + "\n")
    finally:
        if o.output:
            out.close()

"""`memagent eval`: methods x data files (tasks at several lengths), one JSONL record per sample.

Every (model, method, data file, sample) has a key; a record is appended to `results.jsonl`
and flushed to disk as soon as its group of samples is done, and a rerun skips the keys already
there, so a sweep killed mid-way (crash, Ctrl-C, lost machine) resumes where it stopped. A line
cut short by a crash is dropped on the next run. Samples run in groups of
`AgentConfig.max_batch_docs`: MemAgent reads a group's documents in one batch per step, the
baselines generate a group's prompts in one batch.

Record: key, model, method, data, task, sample_id, length, length_unit, metric, score (the
sample's own metric), scores (the metric family: em/f1/sub_em or string_match_all/part),
prediction (boxed answer or null), raw (the model's last reply), gold, tokens (prompt and
generated tokens over all calls, calls, document tokens, tokens kept in the prompt), seconds
(the group's wall-clock divided by its size), group_size, note.
"""
from __future__ import annotations

import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from memagent.agent.answer import final_answer
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig
from memagent.eval.baselines import (BASELINE_TEMPLATE, EvalError, bm25_context, context_budget, middle_truncate,
                                     render_baseline)
from memagent.tasks.metrics import get_metric
from memagent.tasks.schema import ParagraphCache, count_tokens, read_samples, sample_document

if TYPE_CHECKING:
    from memagent.profile import Profile

__all__ = ["METHODS", "EvalOptions", "SweepConfig", "load_done", "run_eval", "run_sweep"]

METHODS = ("memagent", "full-context", "rag-bm25")
_QA = ("em", "f1", "sub_em")
_RULER = ("string_match_all", "string_match_part")


@dataclass
class SweepConfig:
    model_name: str  # the row label of the table (a model id or path)
    methods: Sequence[str] = METHODS
    agent: AgentConfig = field(default_factory=AgentConfig)  # MemAgent's budget; answer_tokens for all
    window: int | None = None  # the baselines' context window (default: the backend's)
    baseline_answer_tokens: int | None = None  # the baselines' max new tokens (default: agent.answer_tokens)
    baseline_template: str = BASELINE_TEMPLATE  # the baselines' prompt: {question} and {context}
    passage_tokens: int = 512  # rag-bm25 passage size
    limit: int | None = None  # at most this many samples of each data file

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise EvalError(f"unknown method(s) {unknown}; choose from: {', '.join(METHODS)}")


def load_done(path: Path) -> set[str]:
    """Keys of the finished records; a last line cut short by a crash is removed from the file."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with open(path, "r+b") as fh:
            fh.truncate(cut)
        data = data[:cut]
    done = set()
    for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if line.strip():
            try:
                done.add(json.loads(line)["key"])
            except (json.JSONDecodeError, KeyError) as exc:
                raise EvalError(f"{path}:{n} is not a result record ({exc}); move the file away to start over") from None
    return done


def _scores(sample: dict, prediction: str | None) -> tuple[float, dict[str, float]]:
    metric = sample.get("metric", "sub_em")
    family = _RULER if metric.startswith("string_match") else _QA
    scores = {name: get_metric(name)(prediction, sample["answers"]) for name in dict.fromkeys((*family, metric))}
    return scores[metric], scores


def _record(cfg: SweepConfig, method: str, data: Path, sample: dict, prediction: str | None, raw: str,
            tokens: dict[str, int], seconds: float, group_size: int, note: str = "") -> dict:
    score, scores = _scores(sample, prediction)
    return dict(
        key=_key(cfg, method, data, sample), model=cfg.model_name, method=method, data=data.name,
        task=sample["task"], sample_id=sample["id"], length=sample.get("length", sample.get("num_docs")),
        length_unit=sample.get("length_unit", "docs"), metric=sample.get("metric", "sub_em"), score=score,
        scores=scores, prediction=prediction, raw=raw, gold=sample["answers"], tokens=tokens,
        seconds=round(seconds, 4), group_size=group_size, note=note)


def _key(cfg: SweepConfig, method: str, data: Path, sample: dict) -> str:
    return f"{cfg.model_name}|{method}|{data.name}|{sample['id']}"


def _memagent_group(backend: Any, cfg: SweepConfig, group: list[tuple[Path, dict]], docs: ParagraphCache) -> list[dict]:
    from memagent.agent.workflow import AgentInput, MemoryAgent

    trace = io.StringIO()
    items = [AgentInput(s["question"], sample_document(s, docs), str(i)) for i, (_, s) in enumerate(group)]
    t0 = time.perf_counter()
    results = MemoryAgent(backend, cfg.agent, trace_path=trace).run(items)  # type: ignore[arg-type]
    seconds = (time.perf_counter() - t0) / len(group)
    usage = {str(i): dict(prompt=0, generated=0, calls=0, document=0) for i in range(len(group))}
    for line in trace.getvalue().splitlines():
        call = json.loads(line)
        u = usage[call["doc_id"]]
        u["calls"] += 1
        u["prompt"] += call["prompt_tokens"]
        if call.get("kind") == "final":
            u["generated"] += count_tokens(backend.tokenizer, call["raw_answer"])
        else:
            u["generated"] += call["memory_tokens"]
            u["document"] += call["chunk_tokens"]
    out = []
    for i, ((data, sample), res) in enumerate(zip(group, results)):
        u = usage[str(i)]
        u["kept"] = u["document"]
        out.append(_record(cfg, "memagent", data, sample, res.answer, res.raw_answer, u, seconds, len(group),
                           f"{res.num_chunks} chunks"))
    return out


def _baseline_group(backend: Any, cfg: SweepConfig, method: str, group: list[tuple[Path, dict]],
                    docs: ParagraphCache) -> list[dict]:
    from memagent.backends.base import SamplingParams

    t0 = time.perf_counter()
    prepared, prompts = [], []
    answer_tokens = cfg.baseline_answer_tokens or cfg.agent.answer_tokens
    for _, s in group:
        budget = context_budget(backend, s["question"], answer_tokens, cfg.window, cfg.baseline_template)
        doc = sample_document(s, docs)
        if method == "full-context":
            p = middle_truncate(doc, backend.tokenizer, budget)
        else:
            p = bm25_context(s["question"], doc, backend.tokenizer, budget, cfg.passage_tokens)
        prepared.append(p)
        prompts.append(render_baseline(s["question"], p.context, cfg.baseline_template))
    params = SamplingParams(answer_tokens, cfg.agent.temperature, cfg.agent.top_p, cfg.agent.seed)
    gens = backend.generate(prompts, params)
    seconds = (time.perf_counter() - t0) / len(group)
    out = []
    for (data, sample), p, prompt, gen in zip(group, prepared, prompts, gens):
        n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else backend.prompt_length(prompt)
        tokens = dict(prompt=n_prompt, generated=len(gen.token_ids), calls=1, document=p.document_tokens,
                      kept=p.kept_tokens)
        answer, _ = final_answer(gen.text, cfg.agent.answer_protocol, cfg.agent.think)
        out.append(_record(cfg, method, data, sample, answer, gen.text, tokens, seconds, len(group), p.note))
    return out


def _pending(cfg: SweepConfig, method: str, data_files: Sequence[Path], done: set[str]) -> Iterator[tuple[Path, dict]]:
    for data in data_files:
        for n, sample in enumerate(read_samples(data)):
            if cfg.limit is not None and n >= cfg.limit:
                break
            if _key(cfg, method, data, sample) not in done:
                yield data, sample


def _groups(items: Iterator[tuple[Path, dict]], size: int) -> Iterator[list[tuple[Path, dict]]]:
    group: list[tuple[Path, dict]] = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def run_sweep(backend: Any, data_files: Sequence[str | Path], out_dir: str | Path, cfg: SweepConfig,
              on_record: Callable[[dict], None] | None = None, progress: bool = False) -> Path:
    """Run every method on every sample not yet in `out_dir/results.jsonl`; returns that path."""
    files = [Path(f) for f in data_files]
    for f in files:
        if not f.is_file():
            raise EvalError(f"data file {f} does not exist; make one with `memagent data ...`")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = load_done(results)
    docs = ParagraphCache()
    bar = _bar(progress)
    with open(results, "a", encoding="utf-8") as fh:
        for method in cfg.methods:
            for group in _groups(_pending(cfg, method, files, done), cfg.agent.max_batch_docs):
                if method == "memagent":
                    records = _memagent_group(backend, cfg, group, docs)
                else:
                    records = _baseline_group(backend, cfg, method, group, docs)
                for rec in records:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                    done.add(rec["key"])
                    if bar:
                        bar(f"{method} {rec['task']} {rec['length']} {rec['sample_id']}: {rec['score']:.2f}")
                    if on_record:
                        on_record(rec)
    return results


def _bar(progress: bool) -> Callable[[str], None] | None:
    if not progress:
        return None
    from rich.console import Console

    console = Console(stderr=True)
    return lambda line: console.print(line, highlight=False)


@dataclass
class EvalOptions:
    """What `memagent eval` was asked (one field per command-line option; backend options shared with ask)."""

    model: str
    data: list[str]
    out: str
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    backend: BackendOptions = field(default_factory=BackendOptions)
    profile: str | None = None  # a protocol profile (YAML); None: the built-in one
    # None: the profile's value
    chunk_tokens: int | None = None
    memory_tokens: int | None = None
    answer_tokens: int | None = None
    query_tokens: int | None = None
    window: int | None = None  # the baselines' window (profile: budgets.baseline_window)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    batch_docs: int = 16
    passage_tokens: int = 512
    limit: int | None = None
    progress: bool = True


def eval_profile(o: EvalOptions) -> "Profile":
    """The settings `eval` runs with: the built-in profile, then --profile, then the flags."""
    from memagent.profile import resolve_profile

    return resolve_profile(o.profile, chunk_tokens=o.chunk_tokens, memory_tokens=o.memory_tokens,
                           answer_tokens=o.answer_tokens, query_tokens=o.query_tokens, window=o.window,
                           temperature=o.temperature, top_p=o.top_p, seed=o.seed,
                           **{k: getattr(o, k) for k in _LATER_FLAGS if hasattr(o, k)})


# flags of the sweep's own options (repeats, scoring) that override the profile where EvalOptions has them;
# each must default to None there so that an absent flag keeps the profile's value
_LATER_FLAGS = ("repeats", "golds", "empty_prediction", "failed")


def sweep_config(o: EvalOptions, profile: "Profile") -> SweepConfig:
    """The sweep's settings from the options and the resolved profile.

    The profile's scoring options and repeats go to SweepConfig fields of those names where the
    sweep has them (`scoring`, `repeats`)."""
    from dataclasses import fields

    b = profile.budgets
    extra = {"scoring": profile.scoring, "repeats": profile.sampling.repeats}
    known = {f.name for f in fields(SweepConfig)}
    return SweepConfig(
        model_name=o.model, methods=o.methods, window=b.baseline_window, passage_tokens=o.passage_tokens,
        limit=o.limit, baseline_answer_tokens=b.baseline_answer_tokens,
        baseline_template=profile.prompts.baseline_template,
        agent=profile.agent_config(max_batch_docs=o.batch_docs), **{k: v for k, v in extra.items() if k in known})


def run_eval(o: EvalOptions) -> str:
    """Build the backend, run the sweep (resuming), write profile.yaml, table.md and plots; returns the table."""
    from dataclasses import replace

    from memagent.profile import write_profile

    profile = eval_profile(o)
    cfg = sweep_config(o, profile)
    backend = replace(o.backend, chat_template_kwargs=profile.chat_template_kwargs,
                      yarn_factor=profile.budgets.yarn_factor).load(o.model)
    write_profile(profile, Path(o.out) / "profile.yaml")
    results = run_sweep(backend, o.data, o.out, cfg, progress=o.progress)
    from memagent.eval.report import write_report

    text, _, _ = write_report(results, o.out)
    return text

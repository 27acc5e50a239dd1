"""Running the sweep's units on a backend: the records of one unit (`run_unit`), the samples of one method and
repeat as one stream on a concurrent backend (`run_stream`), and the settings check before any model call
(`check_settings`). Nothing here writes a file: the records go back to the caller (the sweep writes them).

A unit whose model calls fail (a `MemAgentError`: the backend gave up after its retries, a document cannot be
read) is run again one sample at a time, and a sample that still fails gives an error record (see
`memagent.eval.sweep` for the record's fields).
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from memagent.agent.answer import final_answer
from memagent.agent.registry import AgentInput, build_workflow, run_workflow, stream_workflow
from memagent.backends.base import SamplingParams
from memagent.errors import MemAgentError
from memagent.eval.baselines import bm25_context, context_budget, middle_truncate, render_baseline
from memagent.eval.records import record_length
from memagent.eval.rewards import keep_memory, record_rewards
from memagent.eval.scoring import failed_score, score_sample
from memagent.eval.sweep_config import SweepConfig
from memagent.eval.units import Unit, Work
from memagent.eval.workflow_runs import build_runners, count_call, is_workflow
from memagent.tasks.schema import ParagraphCache, sample_document

__all__ = ["TAG_FIELDS", "check_settings", "error_record", "run_stream", "run_unit"]

log = logging.getLogger(__name__)

TAG_FIELDS = ("order",)  # sample fields a record keeps in `tags` (to split tables by), with the sample's own `tags`


def _base(cfg: SweepConfig, method: str, w: Work, fp: str) -> dict:
    length, unit = record_length(w.sample)
    return dict(
        key=w.key, status="ok", model=cfg.model_name, method=method, data=w.data.name, data_path=w.data.path,
        data_sha256=w.data.sha256, fingerprint=fp, repeat=w.repeat, seed=cfg.seed(w.repeat),
        task=w.sample["task"], sample_id=w.sample["id"], length=length, length_unit=unit,
        metric=w.sample.get("metric", "sub_em"), scoring=dataclasses.asdict(cfg.scoring),
        answer_protocol=cfg.agent.answer_protocol, think=cfg.agent.think, **_tags(w.sample))


def _tags(sample: dict) -> dict[str, Any]:
    """{"tags": {field: value}}: the sample's TAG_FIELDS (a two-hop toy sample's order) and its own `tags` mapping,
    string values only, to split tables by (`memagent eval --split-by`); {} when it has none (the record is then
    as it always was)."""
    own = sample.get("tags") if isinstance(sample.get("tags"), dict) else {}
    tags = {k: v for k, v in {**{f: sample.get(f) for f in TAG_FIELDS}, **own}.items() if isinstance(v, str)}
    return {"tags": tags} if tags else {}


def _record(cfg: SweepConfig, method: str, w: Work, fp: str, prediction: str | None, raw: str,
            tokens: dict[str, int], seconds: float, group_size: int, note: str = "",
            memories: Sequence[str] | None = None) -> dict:
    """An ok record; `memories`: those a workflow wrote, in order (for the step rewards of `cfg.rewards`)."""
    rec = _base(cfg, method, w, fp)
    score, scores = score_sample(rec["metric"], prediction, w.sample["answers"], cfg.scoring)
    rec.update(score=score, scores=scores, prediction=prediction, raw=raw, gold=w.sample["answers"], tokens=tokens,
               seconds=round(seconds, 4), group_size=group_size, note=note,
               **record_rewards(cfg.rewards, w.sample, raw, memories, cfg.agent.empty_memory))
    return rec


def error_record(cfg: SweepConfig, method: str, w: Work, fp: str, exc: BaseException | dict) -> dict:
    """The failure record (status "error") of work `w` under `method`; `exc` is the exception, or an agent
    result's error {kind, message}; its error.attempts is w.attempts + 1."""
    rec = _base(cfg, method, w, fp)
    kind, message = (exc["kind"], exc["message"]) if isinstance(exc, dict) else (type(exc).__name__, str(exc))
    rec.update(status="error", score=failed_score(cfg.scoring), scores={}, prediction=None, raw=None,
               gold=w.sample["answers"], error=dict(kind=kind, message=message, attempts=w.attempts + 1))
    return rec


def _workflow_group(backend: Any, cfg: SweepConfig, method: str, group: Sequence[Work], docs: ParagraphCache,
                    fp: str, runner: Any) -> list[dict]:
    """A group of samples read by the workflow `method` in one run (its calls batched across the group)."""
    trace = io.StringIO()
    agent = dataclasses.replace(cfg.agent, seed=cfg.seed(group[0].repeat))
    items = [AgentInput(w.sample["question"], sample_document(w.sample, docs), str(i)) for i, w in enumerate(group)]
    t0 = time.perf_counter()
    results = run_workflow(runner.bind(config=agent, trace_path=trace, failures="record"), items)
    seconds = (time.perf_counter() - t0) / len(group)
    usage = {str(i): dict(prompt=0, generated=0, calls=0, document=0) for i in range(len(group))}
    memories: dict[str, list[str]] = {str(i): [] for i in range(len(group))}
    for line in trace.getvalue().splitlines():
        call = json.loads(line)
        count_call(usage[call["doc_id"]], call, backend.tokenizer)
        keep_memory(memories[call["doc_id"]], call)
    out = []
    for i, (w, res) in enumerate(zip(group, results)):
        if res.error is not None:  # its calls failed after the backend's retries; the others went on
            log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], w.repeat,
                        res.error["message"])
            out.append(error_record(cfg, method, w, fp, res.error))
            continue
        u = usage[str(i)]
        u["kept"] = u["document"]
        out.append(_record(cfg, method, w, fp, res.answer, res.raw_answer, u, seconds, len(group),
                           f"{res.num_chunks} chunks", memories[str(i)]))
    return out


def _baseline_group(backend: Any, cfg: SweepConfig, method: str, group: Sequence[Work], docs: ParagraphCache,
                    fp: str) -> list[dict]:
    t0 = time.perf_counter()
    prepared, prompts = [], []
    answer_tokens = cfg.baseline_answer_tokens or cfg.agent.answer_tokens
    for w in group:
        s = w.sample
        budget = context_budget(backend, s["question"], answer_tokens, cfg.window, cfg.baseline_template)
        doc = sample_document(s, docs)
        if method == "full-context":
            p = middle_truncate(doc, backend.tokenizer, budget)
        else:
            p = bm25_context(s["question"], doc, backend.tokenizer, budget, cfg.passage_tokens)
        prepared.append(p)
        prompts.append(render_baseline(s["question"], p.context, cfg.baseline_template))
    params = SamplingParams(answer_tokens, cfg.agent.temperature, cfg.agent.top_p, cfg.seed(group[0].repeat))
    gens = backend.generate(prompts, params)
    seconds = (time.perf_counter() - t0) / len(group)
    out = []
    for w, p, prompt, gen in zip(group, prepared, prompts, gens):
        n_prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else backend.prompt_length(prompt)
        tokens = dict(prompt=n_prompt, generated=len(gen.token_ids), calls=1, document=p.document_tokens,
                      kept=p.kept_tokens)
        answer, _ = final_answer(gen.text, cfg.agent.answer_protocol, cfg.agent.think)
        out.append(_record(cfg, method, w, fp, answer, gen.text, tokens, seconds, len(group), p.note))
    return out


def _run_works(backend: Any, cfg: SweepConfig, method: str, works: Sequence[Work], docs: ParagraphCache,
               fp: str, runner: Any) -> list[dict]:
    try:
        if is_workflow(method):
            return _workflow_group(backend, cfg, method, works, docs, fp, runner)
        return _baseline_group(backend, cfg, method, works, docs, fp)
    except MemAgentError as exc:
        if len(works) > 1:
            log.warning("a group of %d samples failed (%s); running them one by one", len(works), exc)
            return [rec for w in works for rec in _run_works(backend, cfg, method, [w], docs, fp, runner)]
        w = works[0]
        log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], w.repeat, exc)
        return [error_record(cfg, method, w, fp, exc)]


def run_unit(backend: Any, cfg: SweepConfig, unit: Unit, docs: ParagraphCache | None = None,
             runners: dict[str, Any] | None = None) -> list[dict]:
    """The records of `unit` on `backend`, one per work, in the unit's order: its samples in one batch; when
    that fails (a MemAgentError), its samples one by one, and a sample that fails alone an error record.
    `docs`: the lazy samples' paragraphs, shared across units (a new cache when None); `runners`: the workflows
    built once on `backend` (`check_settings` returns them; None: built here)."""
    docs = docs if docs is not None else ParagraphCache()
    runner = None
    if is_workflow(unit.method):
        runner = (runners or {}).get(unit.method) or build_workflow(cfg.bound[unit.method], backend, cfg.agent)
    return _run_works(backend, cfg, unit.method, list(unit.works), docs, unit.fingerprint, runner)


def run_stream(backend: Any, cfg: SweepConfig, units: Iterable[Unit], docs: ParagraphCache,
               emit: Callable[[list[dict]], None], total: int | None = None, runner: Any = None) -> None:
    """The works of `units` (one method and one repeat, on a concurrent backend) as one stream: a sample starts
    as another finishes, and `emit([record])` is called as each sample finishes (it may raise to stop the
    sweep). `total` (the samples to run, with --progress): the agent's progress line (samples done, calls in
    flight, calls/s, ETA)."""
    units = iter(units)
    first = next(units, None)
    if first is None:
        return
    method, repeat, fp = first.method, first.repeat, first.fingerprint
    started: dict[str, tuple[Work, float, dict[str, int]]] = {}

    def works() -> Iterator[Work]:
        yield from first.works
        for unit in units:
            yield from unit.works

    def items() -> Iterator[AgentInput]:
        for i, w in enumerate(works()):
            try:
                document = sample_document(w.sample, docs)
            except MemAgentError as exc:
                log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], repeat, exc)
                emit([error_record(cfg, method, w, fp, exc)])
                continue
            started[str(i)] = (w, time.perf_counter(), dict(prompt=0, generated=0, calls=0, document=0))
            yield AgentInput(w.sample["question"], document, str(i))

    memories: dict[str, list[str]] = {}

    def on_step(call: dict) -> None:
        count_call(started[call["doc_id"]][2], call, backend.tokenizer)
        keep_memory(memories.setdefault(call["doc_id"], []), call)

    def on_result(res: Any) -> None:
        w, t0, usage = started.pop(res.doc_id)
        if res.error is not None:
            log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], repeat,
                        res.error["message"])
            emit([error_record(cfg, method, w, fp, res.error)])
            memories.pop(res.doc_id, None)
        else:
            emit([_record(cfg, method, w, fp, res.answer, res.raw_answer, dict(usage, kept=usage["document"]),
                          time.perf_counter() - t0, cfg.agent.max_batch_docs, f"{res.num_chunks} chunks",
                          memories.pop(res.doc_id, []))])

    agent = dataclasses.replace(cfg.agent, seed=cfg.seed(repeat))
    runner = runner if runner is not None else build_workflow(cfg.bound[method], backend, cfg.agent)
    wf = runner.bind(config=agent, on_step=on_step, failures="record", progress=total is not None)
    stream_workflow(wf, items(), on_result, total=total)


def check_settings(backend: Any, cfg: SweepConfig) -> dict[str, Any]:
    """Settings no sample can run under (a window too small for the budgets, a baseline prompt with no room)
    fail the run at once, before any model call (not sample by sample): an EvalError or a BudgetError. Returns
    each workflow's Runner on `backend`, built once (`run_unit` and `run_stream` bind it)."""
    runners = build_runners(backend, cfg)  # with no questions: the window only
    if any(not is_workflow(m) for m in cfg.methods):
        context_budget(backend, "", cfg.baseline_answer_tokens or cfg.agent.answer_tokens, cfg.window,
                       cfg.baseline_template)
    return runners

"""The evaluation sweep: methods x data files (tasks at several lengths) x repeats, one JSONL record per sample.

Every (model, method, data file, sample, repeat, settings) has a key (`memagent.eval.records`); a record is
appended to `results.jsonl` and flushed to disk as soon as its group of samples is done, and a rerun skips
the keys already there, so a sweep killed mid-way resumes where it stopped, and a changed setting computes
anew. A line cut short by a crash is dropped on the next run. Samples run in groups of
`AgentConfig.max_batch_docs`: MemAgent reads a group's documents in one batch per step, the baselines
generate a group's prompts in one batch. MemAgent on a concurrent (HTTP) backend runs without groups: its
samples are one stream, pipelined per document (memagent.agent.scheduler), a new sample starting as soon as
another finishes, and each record is written as its sample finishes. A group whose model calls fail (a
`MemAgentError`: the backend gave up after its retries, a document cannot be read) is run again one sample
at a time, and a sample that still fails is written as an error record; the sweep goes on (MemAgent fails
only the samples whose own calls fail, in a group or a stream).

Record: key, status ("ok" | "error"), model, method, data (file name), data_path, data_sha256, fingerprint,
repeat, seed, task, sample_id, length, length_unit, metric, score (the sample's own metric; None for a
skipped failure), scores (the metric family: em/f1/sub_em or string_match_all/part), scoring (the
ScoreOptions applied), prediction (boxed answer or null), raw (the model's last reply), gold, tokens (prompt
and generated tokens over all calls, calls, document tokens, tokens kept in the prompt), seconds (the
group's wall-clock divided by its size; MemAgent on a concurrent backend: the sample's own wall-clock),
group_size (there: --batch-docs, the samples in flight), note; an error record has error {kind, message,
attempts} instead of the reply and tokens. The `memagent eval` command around it is `memagent.eval.command`.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from memagent.agent.answer import final_answer
from memagent.agent.scheduler import concurrent
from memagent.config import AgentConfig
from memagent.errors import MemAgentError
from memagent.eval.baselines import (BASELINE_TEMPLATE, EvalError, bm25_context, context_budget, middle_truncate,
                                     render_baseline)
from memagent.eval.records import (DataFile, data_file, failures_message, fingerprint, latest, load_records,
                                   record_key, record_length, rescore_stale, sample_ids)
from memagent.eval.scoring import ScoreOptions, failed_score, score_sample
from memagent.eval.workflow_runs import (BASELINES, build, check_methods, check_windows, count_call, is_workflow,
                                         method_fingerprint)
from memagent.lock import run_lock
from memagent.tasks.schema import ParagraphCache, read_samples, sample_document

__all__ = ["BASELINES", "METHODS", "SweepConfig", "load_done", "plan", "run_sweep", "sweep"]

log = logging.getLogger(__name__)

METHODS = ("memagent", "full-context", "rag-bm25")  # the default; any workflow name is a method too
TAG_FIELDS = ("order",)  # sample fields a record keeps in `tags` (to split tables by), with the sample's own `tags`


@dataclass
class SweepConfig:
    model_name: str  # the row label of the table (a model id or path)
    methods: Sequence[str] = METHODS  # baselines and workflows (memagent.agent.registry) by name
    agent: AgentConfig = field(default_factory=AgentConfig)  # MemAgent's budget; answer_tokens for all
    window: int | None = None  # the baselines' context window (default: the backend's)
    baseline_answer_tokens: int | None = None  # the baselines' max new tokens (default: agent.answer_tokens)
    baseline_template: str = BASELINE_TEMPLATE  # the baselines' prompt: {question} and {context}
    passage_tokens: int = 512  # rag-bm25 passage size
    limit: int | None = None  # at most this many samples of each data file
    repeats: int = 1  # runs of each sample, repeat r with seed agent.seed + r (base 0 when None)
    scoring: ScoreOptions = field(default_factory=ScoreOptions)
    backend_settings: dict[str, Any] = field(default_factory=dict)  # backend kind, dtype ...: they change replies
    workflow_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # workflow name -> its own options
    #   (in that workflow's record fingerprint: memagent.eval.workflow_runs.method_fingerprint)

    def __post_init__(self) -> None:
        unknown = check_methods(self.methods)
        if unknown or not self.methods:
            from memagent.agent.registry import workflow_names

            raise EvalError(f"unknown method(s) {unknown}; choose from the baselines {', '.join(BASELINES)} or the "
                            f"workflows {', '.join(workflow_names())}")
        if not isinstance(self.repeats, int) or isinstance(self.repeats, bool) or self.repeats < 1:
            raise EvalError(f"repeats must be a positive integer, got {self.repeats!r}")
        for name in ("limit", "window", "passage_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise EvalError(f"{name} must be a positive integer, got {value!r}")


def load_done(path: Path) -> set[str]:
    """Keys of the finished records; a last line cut short by a crash is removed from the file."""
    return set(latest(load_records(path)))


@dataclass(frozen=True)
class _Work:
    data: DataFile
    sample: dict
    repeat: int
    key: str
    attempts: int = 0  # failed runs of this key so far (earlier error records)


def _base(cfg: SweepConfig, method: str, w: _Work, fp: str) -> dict:
    length, unit = record_length(w.sample)
    return dict(
        key=w.key, status="ok", model=cfg.model_name, method=method, data=w.data.name, data_path=w.data.path,
        data_sha256=w.data.sha256, fingerprint=fp, repeat=w.repeat, seed=_seed(cfg, w.repeat),
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


def _record(cfg: SweepConfig, method: str, w: _Work, fp: str, prediction: str | None, raw: str,
            tokens: dict[str, int], seconds: float, group_size: int, note: str = "") -> dict:
    rec = _base(cfg, method, w, fp)
    score, scores = score_sample(rec["metric"], prediction, w.sample["answers"], cfg.scoring)
    rec.update(score=score, scores=scores, prediction=prediction, raw=raw, gold=w.sample["answers"], tokens=tokens,
               seconds=round(seconds, 4), group_size=group_size, note=note)
    return rec


def _error_record(cfg: SweepConfig, method: str, w: _Work, fp: str, exc: BaseException | dict) -> dict:
    """The failure record of a sample; `exc` is the exception, or an agent result's error {kind, message}."""
    rec = _base(cfg, method, w, fp)
    kind, message = (exc["kind"], exc["message"]) if isinstance(exc, dict) else (type(exc).__name__, str(exc))
    rec.update(status="error", score=failed_score(cfg.scoring), scores={}, prediction=None, raw=None,
               gold=w.sample["answers"], error=dict(kind=kind, message=message, attempts=w.attempts + 1))
    return rec


def _seed(cfg: SweepConfig, repeat: int) -> int:
    return (cfg.agent.seed or 0) + repeat


def _workflow_group(backend: Any, cfg: SweepConfig, method: str, group: list[_Work], docs: ParagraphCache,
                    fp: str) -> list[dict]:
    """A group of samples read by the workflow `method` in one run (its calls batched across the group)."""
    from memagent.agent.registry import AgentInput, run_workflow

    trace = io.StringIO()
    agent = dataclasses.replace(cfg.agent, seed=_seed(cfg, group[0].repeat))
    items = [AgentInput(w.sample["question"], sample_document(w.sample, docs), str(i)) for i, w in enumerate(group)]
    t0 = time.perf_counter()
    wf = build(method, backend, agent, cfg.workflow_options, trace_path=trace, failures="record")
    results = run_workflow(wf, items)
    seconds = (time.perf_counter() - t0) / len(group)
    usage = {str(i): dict(prompt=0, generated=0, calls=0, document=0) for i in range(len(group))}
    for line in trace.getvalue().splitlines():
        call = json.loads(line)
        count_call(usage[call["doc_id"]], call, backend.tokenizer)
    out = []
    for i, (w, res) in enumerate(zip(group, results)):
        if res.error is not None:  # its calls failed after the backend's retries; the others went on
            log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], w.repeat,
                        res.error["message"])
            out.append(_error_record(cfg, method, w, fp, res.error))
            continue
        u = usage[str(i)]
        u["kept"] = u["document"]
        out.append(_record(cfg, method, w, fp, res.answer, res.raw_answer, u, seconds, len(group),
                           f"{res.num_chunks} chunks"))
    return out


def _baseline_group(backend: Any, cfg: SweepConfig, method: str, group: list[_Work], docs: ParagraphCache,
                    fp: str) -> list[dict]:
    from memagent.backends.base import SamplingParams

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
    params = SamplingParams(answer_tokens, cfg.agent.temperature, cfg.agent.top_p, _seed(cfg, group[0].repeat))
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


def _run_group(backend: Any, cfg: SweepConfig, method: str, group: list[_Work], docs: ParagraphCache,
               fp: str) -> list[dict]:
    """The group's records; when it fails, its samples one by one, a sample that fails alone an error record."""
    try:
        if is_workflow(method):
            return _workflow_group(backend, cfg, method, group, docs, fp)
        return _baseline_group(backend, cfg, method, group, docs, fp)
    except MemAgentError as exc:
        if len(group) > 1:
            log.warning("a group of %d samples failed (%s); running them one by one", len(group), exc)
            return [rec for w in group for rec in _run_group(backend, cfg, method, [w], docs, fp)]
        w = group[0]
        log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], w.repeat, exc)
        return [_error_record(cfg, method, w, fp, exc)]


def plan(cfg: SweepConfig, data_files: Sequence[str | Path]) -> tuple[list[DataFile], list[str]]:
    """The data files' identities (each once) and the keys of every record the sweep makes, before any
    model call; a missing file, a duplicate sample id or an unknown metric is an error here."""
    if not data_files:
        raise EvalError("no data file given; pass --data FILE[,FILE...] (files from `memagent data ...`)")
    datas = list({d.path: d for d in (data_file(f) for f in data_files)}.values())
    keys = []
    for d in datas:
        ids = sample_ids(d.path, cfg.limit)
        keys += [record_key(cfg.model_name, m, d, sid, r, _fp(cfg, m)) for m in cfg.methods for r in range(cfg.repeats)
                 for sid in ids]
    return datas, keys


def _fp(cfg: SweepConfig, method: str) -> str:
    """The settings fingerprint of `method`'s records (a workflow's folds in its name and options)."""
    return method_fingerprint(fingerprint(cfg), method, cfg.workflow_options.get(method))


def _pending(cfg: SweepConfig, method: str, repeat: int, datas: Sequence[DataFile], done: dict[str, dict],
             retry_failed: bool, fp: str) -> Iterator[_Work]:
    for data in datas:
        for n, sample in enumerate(read_samples(data.path)):
            if cfg.limit is not None and n >= cfg.limit:
                break
            key = record_key(cfg.model_name, method, data, sample["id"], repeat, fp)
            prev = done.get(key)
            if prev is None or (retry_failed and prev.get("status") == "error"):
                attempts = prev["error"].get("attempts", 1) if prev is not None else 0
                yield _Work(data, sample, repeat, key, attempts)


def _counted(works: Iterator[_Work]) -> tuple[Iterator[_Work], int]:
    """The pending samples, read once and held in memory, contexts included (the progress line needs their
    number before the first starts), and that number."""
    held = list(works)
    return iter(held), len(held)


def _groups(items: Iterator[_Work], size: int) -> Iterator[list[_Work]]:
    group: list[_Work] = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def run_sweep(backend: Any, data_files: Sequence[str | Path], out_dir: str | Path, cfg: SweepConfig,
              on_record: Callable[[dict], None] | None = None, progress: bool = False, *,
              retry_failed: bool = False, max_failures: int | None = None) -> Path:
    """Run every method on every sample not yet in `out_dir/results.jsonl` (holding the folder's lock);
    returns that path."""
    with run_lock(out_dir, "eval"):
        datas, _ = plan(cfg, data_files)
        return sweep(backend, datas, Path(out_dir), cfg, on_record, progress, retry_failed, max_failures)


def sweep(backend: Any, datas: Sequence[DataFile], out: Path, cfg: SweepConfig,
           on_record: Callable[[dict], None] | None, progress: bool, retry_failed: bool,
           max_failures: int | None) -> Path:
    """`run_sweep` once the caller holds the folder's lock and has planned `datas`."""
    _check_windows(backend, cfg)
    results = out / "results.jsonl"
    done = latest(load_records(results))
    rescore_stale(results, done, cfg.scoring)
    docs = ParagraphCache()
    bar = _bar(progress)
    failed: list[dict] = []
    with open(results, "a", encoding="utf-8") as fh:

        def write(rec: dict) -> None:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            done[rec["key"]] = rec
            if bar:
                bar(_progress_line(rec))
            if on_record:
                on_record(rec)
            if rec["status"] == "error":
                failed.append(rec)

        for method in cfg.methods:
            fp = _fp(cfg, method)
            for repeat in range(cfg.repeats):
                pending = _pending(cfg, method, repeat, datas, done, retry_failed, fp)
                if is_workflow(method) and concurrent(backend):  # no groups: samples start as others finish
                    stop = None if max_failures is None else lambda: _check_failed(failed, max_failures, results)
                    works, total = _counted(pending) if bar else (pending, None)
                    _workflow_stream(backend, cfg, method, repeat, works, docs, fp, write, stop, total)
                    continue
                for group in _groups(pending, cfg.agent.max_batch_docs):
                    for rec in _run_group(backend, cfg, method, group, docs, fp):
                        write(rec)
                    if max_failures is not None:
                        _check_failed(failed, max_failures, results)
    return results


def _check_failed(failed: list[dict], max_failures: int, results: Path) -> None:
    if len(failed) >= max_failures:
        raise EvalError(failures_message(failed, max_failures, results))


def _workflow_stream(backend: Any, cfg: SweepConfig, method: str, repeat: int, works: Iterator[_Work],
                     docs: ParagraphCache, fp: str, write: Callable[[dict], None], stop: Callable[[], None] | None,
                     total: int | None = None) -> None:
    """A workflow on a concurrent backend: the samples are one stream (a sample starts as another finishes) and
    each record is written as its sample finishes; `stop` is called after each (it raises to stop the sweep).
    `total` (the samples to run, with --progress): the agent's progress line (samples done, calls in flight,
    calls/s, ETA)."""
    from memagent.agent.registry import AgentInput, stream_workflow

    started: dict[str, tuple[_Work, float, dict[str, int]]] = {}

    def items() -> Iterator[AgentInput]:
        for i, w in enumerate(works):
            try:
                document = sample_document(w.sample, docs)
            except MemAgentError as exc:
                log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], repeat, exc)
                write(_error_record(cfg, method, w, fp, exc))
                continue
            started[str(i)] = (w, time.perf_counter(), dict(prompt=0, generated=0, calls=0, document=0))
            yield AgentInput(w.sample["question"], document, str(i))

    def on_step(call: dict) -> None:
        count_call(started[call["doc_id"]][2], call, backend.tokenizer)

    def on_result(res: Any) -> None:
        w, t0, usage = started.pop(res.doc_id)
        if res.error is not None:
            log.warning("%s %s sample %r repeat %d failed: %s", method, w.data.name, w.sample["id"], repeat,
                        res.error["message"])
            write(_error_record(cfg, method, w, fp, res.error))
        else:
            write(_record(cfg, method, w, fp, res.answer, res.raw_answer, dict(usage, kept=usage["document"]),
                          time.perf_counter() - t0, cfg.agent.max_batch_docs, f"{res.num_chunks} chunks"))
        if stop is not None:
            stop()

    agent = dataclasses.replace(cfg.agent, seed=_seed(cfg, repeat))
    wf = build(method, backend, agent, cfg.workflow_options, on_step=on_step, failures="record",
               progress=total is not None)
    stream_workflow(wf, items(), on_result, total=total)


def _check_windows(backend: Any, cfg: SweepConfig) -> None:
    """Settings no sample can run under fail the run at once, before any model call (not sample by sample)."""
    check_windows(backend, cfg.methods, cfg.agent, cfg.workflow_options)  # with no questions: the window only
    if any(not is_workflow(m) for m in cfg.methods):
        context_budget(backend, "", cfg.baseline_answer_tokens or cfg.agent.answer_tokens, cfg.window,
                       cfg.baseline_template)


def _progress_line(rec: dict) -> str:
    head = f"{rec['method']} {rec['task']} {rec['length']} {rec['sample_id']} r{rec['repeat']}"
    if rec["status"] == "error":
        return f"{head}: FAILED ({rec['error']['kind']})"
    return f"{head}: {rec['score']:.2f}"


def _bar(progress: bool) -> Callable[[str], None] | None:
    if not progress:
        return None
    from rich.console import Console

    console = Console(stderr=True)
    return lambda line: console.print(line, highlight=False)

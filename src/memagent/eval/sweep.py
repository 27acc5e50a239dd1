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
attempts} instead of the reply and tokens. The `memagent eval` run around it is `memagent.eval.driver`.

The pieces, each public: the settings (`memagent.eval.sweep_config.SweepConfig`), the units and what is still
pending (`memagent.eval.units`), running one unit (`memagent.eval.unit_run.run_unit`), the results file with
its resume and failure cap (`memagent.eval.results_file.ResultsFile`), and where units run (an `Executor`,
`memagent.eval.executor`: `LocalExecutor` here, `memagent.scale.executor.RayExecutor` on Ray actors). `sweep`
ties them together for any executor.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rich.console import Console

from memagent.eval.executor import Executor, LocalExecutor
from memagent.eval.records import DataFile, latest, load_records
from memagent.eval.results_file import ResultsFile
from memagent.eval.sweep_config import BASELINES, METHODS, SweepConfig
from memagent.eval.units import plan, plan_units
from memagent.lock import run_lock

__all__ = ["BASELINES", "METHODS", "SweepConfig", "load_done", "open_sweep", "plan", "progress_line", "run_sweep",
           "sweep"]


def load_done(path: Path) -> set[str]:
    """Keys of the finished records; a last line cut short by a crash is removed from the file."""
    return set(latest(load_records(path)))


def run_sweep(backend: Any, data_files: Sequence[str | Path], out_dir: str | Path, cfg: SweepConfig,
              on_record: Callable[[dict], None] | None = None, progress: bool = False, *,
              retry_failed: bool = False, max_failures: int | None = None) -> Path:
    """Run every method on every sample not yet in `out_dir/results.jsonl` (holding the folder's lock);
    returns that path. `backend`: a model backend (run here) or an `Executor`, as for `sweep`."""
    with open_sweep(out_dir, cfg, data_files) as (datas, _):
        return sweep(backend, datas, Path(out_dir), cfg, on_record, progress, retry_failed, max_failures)


@contextmanager
def open_sweep(out_dir: str | Path, cfg: SweepConfig,
               data_files: Sequence[str | Path]) -> Iterator[tuple[list[DataFile], list[str]]]:
    """The sweep's folder held (its one lock, for the whole run: the sweep and whatever is written beside its
    results) and the plan made: yields (the data files read, every record key of the run)."""
    with run_lock(out_dir, "eval"):
        yield plan(cfg, data_files)


def sweep(backend: Any, datas: Sequence[DataFile], out: Path, cfg: SweepConfig,
          on_record: Callable[[dict], None] | None, progress: bool, retry_failed: bool,
          max_failures: int | None, seen: dict[str, dict] | None = None) -> Path:
    """`run_sweep` once the caller holds the folder's lock and has planned `datas`: the pending units of
    `out/results.jsonl` (resume; with `retry_failed` the error records too) run by `backend`, each record
    appended durably as its unit finishes, `on_record` called after each; stops with an EvalError once
    `max_failures` samples failed in this run. `backend` is a model backend (a `LocalExecutor` runs it in this
    process) or an `Executor` (e.g. `memagent.scale.executor.RayExecutor`). Returns the results path; `seen`
    (when given) gets the latest record of every key, those read and those written, also when the run stops
    with an error (the file is read once)."""
    executor = backend if isinstance(backend, Executor) else LocalExecutor(backend)
    bar = _bar(progress)

    def each(rec: dict) -> None:
        if bar:
            bar(progress_line(rec))
        if on_record:
            on_record(rec)

    with ResultsFile(out / "results.jsonl", cfg.scoring, max_failures, each) as results:
        try:
            executor.run_units(cfg, plan_units(cfg, datas, results.done, retry_failed), results.append_all,
                               progress=bar is not None)
        finally:
            if seen is not None:
                seen.update(results.done)
    return results.path


def progress_line(rec: dict) -> str:
    """The --progress line of a record: method, task, length, sample id, repeat, then its score or FAILED."""
    head = f"{rec['method']} {rec['task']} {rec['length']} {rec['sample_id']} r{rec['repeat']}"
    if rec["status"] == "error":
        return f"{head}: FAILED ({rec['error']['kind']})"
    return f"{head}: {rec['score']:.2f}"


def _bar(progress: bool) -> Callable[[str], None] | None:
    if not progress:
        return None
    console = Console(stderr=True)
    return lambda line: console.print(line, highlight=False)

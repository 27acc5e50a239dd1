"""The units of an evaluation sweep, planned before any model call.

A `Work` is one record to make: one sample of one data file, under one method, in one repeat. A `Unit` is
what an executor runs at once: up to `AgentConfig.max_batch_docs` works of one method and one repeat
(MemAgent reads a unit's documents in one batch per step, a baseline generates its prompts in one batch). The
works of a unit may come from several data files; a unit never mixes methods or repeats. Planning reads the
data files and the records already made (their keys, `memagent.eval.records`), nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from memagent.eval.baselines import EvalError
from memagent.eval.records import DataFile, data_file, record_key, sample_ids
from memagent.eval.sweep_config import SweepConfig
from memagent.tasks.schema import read_samples

__all__ = ["Unit", "Work", "group_works", "pending_works", "plan", "plan_units", "records_fingerprint"]


@dataclass(frozen=True)
class Work:
    """One record to make: `sample` (a sample dict of `data`, its document inline or lazy) in repeat `repeat`,
    whose record will have key `key`; `attempts`: failed runs of this key so far (its earlier error records)."""

    data: DataFile
    sample: dict
    repeat: int
    key: str
    attempts: int = 0


@dataclass(frozen=True)
class Unit:
    """Works of one method and one repeat, run at once; `fingerprint` is the settings fingerprint their
    records carry (`records_fingerprint(cfg, method)`). Picklable: Ray actors receive units."""

    method: str
    repeat: int
    fingerprint: str
    works: tuple[Work, ...]

    def __len__(self) -> int:
        return len(self.works)


def records_fingerprint(cfg: SweepConfig, method: str) -> str:
    """The settings fingerprint (16 hex digits) of `method`'s records: the sweep's own, with a workflow's name
    and options folded in (`memagent.eval.workflow_runs.method_fingerprint`)."""
    return cfg.fingerprints[method]


def plan(cfg: SweepConfig, data_files: Sequence[str | Path]) -> tuple[list[DataFile], list[str]]:
    """The data files' identities (each once, by resolved path) and the keys of every record the sweep makes
    (methods x repeats x samples), before any model call; a missing file, a duplicate sample id or an unknown
    metric is an EvalError here."""
    if not data_files:
        raise EvalError("no data file given; pass --data FILE[,FILE...] (files from `memagent data ...`)")
    datas = list({d.path: d for d in (data_file(f) for f in data_files)}.values())
    keys = []
    for d in datas:
        ids = sample_ids(d.path, cfg.limit)
        keys += [record_key(cfg.model_name, m, d, sid, r, records_fingerprint(cfg, m)) for m in cfg.methods
                 for r in range(cfg.repeats) for sid in ids]
    return datas, keys


def pending_works(cfg: SweepConfig, method: str, repeat: int, datas: Sequence[DataFile], done: Mapping[str, dict],
                  retry_failed: bool, fp: str) -> Iterator[Work]:
    """The works of `method` and `repeat` still to run, data file by data file, samples in file order (the
    first `cfg.limit` of each): those whose key has no record in `done` (key -> latest record), and with
    `retry_failed` those whose latest record is an error (`attempts` counts its earlier failures). Lazy: the
    samples are read as the iterator is drawn."""
    for data in datas:
        for n, sample in enumerate(read_samples(data.path)):
            if cfg.limit is not None and n >= cfg.limit:
                break
            key = record_key(cfg.model_name, method, data, sample["id"], repeat, fp)
            prev = done.get(key)
            if prev is None or (retry_failed and prev.get("status") == "error"):
                attempts = prev["error"].get("attempts", 1) if prev is not None else 0
                yield Work(data, sample, repeat, key, attempts)


def group_works(works: Iterable[Work], size: int) -> Iterator[list[Work]]:
    """`works` in consecutive lists of `size` (the last may be shorter; none is empty)."""
    group: list[Work] = []
    for work in works:
        group.append(work)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def plan_units(cfg: SweepConfig, datas: Sequence[DataFile], done: Mapping[str, dict],
               retry_failed: bool = False) -> Iterator[Unit]:
    """Every unit the sweep still has to run, lazily: for each method (in `cfg.methods` order), each repeat
    (0 .. repeats-1), its pending works (`pending_works`) in units of `cfg.agent.max_batch_docs`."""
    for method in cfg.methods:
        fp = records_fingerprint(cfg, method)
        for repeat in range(cfg.repeats):
            pending = pending_works(cfg, method, repeat, datas, done, retry_failed, fp)
            for group in group_works(pending, cfg.agent.max_batch_docs):
                yield Unit(method, repeat, fp, tuple(group))

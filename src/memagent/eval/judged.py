"""LLM-judged scores of an eval run (`memagent data judge`): the long-term-memory benchmarks' judged columns
(LongMemEval's GPT-4o judge, LoCoMo's LLM-as-judge) through the `judge` outcome reward (memagent.rewards.judge),
when a judge model is named; the rule-based scores (`sub_em`, `f1`) are the records' own.

Each ok record of a results.jsonl (the latest of each key) is graded from its raw reply against its gold answers,
for the question its data file holds (`data_path`, `sample_id`): one judge prompt per distinct (question, answer,
gold), greedy, strictly parsed, retried, 0 after the retries (the judge reward's rules). A record whose model calls
failed (status "error") is graded 0 without asking, as its rule-based score is. The table groups by method and by
the sample's `ability` (the importers' question type, memagent.streams.formats; else its `task`).

Departure: the grading prompt is the judge reward's one rubric (RUBRIC), not each paper's own judge prompt, so the
numbers are comparable across benchmarks here, not to the papers' judged columns.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import fmean as mean
from typing import Any, Iterable

from memagent.eval.records import latest, load_records
from memagent.errors import InputError
from memagent.rewards.protocol import Answered
from memagent.tasks.schema import read_samples

__all__ = ["judge_records", "judged_table", "judge_results"]


def questions_of(records: Iterable[dict]) -> dict[tuple[str, str], dict[str, Any]]:
    """{(data_path, sample_id): sample} for every record's sample, each data file read once."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    wanted: dict[str, set[str]] = defaultdict(set)
    for r in records:
        wanted[r["data_path"]].add(r["sample_id"])
    for path, ids in wanted.items():
        if not Path(path).is_file():
            raise InputError(f"the run's data file {path} is gone; the judge needs its questions (restore it)")
        for s in read_samples(path):
            if s["id"] in ids:
                out[(path, s["id"])] = s
        missing = ids - {i for p, i in out if p == path}
        if missing:
            raise InputError(f"{path} no longer holds sample(s) {', '.join(sorted(missing)[:3])} of the run; the "
                             "judge needs the questions the run answered")
    return out


def judge_records(records: list[dict], samples: dict[tuple[str, str], dict[str, Any]], judge: Any) -> list[dict]:
    """Each record with `judge` (its grade, 0 for a failed record) and `ability`; the ok ones graded in one batch."""
    ok = [r for r in records if r["status"] == "ok"]
    grades = iter(judge.score([Answered(samples[(r["data_path"], r["sample_id"])]["question"], r["raw"],
                                        tuple(r["gold"])) for r in ok]))
    out = []
    for r in records:
        sample = samples[(r["data_path"], r["sample_id"])]
        ability = sample.get("ability") or sample.get("task") or "-"
        out.append(dict(r, judge=float(next(grades)) if r["status"] == "ok" else 0.0, ability=ability))
    return out


def judged_table(rows: list[dict]) -> list[dict[str, Any]]:
    """One row per (method, ability) in first-seen order, then per method "all": n, mean rule-based score, mean
    judge grade."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["ability"])].append(r)
        groups[(r["method"], "all")].append(r)
    methods, abilities = dict.fromkeys(r["method"] for r in rows), dict.fromkeys(r["ability"] for r in rows)
    keys = [(m, a) for m in methods for a in (*abilities, "all") if (m, a) in groups]
    return [dict(method=m, ability=a, n=len(groups[(m, a)]), score=mean(r["score"] for r in groups[(m, a)]),
                 judge=mean(r["judge"] for r in groups[(m, a)])) for m, a in keys]


def judge_results(results: str | Path, judge: Any, out: str | Path) -> list[dict[str, Any]]:
    """Grade the latest records of `results` (module doc), write them with their grades to `out` (JSONL) and
    return the table (`judged_table`)."""
    records = list(latest(load_records(results)).values())
    if not records:
        raise InputError(f"{results} holds no records; run `memagent eval` first")
    rows = judge_records(records, questions_of(records), judge)
    with open(out, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return judged_table(rows)

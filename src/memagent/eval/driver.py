"""`memagent eval`'s run, once its settings are resolved (`EvalRun`, built once by memagent.cli.eval_command from
the options and the profile): the output folder checked, its lock held for the whole run, profile.yaml written,
the sweep (`memagent.eval.sweep`) run on the executor the command chose (or, with `rescore`, the stored replies
scored anew, no model at all), then table.md, the plots and summary.json from the records read and written
(results.jsonl is read once), and an EvalError counting the samples that failed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from memagent.errors import InputError
from memagent.eval.baselines import EvalError
from memagent.eval.executor import Executor
from memagent.eval.records import DataFile, latest, rescore_file
from memagent.eval.report import write_report
from memagent.eval.summary import write_summary
from memagent.eval.sweep import SweepConfig, open_sweep, sweep
from memagent.io import OutputError, atomic_write_text, check_not_input, check_output_dir
from memagent.lock import LOCK_NAME

__all__ = ["EVAL_FILES", "EvalRun", "Report", "check_eval_out", "run"]

EVAL_FILES = ("results.jsonl", "table.md", "summary.json", "profile.yaml", LOCK_NAME)  # written in --out
PLOT_NAME = re.compile(r"scores_[A-Za-z0-9_.-]*\.png")  # eval.report.plot_scores' file names


@dataclass(frozen=True)
class Report:
    """What a run writes beside its records: table.md and plots (split by a tag; with the cost columns for
    --workflows) and summary.json (the options as it records them)."""

    out: Path
    options: dict[str, Any]  # EvalOptions.record()
    split_by: Optional[str]
    cost: bool

    @property
    def results(self) -> Path:
        return self.out / "results.jsonl"

    def write(self, cfg: SweepConfig, datas: list[DataFile], keys: list[str], records: dict[str, dict]) -> str:
        """table.md and plots of this run's `records` (key -> latest record), and summary.json; returns the table."""
        text, _, _ = write_report(list(records.values()), self.out, keys=keys, split_by=self.split_by, cost=self.cost)
        base = cfg.fingerprints[""]
        write_summary(self.out, options=self.options, cfg=cfg, fingerprint=base, datas=datas, keys=keys,
                      records=records, fingerprints={m: f for m, f in cfg.fingerprints.items() if m and f != base})
        return text


@dataclass(frozen=True)
class EvalRun:
    """What `memagent eval` runs, resolved and checked once: the sweep's settings (its workflows bound to their
    options), the data files, the profile as written to OUT/profile.yaml, what the report says, and how the run
    goes (rescore, retry the failed samples, the failure cap, progress lines)."""

    out: Path
    data: Sequence[str]
    cfg: SweepConfig
    profile_yaml: str
    report: Report
    profile_file: Optional[Path] = None  # --profile (an input: eval must not write over it)
    rescore: bool = False
    retry_failed: bool = False
    max_failures: Optional[int] = None
    progress: bool = False


def run(spec: EvalRun, executor: Callable[[], Executor]) -> str:
    """Run `spec` (resuming; with `rescore`, no model at all), holding the output folder's lock throughout;
    returns the table. `executor()` builds where the units run (called only when the sweep runs)."""
    out = check_eval_out(spec.out, list(spec.data), spec.profile_file)
    with open_sweep(out, spec.cfg, spec.data) as (datas, keys):
        atomic_write_text(out / "profile.yaml", spec.profile_yaml)
        if spec.rescore:
            if not spec.report.results.is_file():
                raise EvalError(f"nothing to rescore: {spec.report.results} does not exist; run `memagent eval` "
                                "without --rescore first")
            return spec.report.write(spec.cfg, datas, keys, latest(rescore_file(spec.report.results,
                                                                                spec.cfg.scoring)))
        records: dict[str, dict] = {}  # the latest record of every key, as read and written by the sweep
        try:
            sweep(executor(), datas, out, spec.cfg, None, spec.progress, spec.retry_failed, spec.max_failures,
                  records)
        except EvalError:
            spec.report.write(spec.cfg, datas, keys, records)
            raise
        text = spec.report.write(spec.cfg, datas, keys, records)
        failed = sum(records.get(k, {}).get("status") == "error" for k in keys)
        if failed:
            raise EvalError(f"{failed} of {len(keys)} samples failed; see the records with status \"error\" in "
                            f"{spec.report.results} (table.md and summary.json are written); fix the cause and "
                            "rerun with --retry-failed")
        return text


def check_eval_out(out: Path, data: list[str], profile: Path | str | None) -> Path:
    """Once, before the lock is taken or anything written: every --data file exists, --out is a folder that can
    be written and none of the inputs, and no input (--data file, --profile) is one of the files eval writes in
    --out (results.jsonl, table.md, summary.json, profile.yaml, the lock, a scores_*.png)."""
    for d in data:
        if not Path(d).is_file():
            raise InputError(f"--data: {d} {'is a folder' if Path(d).is_dir() else 'does not exist'}; give sample "
                             "files made by `memagent data ...`")
    inputs = {f"--data file {d!r}": d for d in data}
    check_output_dir(out, "--out", inputs)
    for what, path in {**inputs, "--profile": profile}.items():
        if path is None:
            continue
        for name in EVAL_FILES:
            check_not_input(out / name, {what: path}, f"--out (its {name})")
        p = Path(path)
        if PLOT_NAME.fullmatch(p.name) and p.resolve().parent == out.resolve():
            raise OutputError(f"--out {out} would get plots named like {what} {path} (scores_TASK.png), "
                              "destroying the input; move the input out of --out or choose another --out")
    return out

"""`memagent eval`: its options (one field per command-line option), the profile and sweep settings they
resolve to, and the run: the sweep (`memagent.eval.sweep.open_sweep`: the folder's lock and the plan; then
`sweep` on the executor the command chose), then profile.yaml, table.md, plots and summary.json. The command
(memagent.cli.evaluate) picks the executor: in this process, or on Ray actors for --ray.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from memagent.agent.registry import check_workflow_options
from memagent.backends.options import BackendOptions
from memagent.eval.baselines import EvalError
from memagent.eval.executor import Executor, LocalExecutor
from memagent.eval.records import DataFile, fingerprint, latest, load_records, rescore_file
from memagent.eval.report import write_report
from memagent.eval.summary import write_summary
from memagent.eval.sweep import BASELINES, METHODS, SweepConfig, open_sweep, sweep
from memagent.eval.sweep_config import refuse_unknown_methods
from memagent.eval.workflow_runs import method_fingerprint
from memagent.config import WorkflowChoice, rule
from memagent.errors import InputError
from memagent.flags import (MODEL_HELP, WORKFLOW_OPTION_HELP, BudgetOptions, SamplingOptions, check_options, flag, flag_values,
                            limited, parse_workflow_options, split_list)
from memagent.io import OutputError, check_not_input, check_output_dir
from memagent.lock import LOCK_NAME
from memagent.protocol.profile import open_backend, write_profile
from memagent.protocol.resolve import resolve_model_profile
from memagent.scale.options import RayOptions

if TYPE_CHECKING:
    from memagent.protocol.profile import Profile

__all__ = ["EvalOptions", "eval_profile", "run_eval", "sweep_config"]


# the sweep's own flags that override the profile (sampling.repeats, scoring.*); None: the profile's value
PROFILE_FLAG = {"profile": True}


@dataclass
class EvalOptions:
    """What `memagent eval` was asked: one field per command-line option (the CLI is built from them)."""

    model: str = field(metadata=flag(MODEL_HELP))
    data: list[str] = field(metadata=flag("Sample files from `memagent data`, comma-separated.", parse=split_list))
    out: Path = field(metadata=flag("Directory for results.jsonl, table.md and plots (a rerun resumes)."))
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata=flag(
        "Any of memagent, full-context, rag-bm25, or another workflow's name.", parse=split_list))
    workflows: Optional[list[str]] = field(default=None, metadata=flag(
        "Reading workflows to evaluate, a row each (e.g. memagent,lookup,skim) with model calls and seconds per "
        "document; they replace the workflows of --methods, its baselines stay.", parse=lambda text, name: None if text is None else split_list(text, name)))
    workflow_option: list[str] = field(default_factory=list, metadata=flag(
        WORKFLOW_OPTION_HELP + " With several workflows name the one it is for: NAME.KEY=VALUE (lookup.hits=3).",
        "--workflow-option"))
    split_by: Optional[str] = field(default=None, metadata=flag(
        "Split every table row by this sample tag (e.g. order: value-first | pointer-first of two-hop toy data)."))
    backend: BackendOptions = field(default_factory=BackendOptions)
    profile: Optional[Path] = field(default=None, metadata=flag(
        "Protocol profile (YAML, e.g. from `memagent profile from-reference`); flags override it. Written to "
        "OUT/profile.yaml."))
    budgets: BudgetOptions = field(default_factory=BudgetOptions)  # None: the profile's value
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    batch_docs: int = field(default=16, metadata={**rule(min=1), **flag("Samples per batch (and per flush of results).")})
    window: Optional[int] = field(default=None, metadata={**rule(min=1), **flag(
        "Baselines' context window (default: the profile's budgets.baseline_window, else the model's).")})
    passage_tokens: int = field(default=512, metadata={**rule(min=1), **flag("rag-bm25 passage size.")})
    limit: Optional[int] = field(default=None, metadata={**rule(min=1), **flag(
        "At most this many samples per data file.")})
    progress: bool = field(default=True, metadata=flag("One line per finished sample on stderr.",
                                                       "--progress/--no-progress"))
    repeats: Optional[int] = field(default=None, metadata={**PROFILE_FLAG, **limited(
        1_000, "repeats of every sample (the paper reports the mean of a few)"), **flag(
        "[default: the profile's, 1] Runs of each sample, with seeds seed+0 .. seed+N-1; table cells show mean ± "
        "standard error.")})
    retry_failed: bool = field(default=False, metadata=flag("Run again the samples recorded as failed."))
    max_failures: Optional[int] = field(default=None, metadata={**rule(min=1), **flag(
        "Stop once this many samples have failed in this run.")})
    rescore: bool = field(default=False, metadata=flag(
        "Recompute every score from the stored replies; no model is loaded."))
    golds: Optional[str] = field(default=None, metadata=PROFILE_FLAG | flag(
        "[default: the profile's, all] Score against all golds (best of) or the first gold only: all | first."))
    empty_prediction: Optional[str] = field(default=None, metadata=PROFILE_FLAG | flag(
        "[default: the profile's, zero] A prediction empty once normalised: zero (scores 0) | text (the official "
        "raw substring rule)."))
    failed: Optional[str] = field(default=None, metadata=PROFILE_FLAG | flag(
        "[default: the profile's, wrong] Failed samples in the means: wrong (count 0) | skip (left out)."))
    ray: RayOptions = field(default_factory=RayOptions)  # --ray [ADDRESS], --ray-workers: shard over Ray actors

    checks_itself: ClassVar[bool] = True  # checked as built (the CLI and a Python caller alike), once

    def __post_init__(self) -> None:
        check_options(self)  # each option's rule, beside its field (as `ask` checks its own)

    def record(self) -> dict:
        """The options as summary.json holds them: one key per flag, the backend's options as one mapping."""
        left_out = {**flag_values(self.backend), **flag_values(self.ray)}  # ray: where it ran, not what
        values = {k: v for k, v in flag_values(self).items() if k not in left_out
                  and not (k in ("workflows", "split_by") and v is None)  # added when given: older keys stay as they were
                  and not (k == "workflow_option" and not v)}
        return dict(values, backend=dataclasses.asdict(self.backend))




def eval_profile(o: EvalOptions) -> "Profile":
    """The settings `eval` runs with, by `ask`'s rule: the built-in profile, the model's memagent.json, --profile,
    then the flags."""
    return resolve_model_profile(o.model, o.profile, window=o.window, **flag_values(o.budgets),
                                 **flag_values(o.sampling), **{f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.metadata.get("profile")})


def sweep_config(o: EvalOptions, profile: "Profile | None" = None) -> SweepConfig:
    """The sweep settings `memagent eval` runs with, from the options and the resolved profile (the settings
    fingerprint is computed from them)."""
    profile = profile if profile is not None else eval_profile(o)
    b, methods = profile.budgets, eval_methods(o)
    return SweepConfig(
        model_name=o.model, methods=methods, window=b.baseline_window, passage_tokens=o.passage_tokens,
        limit=o.limit, baseline_answer_tokens=b.baseline_answer_tokens,
        baseline_template=profile.prompts.baseline_template,
        agent=profile.agent_config(max_batch_docs=o.batch_docs), repeats=profile.sampling.repeats,
        scoring=profile.scoring, workflows=eval_workflows(o, profile, methods),
        rewards=tuple(n for n in (profile.reward, profile.step_reward) if n),
        backend_settings=dict(backend=o.backend.name, dtype=o.backend.dtype, tokenizer=o.backend.tokenizer,
                              chat_template_kwargs=profile.chat_template_kwargs, yarn_factor=b.yarn_factor))


def profile_workflow_options(profile: "Profile") -> dict[str, dict[str, Any]]:
    """The profile's `workflow: {name, options}` as the sweep's per-workflow options ({name: options}); {} when
    it sets no options (the records' fingerprints are then those of a profile without a workflow section). The
    options reach `name` where it is one of the methods; --workflows and --methods choose the methods."""
    options = dict(profile.workflow.options)
    return {profile.workflow.name: options} if options else {}


def eval_workflow_options(o: EvalOptions, profile: "Profile",
                          methods: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The profile's workflow options, then --workflow-option's: {workflow name: its options}. `methods`: the
    sweep's (`eval_methods(o)`, computed when not given)."""
    out = profile_workflow_options(profile)
    workflows = [m for m in (eval_methods(o) if methods is None else methods) if m not in BASELINES]
    given: dict[str, list[str]] = {}
    for pair in o.workflow_option:
        name, dot, rest = pair.partition("=")[0].partition(".")
        if not dot and len(workflows) != 1:
            raise InputError(f"--workflow-option {pair!r}: this run evaluates {len(workflows)} workflows "
                             f"({', '.join(workflows) or 'none'}); name the one it is for: NAME.KEY=VALUE")
        target = name if dot else workflows[0]
        if target not in workflows:
            raise InputError(f"--workflow-option {pair!r}: {target} is not one of the workflows evaluated "
                             f"({', '.join(workflows) or 'none'})")
        given.setdefault(target, []).append(pair[len(name) + 1:] if dot else pair)
    for name, pairs in given.items():
        out[name] = {**out.get(name, {}), **parse_workflow_options(pairs)}
        check_workflow_options(name, out[name])  # before any model is loaded
    return out


def eval_workflows(o: EvalOptions, profile: "Profile", methods: list[str]) -> tuple[WorkflowChoice, ...]:
    """The sweep's workflows with options, `{name, options}` each (`eval_workflow_options` as one shape)."""
    return tuple(WorkflowChoice(n, options) for n, options in eval_workflow_options(o, profile, methods).items())


def eval_methods(o: EvalOptions) -> list[str]:
    """The sweep's methods: --workflows (when given) then the baselines of --methods, else --methods. Every
    name of --methods is checked, also those --workflows replaces (`--methods nope` was dropped silently)."""
    refuse_unknown_methods(o.methods, "--methods")
    if o.workflows is None:
        return list(o.methods)
    return list(dict.fromkeys([*o.workflows, *(m for m in o.methods if m in BASELINES)]))


ExecutorFactory = Callable[["Profile"], Executor]  # the resolved profile -> where the sweep's units run


def run_eval(o: EvalOptions, executor: ExecutorFactory | None = None) -> str:
    """Build the backend, run the sweep (resuming; with `rescore`, no model at all), write profile.yaml, table.md,
    plots and summary.json, holding the output folder's lock throughout; returns the table. `executor` builds
    where the units run from the resolved profile (called only when the sweep runs; `memagent eval --ray` passes
    `memagent.scale.executor.ray_executor(...)`); None: in this process, on `o.backend`. With --ray an executor
    must be given."""
    profile = eval_profile(o)
    cfg = sweep_config(o, profile)
    if o.ray.address is not None and executor is None:
        raise EvalError("--ray needs the Ray executor: run `memagent eval --ray`, or pass "
                        "executor=memagent.scale.executor.ray_executor(model, backend, ray_options)")
    make = executor if executor is not None else lambda p: LocalExecutor(open_backend(o.model, o.backend, p))
    out = check_eval_out(Path(o.out), o.data, o.profile)
    report = Report(out, o.record(), o.split_by, o.workflows is not None)  # what the tables and summary.json say
    with open_sweep(out, cfg, o.data) as (datas, keys):
        write_profile(profile, out / "profile.yaml")
        if o.rescore:
            return _rescore_run(report, cfg, datas, keys)
        try:
            sweep(make(profile), datas, out, cfg, None, o.progress, o.retry_failed, o.max_failures)
        except EvalError:
            report.write(cfg, datas, keys)
            raise
        text = report.write(cfg, datas, keys)
        _check_failures(report.results, keys)
        return text


EVAL_FILES = ("results.jsonl", "table.md", "summary.json", "profile.yaml", LOCK_NAME)  # written in --out
PLOT_NAME = re.compile(r"scores_[A-Za-z0-9_.-]*\.png")  # eval.report.plot_scores' file names


def check_eval_out(out: Path, data: list[str], profile: Path | None) -> Path:
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


def _check_failures(results: Path, keys: list[str]) -> None:
    """An EvalError counting the run's failed samples (error records), when there are any."""
    records = latest(load_records(results))
    failed = sum(records.get(k, {}).get("status") == "error" for k in keys)
    if failed:
        raise EvalError(f"{failed} of {len(keys)} samples failed; see the records with status \"error\" in "
                        f"{results} (table.md and summary.json are written); fix the cause and rerun with --retry-failed")


def _rescore_run(report: "Report", cfg: SweepConfig, datas: list[DataFile], keys: list[str]) -> str:
    if not report.results.is_file():
        raise EvalError(f"nothing to rescore: {report.results} does not exist; run `memagent eval` without --rescore "
                        "first")
    rescore_file(report.results, cfg.scoring)
    return report.write(cfg, datas, keys)


@dataclass(frozen=True)
class Report:
    """What a run writes beside its records, resolved from the options once: table.md and plots (split by a tag;
    with the cost columns for --workflows) and summary.json (the options as it records them)."""

    out: Path
    options: dict[str, Any]  # EvalOptions.record()
    split_by: Optional[str]
    cost: bool

    @property
    def results(self) -> Path:
        return self.out / "results.jsonl"

    def write(self, cfg: SweepConfig, datas: list[DataFile], keys: list[str]) -> str:
        """table.md and plots of this run's records, and summary.json; returns the table."""
        text, _, _ = write_report(self.results, self.out, keys=keys, split_by=self.split_by, cost=self.cost)
        base = fingerprint(cfg)
        fps = {m: method_fingerprint(base, m, cfg.options(m)) for m in cfg.methods}
        write_summary(self.out, options=self.options, cfg=cfg, fingerprint=base, datas=datas, keys=keys,
                      records=latest(load_records(self.results)),
                      fingerprints={m: f for m, f in fps.items() if f != base})
        return text

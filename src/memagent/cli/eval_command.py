"""`memagent eval`: its options (one field per command-line option) and what they resolve to, once
(`resolve_eval`: the profile built once, the sweep's settings with each workflow bound to its options, what the
report says), before any model loads. The run itself is `memagent.eval.driver.run`; the command
(memagent.cli.evaluate) picks the executor: in this process, or on Ray actors for --ray.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from memagent.backends.options import BackendOptions
from memagent.eval.baselines import EvalError
from memagent.eval.executor import Executor, LocalExecutor
from memagent.eval.driver import EvalRun, Report, check_eval_out, run
from memagent.eval.sweep import BASELINES, METHODS, SweepConfig
from memagent.eval.workflow_runs import check_methods
from memagent.agent.registry import workflow_names
from memagent.config import WorkflowChoice, rule
from memagent.errors import InputError
from memagent.flags import (MODEL_HELP, WORKFLOW_OPTION_HELP, BudgetOptions, SamplingOptions, check_options, flag, flag_values,
                            limited, parse_workflow_options, split_list)
from memagent.protocol.profile import dump_profile, open_backend
from memagent.protocol.resolve import resolve_model_profile
from memagent.scale.options import RayOptions

if TYPE_CHECKING:
    from memagent.protocol.profile import Profile

__all__ = ["EvalOptions", "check_eval_out", "eval_profile", "resolve_eval", "run_eval", "sweep_config"]


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
        out[name] = {**out.get(name, {}), **parse_workflow_options(pairs)}  # checked as bound (SweepConfig.bound)
    return out


def eval_workflows(o: EvalOptions, profile: "Profile", methods: list[str]) -> tuple[WorkflowChoice, ...]:
    """The sweep's workflows with options, `{name, options}` each (`eval_workflow_options` as one shape)."""
    return tuple(WorkflowChoice(n, options) for n, options in eval_workflow_options(o, profile, methods).items())


def eval_methods(o: EvalOptions) -> list[str]:
    """The sweep's methods: --workflows (when given) then the baselines of --methods, else --methods. The sweep
    checks its methods (SweepConfig); the names of --methods that --workflows replaces are checked here
    (`--methods nope` was dropped silently)."""
    if o.workflows is None:
        return list(o.methods)
    dropped = check_methods([m for m in o.methods if m not in o.workflows])
    if dropped:
        raise EvalError(f"--methods: unknown method(s) {dropped}; choose from the baselines {', '.join(BASELINES)} "
                        f"or the workflows {', '.join(workflow_names())}")
    return list(dict.fromkeys([*o.workflows, *(m for m in o.methods if m in BASELINES)]))


ExecutorFactory = Callable[["Profile"], Executor]  # the resolved profile -> where the sweep's units run


def resolve_eval(o: EvalOptions) -> tuple[EvalRun, "Profile"]:
    """What `eval` runs, resolved and checked once, before any model loads or file is written: the profile
    (built once), the sweep's settings with each workflow bound to its options, what the report says."""
    profile = eval_profile(o)
    cfg = sweep_config(o, profile)
    cfg.bound  # each workflow looked up and its options checked, once, here  # noqa: B018
    report = Report(Path(o.out), o.record(), o.split_by, o.workflows is not None)
    return EvalRun(Path(o.out), tuple(o.data), cfg, dump_profile(profile), report, o.profile, o.rescore,
                   o.retry_failed, o.max_failures, o.progress), profile


def run_eval(o: EvalOptions, executor: ExecutorFactory | None = None) -> str:
    """Resolve the run once (`resolve_eval`) and run it (memagent.eval.driver.run): the sweep (resuming; with
    `rescore`, no model at all), then profile.yaml, table.md, plots and summary.json; returns the table.
    `executor` builds where the units run from the resolved profile (`memagent eval --ray` passes
    `memagent.scale.executor.ray_executor(...)`); None: in this process, on `o.backend`. With --ray an executor
    must be given."""
    spec, profile = resolve_eval(o)
    if o.ray.address is not None and executor is None:
        raise EvalError("--ray needs the Ray executor: run `memagent eval --ray`, or pass "
                        "executor=memagent.scale.executor.ray_executor(model, backend, ray_options)")
    make = executor if executor is not None else lambda p: LocalExecutor(open_backend(o.model, o.backend, p))
    return run(spec, lambda: make(profile))

"""Reading workflows by name: the built-ins, and third-party ones registered through the entry-point group
`memagent.workflows`.

A workflow is a generator function (memagent.agent.protocol: `workflow(doc, question, options)` yields `Call`s,
returns an `Answer`); `build_workflow(name, backend, config, **options)` makes it a `Runner`
(memagent.agent.scheduler) under the shared run options (WorkflowOptions: trace_path, progress, errors,
keep_conversations, on_step, trace_chunks, schedule, failures) plus the workflow's own. Every caller (rollouts,
validation, eval, ask, serve, the Ray worker, the demo) builds its workflow here by name, so a package that
registers one can be trained and evaluated without a fork. A registered name may also be a factory
`factory(backend, config, **options)` returning a state machine of the earlier protocol (one release).

Built-ins are named by "module:attribute" and imported only when asked for (a missing module is a clear
error). Entry points are read once, on the first lookup of a name that is not built in or registered; an entry
point's value is "module:attribute" (`[project.entry-points."memagent.workflows"] echo = "pkg.mod:echo"`).

This module re-exports the names a caller needs.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from memagent.agent.protocol import (WORKFLOW_OPTIONS, AgentInput, AgentResult, Answer, BudgetError, Call,
                                     Conversation, Document, Prompt, Reply, WorkflowError, WorkflowOptions,
                                     check_questions, split_options, workflow)
from memagent.agent.guards import GuardedSteps, is_plugin, plugin_fault
from memagent.agent.runner import Runner, own_options, run_workflow, stream_workflow
from memagent.agent.scheduler import RunStats
from memagent.config import DEFAULT_WORKFLOW, ConfigError
from memagent.errors import MemAgentError
from memagent.plugins import Registry

__all__ = ["AgentInput", "AgentResult", "Answer", "BudgetError", "Call", "Conversation", "DEFAULT_WORKFLOW",
           "Document", "Prompt", "Reply", "RunStats", "Runner", "UnknownWorkflow", "WORKFLOW_OPTIONS",
           "WorkflowError",
           "WorkflowOptions", "build_workflow", "check_questions", "check_workflow_options", "get_workflow", "refresh_entry_points",
           "register_workflow", "run_workflow", "split_options", "stream_workflow", "workflow", "workflow_names"]

WorkflowFactory = Callable[..., Any]  # a workflow generator function, or factory(backend, config, **options)
ENTRY_POINT_GROUP = "memagent.workflows"

# name -> "module:attribute", imported on first use (kept as strings: the registry imports no workflow module)
BUILTINS: dict[str, str] = {
    "memagent": "memagent.agent.workflow:memagent",  # the paper's overwrite loop (the default)
    "lookup": "memagent.agent.lookup:lookup",  # read, index the chunks, look back with a query of the model's
    "skim": "memagent.agent.skim:skim",  # rank the chunks against the question, read the top k
}


class UnknownWorkflow(MemAgentError, ValueError):
    """A workflow name that is neither built in, registered, nor an installed entry point."""


def register_workflow(name: str, factory: WorkflowFactory) -> None:
    """Make `factory` the workflow called `name` in this process (it replaces a built-in or entry point of that
    name). Names are words: letters, digits, '-', '_'."""
    _REGISTRY.register(name, factory)


def unregister_workflow(name: str) -> None:
    """Forget a workflow registered with `register_workflow` (built-ins and entry points stay)."""
    _REGISTRY.unregister(name)


def refresh_entry_points() -> None:
    """Read the installed entry points again on the next lookup (a package installed in a running process)."""
    _REGISTRY.refresh()


def workflow_names() -> list[str]:
    """Every workflow name known: built-ins, registered, installed entry points (sorted, the default first)."""
    names = set(BUILTINS) | set(_REGISTRY.factories) | set(_REGISTRY.installed())
    return sorted(names, key=lambda n: (n != DEFAULT_WORKFLOW, n))


_REGISTRY = Registry(ENTRY_POINT_GROUP, "workflow", BUILTINS, workflow_names, UnknownWorkflow, WorkflowError)


def get_workflow(name: str) -> WorkflowFactory:
    """The factory of workflow `name`; UnknownWorkflow (listing the valid names) when there is none, WorkflowError
    naming it when it fails as it is imported (memagent.plugins)."""
    return _REGISTRY.get(name)


def is_generator_workflow(obj: Any) -> bool:
    """Whether `obj` is a workflow generator function (else a factory of the earlier state-machine protocol)."""
    return inspect.isgeneratorfunction(obj) or inspect.isgeneratorfunction(getattr(obj, "__call__", None))


def build_workflow(name: str, backend: Any, config: Any, **options: Any) -> Any:
    """Workflow `name` ready to run: a `Runner` of its generator function (a factory of the earlier protocol:
    `factory(backend, config, **options)`); its `name` is `name`."""
    target = get_workflow(name)
    if is_generator_workflow(target):
        wf = Runner(target, backend, config, **options)
    else:
        try:
            wf = target(backend, config, **options)
        except MemAgentError:
            raise
        except Exception as e:  # noqa: BLE001 - a factory of the earlier protocol
            if not is_plugin(target):
                raise
            raise plugin_fault(name, target, "as it was built", e) from None
        if is_plugin(target) and not isinstance(wf, Runner):  # a Runner guards its workflow itself
            wf = GuardedSteps(wf, name, target, backend)  # the checks a generator workflow's calls get
    if isinstance(wf, Runner) or not getattr(wf, "name", None):
        wf.name = name
    return wf


def check_workflow_options(name: str, options: Any) -> None:
    """ConfigError for options of workflow `name` that a file or a flag may not set: not a mapping, a run-time
    setting of the command (WORKFLOW_OPTIONS: trace_path, on_step, errors, failures, schedule, progress, ...),
    a name the workflow does not have, or a value its options class refuses (its type or range). The one check
    of every entry (--workflow-option, a profile's `workflow.options`, a training config's `workflow.options`,
    serve, eval sweeps), made before any model is loaded or file written; a factory of the earlier protocol
    checks its own when it is built."""
    if not isinstance(options, dict):
        raise ConfigError(f"workflow {name}: options must be a mapping of option: value, got "
                          f"{type(options).__name__}")
    run_time = sorted(set(options) & set(WORKFLOW_OPTIONS))
    if run_time:
        raise ConfigError(f"workflow {name}: {', '.join(run_time)} is a run-time setting of the command, not an "
                          "option a profile, a config or --workflow-option can set (use the command's own flags)")
    target = get_workflow(name)
    if is_generator_workflow(target):
        own_options(target, name, options)


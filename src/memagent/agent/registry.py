"""Reading workflows by name: the built-ins, and third-party ones registered through the entry-point group
`memagent.workflows`.

A workflow is a generator function (memagent.agent.protocol: `workflow(doc, question, options)` yields `Call`s,
returns an `Answer`); `build_workflow(name, backend, config, **options)` makes it a `Runner`
(memagent.agent.scheduler) under the shared run options (WorkflowOptions: trace_path, progress, errors,
keep_conversations, on_step, trace_chunks, schedule, failures) plus the workflow's own. Every caller (rollouts,
validation, eval, ask, serve, the Ray worker, the demo) builds its workflow here by name, so a package that
registers one can be trained and evaluated without a fork. `bind_workflow(name, options)` finds it and builds
its own options once; a command passes what it returns down.

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
from memagent.agent.runner import BoundWorkflow, Runner, own_options, run_workflow, stream_workflow
from memagent.agent.scheduler import RunStats
from memagent.config import DEFAULT_WORKFLOW, ConfigError
from memagent.errors import MemAgentError
from memagent.plugins import Registry

__all__ = ["AgentInput", "AgentResult", "Answer", "BoundWorkflow", "BudgetError", "Call", "Conversation", "DEFAULT_WORKFLOW",
           "Document", "Prompt", "Reply", "RunStats", "Runner", "UnknownWorkflow", "WORKFLOW_OPTIONS",
           "WorkflowError",
           "WorkflowOptions", "bind_workflow", "build_workflow", "check_questions", "check_workflow_options", "get_workflow", "refresh_entry_points",
           "register_workflow", "run_workflow", "split_options", "stream_workflow", "workflow", "workflow_names"]

WorkflowFactory = Callable[..., Any]  # a workflow generator function
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


def bind_workflow(name: str, options: Any = None) -> BoundWorkflow:
    """Workflow `name` bound to its own `options` (None: none), looked up and checked once: ConfigError for
    options a file or a flag may not set (not a mapping, a run-time setting of the command: WORKFLOW_OPTIONS,
    trace_path, on_step, errors, failures, schedule, progress, ...; a name the workflow does not have, or a value
    its options class refuses), WorkflowError for a workflow that is not a generator function. The one check of
    every entry (--workflow-option, a profile's `workflow.options`, a training config's, serve, eval sweeps),
    made before any model is loaded or file written; what it returns is passed down, never checked again."""
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ConfigError(f"workflow {name}: options must be a mapping of option: value, got "
                          f"{type(options).__name__}")
    run_time = sorted(set(options) & set(WORKFLOW_OPTIONS))
    if run_time:
        raise ConfigError(f"workflow {name}: {', '.join(run_time)} is a run-time setting of the command, not an "
                          "option a profile, a config or --workflow-option can set (use the command's own flags)")
    target = get_workflow(name)
    if not (inspect.isgeneratorfunction(target) or inspect.isgeneratorfunction(getattr(target, "__call__", None))):
        raise WorkflowError(f"workflow {name!r} ({getattr(target, '__module__', '?')}."
                            f"{getattr(target, '__qualname__', type(target).__name__)}) is not a generator function; "
                            "a workflow yields its model calls (docs/workflows.md; the earlier state-machine "
                            "protocol is gone)")
    return BoundWorkflow(name, target, dict(options), own_options(target, name, options))


def build_workflow(workflow: str | BoundWorkflow, backend: Any, config: Any, **options: Any) -> Runner:
    """A workflow ready to run: a `Runner` of `workflow` (a name: bound here to the own options among `options`;
    a BoundWorkflow: as bound, `options` the run options alone), its `name` the registered one."""
    if isinstance(workflow, str):
        own = {k: v for k, v in options.items() if k not in WORKFLOW_OPTIONS}
        workflow = bind_workflow(workflow, own)
        options = {k: v for k, v in options.items() if k in WORKFLOW_OPTIONS}
    return Runner(workflow, backend, config, **options)


def check_workflow_options(name: str, options: Any) -> None:
    """`bind_workflow(name, options)` for a caller that only checks them."""
    bind_workflow(name, options)


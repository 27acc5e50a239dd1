"""The settings a command runs with, resolved in one order for `ask`, `eval`, `serve` and the harnesses:

    1. the built-in profile (`memagent.protocol.profile.Profile()`, the paper's settings);
    2. the prompts and budgets saved beside the model (`memagent.json`, written by `memagent demo` and
       `save_agent_settings`);
    3. the `--profile` YAML file;
    4. the command-line flags that were given (`memagent.protocol.profile.FLAG_KEYS`).

`resolve_model_profile` is that order; `model_profile` is it for the budget and sampling flags `ask`, `serve`
and the harnesses share; `workflow_profile` adds the command's workflow, bound to its options. Each layer is
checked as it is read and the profile is built once (`memagent.protocol.profile.resolve_values`). `memagent.json`
holds only AgentConfig fields (`SETTING_KEYS`), each type-checked.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from memagent.bounded import CONFIG_CHARS, loads_json
from memagent.config import AgentConfig
from memagent.errors import InputError
from memagent.agent.registry import BoundWorkflow, bind_workflow
from memagent.config import ConfigError, WorkflowChoice
from memagent.flags import BudgetOptions, SamplingOptions, flag_values, parse_workflow_options
from memagent.io import atomic_write_text, read_text
from memagent.protocol.profile import Profile, make_profile, resolve_values

__all__ = ["AGENT_SETTINGS_FILE", "SETTING_KEYS", "model_agent_settings", "model_profile",
           "model_profile_values", "resolve_model_profile", "resolve_workflow", "save_agent_settings", "workflow_profile",
           "workflow_options_for"]

AGENT_SETTINGS_FILE = "memagent.json"  # optional, in a model directory: the prompt settings it was trained with
# the profile's sections a memagent.json sets, flat: its keys are those sections' fields (and their rules)
_SECTIONS = dict(budgets=("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens"),
                 prompts=("memory_template", "final_template", "empty_memory"))
SETTING_KEYS = tuple(k for keys in _SECTIONS.values() for k in keys)


def model_agent_settings(model: str) -> dict[str, Any]:
    """The AgentConfig fields saved beside a model (`memagent.json`), e.g. by `memagent demo`; {} if none. Their
    values are checked as the profile's layer (`model_settings_layer`), by the sections' own rules."""
    path = Path(model) / AGENT_SETTINGS_FILE
    if not path.is_file():
        return {}
    data = loads_json(read_text(path, "model settings file", InputError), str(path), InputError, CONFIG_CHARS,
                      syntax="{where} is not valid JSON ({reason}); fix it or remove it")
    if not isinstance(data, dict):
        raise InputError(f"{path} must be a JSON object of settings ({', '.join(SETTING_KEYS)})")
    unknown = sorted(set(data) - set(SETTING_KEYS))
    if unknown:
        raise InputError(f"{path}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(SETTING_KEYS)}")
    return dict(data)  # each value checked by its section's field as the profile reads it (`profile_values`)


def save_agent_settings(model_dir: str | Path, config: AgentConfig) -> Path:
    """Write `config`'s prompt settings beside a saved model, where `model_agent_settings` reads them."""
    path = Path(model_dir) / AGENT_SETTINGS_FILE
    return atomic_write_text(path, json.dumps({k: getattr(config, k) for k in SETTING_KEYS}, indent=2) + "\n")


def model_settings_layer(model: str) -> tuple[str, dict[str, Any]]:
    """Step 2 as a profile layer: (the model's memagent.json, its prompts and budgets as profile sections)."""
    settings = model_agent_settings(model)
    return (str(Path(model) / AGENT_SETTINGS_FILE),
            {name: {k: settings[k] for k in keys if k in settings} for name, keys in _SECTIONS.items()})


def model_profile_values(model: str, profile: Optional[str | Path], **flags: Any) -> tuple[dict[str, Any], str]:
    """Steps 1 to 4 as the profile's fields and their sources (`memagent.protocol.profile.resolve_values`), not
    yet built: a command adds what it resolves itself (its workflow), then builds the profile once."""
    return resolve_values(profile, [model_settings_layer(model)], **flags)


def resolve_model_profile(model: str, profile: Optional[str | Path], **flags: Any) -> Profile:
    """Steps 1 to 4: the built-in profile, the model's memagent.json, the `--profile` file (None: none), then
    `flags` (keys of `memagent.protocol.profile.FLAG_KEYS`; None: not given)."""
    return make_profile(*model_profile_values(model, profile, **flags))


def model_profile(model: str, profile: Optional[Path], budgets: BudgetOptions,
                  sampling: SamplingOptions = SamplingOptions()) -> Profile:
    """The settings `ask`, `serve` and the harnesses run with: `resolve_model_profile` with their budget and
    sampling flags."""
    return resolve_model_profile(model, profile, **flag_values(budgets), **flag_values(sampling))


def workflow_profile(model: str, profile: Optional[Path], budgets: BudgetOptions, sampling: SamplingOptions,
                     workflow: str, pairs: list[str]) -> tuple[Profile, BoundWorkflow]:
    """`model_profile` and the command's workflow bound to its options (`resolve_workflow`), each made once; the
    profile records --workflow-option's options when any were given (written beside the results)."""
    values, sources = model_profile_values(model, profile, **flag_values(budgets), **flag_values(sampling))
    bound = resolve_workflow(values["workflow"], workflow, pairs)
    if pairs:
        values["workflow"] = WorkflowChoice(workflow, bound.options)
    return make_profile(values, sources), bound


def workflow_options_for(profile: Profile, workflow: str, pairs: list[str]) -> dict[str, Any]:
    """The options `workflow` runs with under `ask` and `serve`: the profile's `workflow.options` when it names
    that workflow, then --workflow-option's KEY=VALUE `pairs`; parsed and checked once, before any model loads."""
    return resolve_workflow(profile.workflow, workflow, pairs).options


def resolve_workflow(chosen: WorkflowChoice, workflow: str, pairs: list[str]) -> BoundWorkflow:
    """`workflow` bound to its options (memagent.agent.registry.bind_workflow: looked up and checked once):
    `chosen`'s options (a profile's workflow) when it names that workflow, then --workflow-option's KEY=VALUE
    `pairs`. A profile's choice of another workflow is checked too, when it was given (not the built-in's):
    whichever workflow runs, the profile's options are its own workflow's."""
    if chosen.name != workflow and chosen != WorkflowChoice():
        try:
            bind_workflow(chosen.name, chosen.options)
        except ConfigError as e:
            raise ConfigError(f"the profile's workflow: {e}") from None
    options = dict(chosen.options) if chosen.name == workflow else {}
    options.update(parse_workflow_options(pairs))
    return bind_workflow(workflow, options)

"""Configuration of the read-write loop. Defaults follow the paper (docs/paper.md, "The workflow").

Every configuration dataclass of the project declares a field's rule beside the field: `rule(min=1)`,
`rule(choices=...)` as `dataclasses.field` metadata, checked in one place, `check_fields` (called by each
class's `__post_init__`; `check_value` checks one value, e.g. a command-line flag, against the same rule).
The loader of YAML and `key=value` overrides is `memagent.sections`.

The values a config is checked against live here too: `check_template` (the paper's templates, the defaults,
and their placeholders are declared in `memagent.prompts`, a leaf module, and stay importable from
here), the answer protocols and think modes (applied by `memagent.agent.answer`).

A reading workflow is chosen in one shape everywhere (a profile, a training config): `workflow: {name, options}`
(`WorkflowChoice`); `workflow_choice_data` reads the older spellings into it, each with a deprecation line.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

from memagent.prompts import FINAL_FIELDS, MEMORY_FIELDS, PAPER_FINAL_TEMPLATE, PAPER_MEMORY_TEMPLATE, PLACEHOLDER
from memagent.errors import MemAgentError


class ConfigError(MemAgentError, ValueError):
    """A configuration value is invalid; the message says which and what to do."""


def rule(help: str = "", *, min: float | None = None, above: float | None = None, max: float | None = None,
         below: float | None = None, choices: tuple[str, ...] | None = None, scalar: bool = False,
         options: str | None = None, **more: Any) -> dict[str, Any]:
    """Field metadata: help text and the value's rule (min/max inclusive, above/below exclusive, choices),
    checked by `check_fields`. `scalar` and `options` declare short spellings (memagent.sections); `more` adds
    other metadata: `section=` (the protocol profile section an AgentConfig field belongs to), `cli=` (its
    command-line help: ask/eval/serve get a flag), `flag_name=` (a profile setting's flag), memagent.flags.flag's."""
    limits = {k: v for k, v in dict(min=min, above=above, max=max, below=below, choices=choices).items()
              if v is not None}
    return {"help": help, "rule": limits, "scalar": scalar, "options": options, **more}


def key_of(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


@functools.lru_cache(maxsize=None)
def hints_of(cls: type) -> dict[str, Any]:
    """The resolved field types of dataclass `cls` (cached: configs are built often)."""
    return typing.get_type_hints(cls, include_extras=False)


def check_fields(obj: Any, where: str = "") -> None:
    """ConfigError for the first field of `obj` whose value breaks its declared rule (None is unset)."""
    hints = hints_of(type(obj))
    for f in dataclasses.fields(obj):
        limits = f.metadata.get("rule")
        value = getattr(obj, f.name)
        if limits and value is not None:
            check_value(key_of(where, f.name), value, limits, optional_inner(hints[f.name]) is int)


def check_value(key: str, value: Any, limits: dict[str, Any], integer: bool,
                error: type[Exception] = ConfigError) -> None:
    """`error` (a file's setting: ConfigError; a flag: InputError) unless `value` (named `key`: a field or a flag)
    keeps `limits` (see `rule`)."""
    if "choices" in limits:
        if value not in limits["choices"]:
            raise error(f"{key} must be one of {', '.join(limits['choices'])}; got {value!r}")
        return
    low = ("min", limits["min"]) if "min" in limits else ("above", limits["above"]) if "above" in limits else None
    high = ("max", limits["max"]) if "max" in limits else ("below", limits["below"]) if "below" in limits else None
    if integer:
        kind = "a positive integer" if low == ("min", 1) and not high else "an integer"
        if not isinstance(value, int) or isinstance(value, bool):
            raise error(f"{key} must be {kind}, got {value!r}")
        if kind == "a positive integer" and value < 1:
            raise error(f"{key} must be {kind}, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{key} must be a number, got {value!r}")
    broken = not math.isfinite(value) or (low and (value < low[1] or (low[0] == "above" and value == low[1]))) \
        or (high and (value > high[1] or (high[0] == "below" and value == high[1])))
    if broken:
        finite = "" if integer or (low and high) else "a finite number "  # an interval is finite already
        raise error(f"{key} must be {finite}{_range(low, high)}, got {value!r}")


def _range(low: tuple[str, float] | None, high: tuple[str, float] | None) -> str:
    """'>= 0', '> 1', 'in [0, 1)', ... of a field's limits."""
    if low and high:
        return f"in {'[' if low[0] == 'min' else '('}{low[1]:g}, {high[1]:g}{']' if high[0] == 'max' else ')'}"
    kind, bound = low or high  # type: ignore[misc]
    return f"{dict(min='>=', above='>', max='<=', below='<')[kind]} {bound:g}"


def optional_inner(tp: Any) -> Any:
    """X of Optional[X] (X | None); `tp` itself otherwise."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp



# the rule of every --seed option (NumPy's seeds are below 2**32), as `rule` metadata with its reason (`over`, see
# memagent.flags); AgentConfig's seed carries it as `cli_rule`: its flag's, while a profile checks sampling.seed
SEED_RULE = {"rule": {"min": 0, "max": 2**32 - 1}, "over": "(NumPy's seeds are below 2**32)"}
ANSWER_PROTOCOLS = ("boxed", "phrase")
THINK_MODES = ("strip", "keep")  # strip: drop everything up to the last </think>; keep: use the reply as is

def check_template(template: str, fields: tuple[str, ...], name: str) -> None:
    """Raise ConfigError unless `template` holds each of `fields` and no other placeholder."""
    found = set(PLACEHOLDER.findall(template))
    missing = [f for f in fields if f not in found]
    if missing:
        raise ConfigError(
            f"the {name} template lacks the placeholder(s) "
            + ", ".join("{" + f + "}" for f in missing)
            + "; it must contain " + ", ".join("{" + f + "}" for f in fields)
        )
    extra = sorted(found - set(fields))
    if extra:
        raise ConfigError(
            f"the {name} template has placeholder(s) {', '.join('{' + f + '}' for f in extra)} "
            f"that it cannot fill; allowed: {', '.join('{' + f + '}' for f in fields)}"
        )


@dataclass
class AgentConfig:
    """How MemAgent reads a document.

    The paper's window budget: query 1024 + chunk 5000 + memory 1024 + output 1024 + template,
    about 8K tokens, constant whatever the document's length.
    """

    chunk_tokens: int = field(default=5000, metadata=rule(min=1, section="budgets", cli=(
        "C: document tokens per memory call; ask and serve take a model's memagent.json before the profile")))
    #   paper: 5000
    memory_tokens: int = field(default=1024, metadata=rule(min=1, section="budgets", cli="M: hard cap on the memory"))
    #   in tokens of the model's tokenizer
    answer_tokens: int = field(default=1024, metadata=rule(min=1, section="budgets", cli=(
        "Max new tokens of MemAgent's final answer; in eval the baselines' too, unless the profile sets "
        "budgets.baseline_answer_tokens")))
    query_tokens: int = field(default=1024, metadata=rule(min=1, section="budgets", cli="Budget of the question"))
    #   a longer question is an error
    memory_template: str = field(default=PAPER_MEMORY_TEMPLATE, metadata=rule(section="prompts"))
    final_template: str = field(default=PAPER_FINAL_TEMPLATE, metadata=rule(section="prompts"))
    empty_memory: str = field(default="No previous memory", metadata=rule(section="prompts"))  # the memory before
    #   the first chunk (reference code)
    temperature: float = field(default=0.0, metadata=rule(min=0, section="sampling", cli="0 = greedy"))  # 0 = greedy
    #   (evaluation); the paper's rollouts use 1.0; the reference evaluation samples at 0.7
    top_p: float = field(default=1.0, metadata=rule(above=0, max=1, section="sampling", cli="Nucleus sampling"))
    #   the reference evaluation: 0.95
    seed: int | None = field(default=None, metadata=rule(section="sampling", cli="Sampling seed", cli_rule=SEED_RULE))  # base seed;
    #   repeat r of a sample uses its own seed derived from it
    max_batch_docs: int = field(default=16, metadata=rule(min=1))  # documents in flight at once; their prompts
    #   share one backend batch
    answer_protocol: str = field(default="boxed", metadata=rule(choices=ANSWER_PROTOCOLS, section="prompts"))
    #   final answer: "boxed" (last \\boxed{}) or "phrase" (after the last "the answer is")
    think: str = field(default="strip", metadata=rule(choices=THINK_MODES, section="prompts"))  # "strip": cut each
    #   reply up to its last </think> before the memory cap and the answer; "keep": use replies as they are
    document_tokens: int | None = field(default=None, metadata=rule(min=1, section="budgets"))  # MemAgent: cut
    #   longer documents in the middle to this many tokens (reference eval: 120000)

    def __post_init__(self) -> None:
        check_fields(self)
        check_template(self.memory_template, MEMORY_FIELDS, "memory")
        check_template(self.final_template, FINAL_FIELDS, "final")


class ConfigDeprecation(DeprecationWarning):
    """An old spelling in a config file, a profile or an override: it still reads, the message names the new one
    (the CLI prints it as one `warning: ...` line on stderr)."""


def deprecated(message: str) -> None:
    warnings.warn(message, ConfigDeprecation, stacklevel=3)


DEFAULT_WORKFLOW = "memagent"  # the paper's overwrite loop (memagent.agent.workflow)


@dataclass(frozen=True)
class WorkflowChoice:
    """The reading workflow a command, a profile or a training run uses (memagent.agent.registry), and its own
    options; written `workflow: {name: lookup, options: {hits: 3}}` in every file."""
    name: str = field(default=DEFAULT_WORKFLOW, metadata=rule(flag_name="workflow"))
    options: dict[str, Any] = field(default_factory=dict)  # keyword options of its factory (e.g. lookup's)


def workflow_choice_data(data: Any, where: str) -> Any:
    """`data` (the mapping of a profile or a training config, `where` names it) with its workflow choice in the one
    shape `workflow: {name, options}`. The older spellings read the same, with one deprecation line:
    `workflow: NAME` (and `workflow_options: {...}` beside it, a training config's) and `workflow: {NAME: options}`."""
    if not isinstance(data, dict) or ("workflow" not in data and "workflow_options" not in data):
        return data
    out, old = dict(data), []
    choice = out.get("workflow")
    if isinstance(choice, str):
        old.append(f"workflow: {choice}")
        choice = {"name": choice}
    elif (isinstance(choice, dict) and len(choice) == 1 and not {"name", "options"} & set(choice)
          and all(isinstance(v, dict) or v is None for v in choice.values())):
        name, options = next(iter(choice.items()))
        old.append(f"workflow: {{{name}: OPTIONS}}")
        choice = {"name": name, "options": options or {}}
    if "workflow_options" in out:
        options = out.pop("workflow_options")
        old.append("workflow_options: OPTIONS")
        choice = dict(choice) if isinstance(choice, dict) else {}
        held = choice.get("options")
        twice = sorted(set(held) & set(options)) if isinstance(held, dict) and isinstance(options, dict) else []
        if twice:  # one of the two was dropped without a word
            raise ConfigError(f"{where}: the workflow option(s) {', '.join(map(str, twice))} are given twice, in "
                              f"workflow.options ({', '.join(f'{k}: {held[k]!r}' for k in twice)}) and in "
                              f"workflow_options ({', '.join(f'{k}: {options[k]!r}' for k in twice)}); give each "
                              "once, under workflow: {name, options}")
        choice["options"] = {**held, **options} if isinstance(held, dict) and isinstance(options, dict) else options
    if old:
        name = choice.get("name", "NAME") if isinstance(choice, dict) else "NAME"
        deprecated(f"{where}: `{'` with `'.join(old)}` is the old spelling of the workflow choice, read as "
                   f"`workflow: {{name: {name}, options: OPTIONS}}`; write that (it reads everywhere)")
    out["workflow"] = choice
    return out

"""Checks of command-line values where they enter: counts, finite numbers, names, devices.

Every option is a dataclass field (`flag(...)` metadata, turned into a typer option by
`memagent.cli.params.options_command`), and its rule sits beside it: `memagent.config.rule(min=..., max=...,
choices=...)` in the same metadata, plus, where a bound needs its reason in the message, `why=` (the reason of
the whole interval: "must be in 1..1024, got 0 (REASON)") or `over=` (the reason of the upper limit: "--samples
10000000 is over the limit of 1,000,000 REASON; ask for less"), and `check=` (a function of (value, flag), e.g.
`check_device`). `check_options(options)` checks them all, in one place, nested option groups included; a list
value (a parsed `--chunks 4,16`) is checked item by item.

The options `ask`, `eval` and `serve` share are one type per concern: `BudgetOptions` and `SamplingOptions` are
made from AgentConfig's own fields (their type, rule and help declared once, in memagent.config); the backend's
are `memagent.backends.options.BackendOptions`.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from memagent.config import SEED_RULE, AgentConfig, check_value, hints_of, optional_inner, rule
from memagent.errors import InputError

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
ERRORS = ("strict", "replace")  # how invalid UTF-8 in a document is read (ask, the harnesses)


def seed_rule() -> dict[str, Any]:
    """The rule of a --seed option (NumPy's seeds: 0 .. 2**32 - 1, `memagent.config.SEED_RULE`)."""
    return {**rule(), **SEED_RULE}


def limited(maximum: int, over: str, minimum: int = 1) -> dict[str, Any]:
    """The rule of a size option: at least `minimum`, at most `maximum`, `over` saying why (past it a run never
    finishes or fills the disk: `eval --repeats 10**9`, `data toy --chunks 10**9`)."""
    return {**rule(min=minimum, max=maximum), "over": over}


def check_flag(name: str, value: Any, meta: Any, integer: bool) -> None:
    """InputError unless `value` of the option `name` (e.g. "--samples") keeps the rule of its field metadata
    `meta` (see the module docstring); a list or tuple value: each item. None is unset."""
    if isinstance(value, (list, tuple)):
        for item in value:
            check_flag(name, item, meta, integer)
        return
    if value is None:
        return
    limits = meta.get("rule") or {}
    low, high = limits.get("min"), limits.get("max")
    if integer and isinstance(value, int) and not isinstance(value, bool):
        if meta.get("why") and ((low is not None and value < low) or (high is not None and value > high)):
            span = f"in {low}..{high}" if high is not None else f">= {low}"
            raise InputError(f"{name} must be {span}, got {value!r} ({meta['why']}); give a value in that range")
        if meta.get("over") and high is not None and value > high:
            raise InputError(f"{name} {value} is over the limit of {high:,} {meta['over']}; ask for less")
    if meta.get("over"):  # the upper limit is checked above, with its reason
        limits = {k: v for k, v in limits.items() if k != "max"}
    if limits:
        check_value(name, value, limits, integer, InputError)
    if meta.get("check"):
        meta["check"](value, name)


def _check_field(f: dataclasses.Field, value: Any, hint: Any, by_key: bool = False) -> None:
    """`check_flag` of one flag field's `value`, named by its flag (`by_key`: by its parameter name, as a
    harness's model arguments are given); `hint`: the field's type (int, Optional[int] and list[int] are checked
    as integers, a list item by item)."""
    kind = optional_inner(hint)
    name = flag_key(f) if by_key else flag_decls(f)[0].split("/")[0]
    check_flag(name, value, f.metadata, kind is int or typing.get_args(kind) == (int,))


def check_options(options: Any, by_key: bool = False) -> None:
    """InputError for the first flag field of `options` (nested option groups included) whose value breaks the
    rule declared beside it, named by its flag (`by_key`: by its parameter name, e.g. `chunk_tokens`). A group
    whose class sets `checks_itself` (it calls this in its `__post_init__`: ask's, eval's, serve's and the Ray
    options) was checked as it was built and is not checked again: each check runs once on every path."""
    hints = hints_of(type(options))
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if "flag" in f.metadata:
            _check_field(f, value, hints[f.name], by_key)
        elif dataclasses.is_dataclass(value) and not getattr(value, "checks_itself", False):
            check_options(value, by_key)


def check_as(cls: type, by_key: bool = False, **values: Any) -> None:
    """Check `values` ({field name: value}) by the rules of the same-named flag fields of the options type
    `cls`, e.g. a harness's model arguments by `memagent ask`'s options (the same rules, declared once)."""
    hints = hints_of(cls)
    for f in dataclasses.fields(cls):
        if f.name in values and "flag" in f.metadata:
            _check_field(f, values[f.name], hints[f.name], by_key)


def check_device(device: str, flag: str = "--device") -> None:
    """Refuse a device name torch does not know, or one this machine does not have."""
    if device in ("auto", "cpu"):
        return
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "mps") or (index and not index.isdigit()) or (kind == "mps" and index):
        raise InputError(f"{flag} {device!r} is unknown; choose one of: {', '.join(DEVICES)}")
    import torch  # lazy: torch

    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(f"{flag} {device}: this machine has no CUDA GPU (or torch was built without CUDA); "
                             "use --device cpu or auto")
        if index and int(index) >= count:
            raise InputError(f"{flag} {device}: this machine has {count} CUDA GPU(s), cuda:0 .. cuda:{count - 1}")
    elif not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise InputError(f"{flag} mps: this machine has no Apple GPU (MPS); use --device cpu or auto")


def split_list(text: str, flag: str) -> list[str]:
    """'a.jsonl, b.jsonl' -> ['a.jsonl', 'b.jsonl']; a list with no item (e.g. ',') is refused."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise InputError(f"{flag} {text!r} names nothing; give one or more values separated by commas")
    return items


WORKFLOW_OPTION_HELP = ("An option of the reading workflow, KEY=VALUE (repeatable; e.g. hits=3 for lookup); it "
                        "overrides the profile's workflow options. VALUE is read as an integer, a number, true, "
                        "false or null when it is one, else as text.")


def parse_workflow_options(pairs: list[str], flag: str = "--workflow-option") -> dict[str, Any]:
    """["hits=3", "keep_index=true", "query_template=Q {question}"] -> {"hits": 3, "keep_index": True, ...}."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        key = key.strip()
        if not eq or not key.replace("_", "").isalnum():
            raise InputError(f"{flag} {pair!r} is not KEY=VALUE (KEY: letters, digits, '_'); e.g. {flag} hits=3")
        if key in out:
            raise InputError(f"{flag} names {key} twice; give each option once")
        out[key] = _scalar(text)
    return out


def _scalar(text: str) -> Any:
    """A command-line value as YAML would read a plain scalar: int, float, true/false, null, else the text."""
    words = {"true": True, "false": False, "null": None, "none": None}
    if text.strip().lower() in words:
        return words[text.strip().lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def flag(help: str, *decls: str, parse: Any = None, argument: bool = False) -> dict[str, Any]:
    """`dataclasses.field` metadata that makes a field a command-line option (or, with `argument`, a positional
    argument named FIELD_NAME).

    decls: its declarations (default `--field-name`; e.g. "--progress/--no-progress", or "--backend" for a
    field named otherwise); parse: a function of (text, flag) giving the field's value from a text option.
    """
    return {"flag": dict(help=help, decls=decls, parse=parse, argument=argument)}


def flag_decls(f: dataclasses.Field) -> tuple[str, ...]:
    """The option declarations of a flag field (default: `--field-name`; an argument: its FIELD_NAME)."""
    if f.metadata["flag"].get("argument"):
        return (f.name.upper(),)
    return f.metadata["flag"]["decls"] or ("--" + f.name.replace("_", "-"),)


def flag_key(f: dataclasses.Field) -> str:
    """The parameter name of a flag field: its first declaration without dashes ("--top-p" -> "top_p")."""
    return flag_decls(f)[0].split("/")[0].lstrip("-").replace("-", "_").lower()


def flag_values(options: Any) -> dict[str, Any]:
    """{parameter name: value} of every flag of an options object, its nested option groups included."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if "flag" in f.metadata:
            out[flag_key(f)] = value
        elif dataclasses.is_dataclass(value):
            out.update(flag_values(value))
    return out


MODEL_HELP = "Hugging Face id, local directory, or served model name."


def _shown(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def agent_flag(name: str) -> Any:
    """The optional flag of AgentConfig's field `name`: that field's rule (or its `cli_rule`, the flag's own) and
    help, declared once, in memagent.config; None: the profile's value."""
    f = next(f for f in dataclasses.fields(AgentConfig) if f.name == name)
    return field(default=None, metadata={**f.metadata, **f.metadata.get("cli_rule", {}), **flag(
        f"{f.metadata['cli']} (default: the profile's, {_shown(f.default)}).")})


@dataclass(frozen=True)
class BudgetOptions:
    """The token budgets of the read-write loop."""

    chunk_tokens: Optional[int] = agent_flag("chunk_tokens")
    memory_tokens: Optional[int] = agent_flag("memory_tokens")
    answer_tokens: Optional[int] = agent_flag("answer_tokens")
    query_tokens: Optional[int] = agent_flag("query_tokens")


@dataclass(frozen=True)
class SamplingOptions:
    """How replies are sampled."""

    temperature: Optional[float] = agent_flag("temperature")
    top_p: Optional[float] = agent_flag("top_p")
    seed: Optional[int] = agent_flag("seed")

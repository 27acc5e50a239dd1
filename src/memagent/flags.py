"""Checks of command-line values where they enter: counts, finite numbers, names, devices.

`check_flags(values)` takes a command's parsed options ({parameter name: value}) and refuses
nonsense with an `InputError` naming the flag: a negative or zero count, a NaN or infinite
temperature or timeout, an unknown dtype, a device this machine does not have. The rules are keyed
by parameter name, so every command that has a `--samples` checks it the same way.

The options `ask`, `eval` and `serve` share are one type per concern: `BudgetOptions` and `SamplingOptions` are
made from AgentConfig's own fields (their type, rule and help declared once, in memagent.config); the backend's
are `memagent.backends.options.BackendOptions`. Each field that is a command-line option carries its help in
`flag(...)` metadata, and the CLI turns those fields into options.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Mapping, Optional

from memagent.config import AgentConfig, ConfigError, check_value, hints_of, optional_inner
from memagent.errors import InputError

POSITIVE_INTS = ("samples", "repeats", "limit", "window", "batch_docs", "max_concurrency", "passage_tokens", "tensor_parallel", "keys", "values", "slots")
NON_NEGATIVE_INTS = ("seed", "max_retries", "facts")
POSITIVE_FLOATS = ("request_timeout",)
CHOICES = {
    "backend": ("transformers", "openai", "vllm"),
    "filter_backend": ("transformers", "openai", "vllm"),
    "dtype": ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"),
    "errors": ("strict", "replace"),
}
DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
# Upper bounds of the sizes a flag can ask for, each with its reason: past them a run never finishes or fills
# the disk (`eval --repeats 10**9`, `data toy --chunks 10**9`). A list flag (--chunks 4,16) checks each value.
MAXIMA: dict[str, tuple[int, str]] = {
    "samples": (1_000_000, "samples per length (the paper's test sets have 128; its training set 32,768)"),
    "repeats": (1_000, "repeats of every sample (the paper reports the mean of a few)"),
    "chunks": (100_000, "chunks per toy document (the paper's longest document, 3.5M tokens, is 700 chunks of "
               "5,000)"),
    "tokens": (4_000_000, "context tokens per sample (the paper's longest context is 3.5M tokens)"),
    "num_docs": (1_000_000, "paragraphs per sample (the paper's longest RULER-HQA context has 25,600)"),
}


def flag_name(param: str) -> str:
    return "--" + param.replace("_", "-")


def check_flags(values: Mapping[str, Any]) -> None:
    """Raise InputError for the first option value in `values` that breaks its rule; None values are unset."""
    for name, value in values.items():
        if isinstance(value, (list, tuple)) and name in MAXIMA:  # a parsed list flag: each value
            for item in value:
                check_flags({name: item})
            continue
        if value is None or isinstance(value, bool):
            continue
        flag = flag_name(name)
        if name in MAXIMA and isinstance(value, int) and value > MAXIMA[name][0]:
            limit, why = MAXIMA[name]
            raise InputError(f"{flag} {value} is over the limit of {limit:,} {why}; ask for less")
        if name in POSITIVE_INTS and value <= 0:
            raise InputError(f"{flag} must be a positive integer, got {value}")
        if name in NON_NEGATIVE_INTS and value < 0:
            raise InputError(f"{flag} must be >= 0, got {value}")
        if name == "seed" and value >= 2**32:
            raise InputError(f"{flag} must be below 2**32 (NumPy's limit), got {value}")
        if name in FIELD_RULES:  # a flag made from a config field: the field's own rule
            try:
                check_value(flag, value, *FIELD_RULES[name])
            except ConfigError as e:
                raise InputError(str(e)) from None
        if name in POSITIVE_FLOATS and not (math.isfinite(value) and value > 0):
            raise InputError(f"{flag} must be a finite number of seconds > 0, got {value}")
        if name in CHOICES and value not in CHOICES[name]:
            raise InputError(f"unknown {name.replace('_', ' ')} {value!r} ({flag}); choose one of: "
                             f"{', '.join(CHOICES[name])}")
        if name == "device":
            check_device(value, flag)


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


def check_options(options: Any) -> None:
    """InputError for the first flag field of `options` (nested option groups included) whose value breaks the
    rule declared beside it (`memagent.config.rule` metadata), named by its flag."""
    hints = hints_of(type(options))
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if "flag" in f.metadata and f.metadata.get("rule") and value is not None:
            try:
                check_value(flag_decls(f)[0].split("/")[0], value, f.metadata["rule"],
                            optional_inner(hints[f.name]) is int)
            except ConfigError as e:
                raise InputError(str(e)) from None
        elif dataclasses.is_dataclass(value):
            check_options(value)


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


def _agent_flags(name: str, sections: tuple[str, ...], doc: str) -> type:
    """Option type `name`: one optional flag per AgentConfig field of `sections` that has a `cli` help, with
    that field's type, rule and help (declared once, in memagent.config); None: the profile's value."""
    hints = hints_of(AgentConfig)
    own = [(f.name, Optional[hints[f.name]], field(default=None, metadata={**f.metadata, **flag(
        f"{f.metadata['cli']} (default: the profile's, {_shown(f.default)}).")}))
        for f in dataclasses.fields(AgentConfig) if f.metadata.get("section") in sections and f.metadata.get("cli")]
    return dataclasses.make_dataclass(name, own, frozen=True, namespace={"__doc__": doc, "__module__": __name__})


BudgetOptions = _agent_flags("BudgetOptions", ("budgets",), "The token budgets of the read-write loop.")
SamplingOptions = _agent_flags("SamplingOptions", ("sampling",), "How replies are sampled.")
# flag name -> (its rule, whether an integer): the rules of the flags made from AgentConfig's fields
FIELD_RULES = {f.name: (f.metadata["rule"], optional_inner(hints_of(cls)[f.name]) is int)
               for cls in (BudgetOptions, SamplingOptions) for f in dataclasses.fields(cls) if f.metadata.get("rule")}

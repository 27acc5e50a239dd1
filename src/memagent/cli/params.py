"""Typer commands made from an options type: each field with `memagent.flags.flag` metadata becomes one
command-line option (its name, type, default and help come from the field), nested option groups included
(`BackendOptions`, `BudgetOptions`, `SamplingOptions`), so a flag shared by `ask`, `eval` and `serve` is
declared once."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Annotated, Any, Callable, Iterator

import typer

from memagent.flags import flag_decls, flag_key

def flag_fields(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """(field, its type) of every flag field of the dataclass `cls`, in field order, nested option groups
    expanded."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if "flag" in f.metadata:
            yield f, kind
        elif dataclasses.is_dataclass(kind):
            yield from flag_fields(kind)


def _default(f: dataclasses.Field) -> Any:
    """The option's default: the field's (a parsed list as its text), or none for a required option."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return inspect.Parameter.empty  # a required option
    return ",".join(value) if f.metadata["flag"]["parse"] and isinstance(value, list) else value


def _parameter(f: dataclasses.Field, kind: Any) -> inspect.Parameter:
    meta = f.metadata["flag"]
    cli_type = str if meta["parse"] else kind  # a parsed field is given as text
    return inspect.Parameter(flag_key(f), inspect.Parameter.KEYWORD_ONLY, default=_default(f),
                             annotation=Annotated[cli_type, typer.Option(*flag_decls(f), help=meta["help"])])


def _build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of `cls` from the parsed options ({parameter name: value}), groups rebuilt."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if "flag" in f.metadata:
            value, parse = values[flag_key(f)], f.metadata["flag"]["parse"]
            kwargs[f.name] = parse(value, flag_decls(f)[0]) if parse else value
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], values)
    return cls(**kwargs)


def options_command(cls: type) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """Decorator: `fn(options)` becomes a typer callback taking one option per flag field of `cls`."""

    def wrap(fn: Callable[[Any], Any]) -> Callable[..., Any]:
        params = [_parameter(f, kind) for f, kind in flag_fields(cls)]
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise TypeError(f"{cls.__name__}: two flags share a name in {names}")

        @functools.wraps(fn)
        def command(**values: Any) -> Any:
            return fn(_build(cls, values))

        del command.__wrapped__  # typer reads the signature below, not fn's
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap

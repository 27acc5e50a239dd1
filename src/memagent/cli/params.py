"""Typer commands made from an options type: each field with `memagent.flags.flag` metadata becomes one
command-line option (its name, type, default and help come from the field), nested option groups included
(`BackendOptions`, `BudgetOptions`, `SamplingOptions`), so a flag shared by `ask`, `eval` and `serve` is
declared once, and so is its rule (`memagent.config.rule` metadata beside the field, checked by
`memagent.flags.check_options` when the command runs).

A path option (a field typed `Path` or `Optional[Path]`) is taken as text and made a Path by
`memagent.io.given_path`, so an empty one (`--state-dir ""`) is refused instead of meaning the working folder
(typer's own Path conversion turns "" into ".")."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import typer

from memagent.flags import check_options, flag_decls, flag_key
from memagent.io import given_path

_PATH_TYPES = (Path, Optional[Path])


def _is_path(kind: Any) -> bool:
    return kind in _PATH_TYPES

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
    if isinstance(value, Path):
        return str(value)
    return ",".join(value) if f.metadata["flag"]["parse"] and isinstance(value, list) else value


def _parameter(f: dataclasses.Field, kind: Any) -> inspect.Parameter:
    meta = f.metadata["flag"]
    cli_type = str if meta["parse"] else kind  # a parsed field is given as text
    if _is_path(kind):  # as text, checked by given_path in _build
        cli_type = str if kind is Path else Optional[str]
    param = (typer.Argument(help=meta["help"], metavar=flag_decls(f)[0]) if meta.get("argument")
             else typer.Option(*flag_decls(f), help=meta["help"]))
    return inspect.Parameter(flag_key(f), inspect.Parameter.KEYWORD_ONLY, default=_default(f),
                             annotation=Annotated[cli_type, param])


def _build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of `cls` from the parsed options ({parameter name: value}), groups rebuilt."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if "flag" in f.metadata:
            value, parse = values[flag_key(f)], f.metadata["flag"]["parse"]
            if _is_path(hints[f.name]) and not parse:
                value = given_path(value, flag_decls(f)[0].split("/")[0])
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
            options = _build(cls, values)
            if not getattr(cls, "checks_itself", False):  # ask's, eval's, serve's options checked as they were built
                check_options(options)  # each flag's rule, declared beside its field
            return fn(options)

        del command.__wrapped__  # typer reads the signature below, not fn's
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.options_type = cls  # type: ignore[attr-defined]  # what the command's options come from
        return command

    return wrap

"""One loader for nested configuration dataclasses: YAML text, plain mappings and `key=value` overrides.

A configuration is a dataclass whose fields are values or further dataclasses (its sections). Each field
declares its own rule beside itself, as `dataclasses.field` metadata made by `memagent.config.rule(...)`:

    chunk_tokens: int = field(default=5000, metadata=rule(min=1, section="budgets"))
    agg: str = field(default="token-mean", metadata=rule(choices=AGG_MODES))

`build(cls, data)` makes `cls` from a nested mapping: unknown keys are refused with the list of valid ones,
every value must have its field's type (an int is a float; "1e-6", which YAML 1.1 reads as text, is a
float too; numbers are finite), a section given as a mapping updates its `base` (the defaults), and the
class's own `__post_init__` checks the rest, calling `memagent.config.check_fields(self, where)` for the
declared rules: the one place they are checked. `parse_overrides(["loss.kl_coef=0"], cls)` turns overrides into the same
nested mapping (values read as YAML), the later override winning.

Two short spellings are declared on the fields they serve, not in a table:
- a section with a field marked `rule(..., scalar=True)` may be written as that field's value alone
  (`data: FILE` for `data: {path: FILE}`);
- a value field marked `rule(..., options="SECTION")` may be written as a mapping holding `path` (the value
  itself) and the keys of SECTION (`model: {path: ID, cpu_offload: true}` for `model: ID` and
  `model_options: {cpu_offload: true}`); those keys win over the same keys written in SECTION itself.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from memagent.bounded import load_yaml
from memagent.config import ConfigError, check_fields, hints_of, key_of, optional_inner, rule
from memagent.errors import MemAgentError

__all__ = ["ConfigError", "build", "check_fields", "coerce", "deep_merge", "load_mapping", "parse_override",
           "parse_overrides", "rule", "copy_field", "spell_out", "to_dict"]


def copy_field(source: type, name: str) -> Any:
    """Field `name` of the dataclass `source` for another dataclass: its default and metadata (rule, section,
    help: declared once, in `source`); the new class writes out the field's type."""
    f = next(f for f in dataclasses.fields(source) if f.name == name)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _scalar_field(cls: type) -> str | None:
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get("scalar")), None)


def deep_merge(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`base` updated by `new`, section by section (a mapping in both is merged, anything else replaced)."""
    merged = dict(base)
    for k, v in new.items():
        merged[k] = deep_merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def spell_out(cls: type, data: Any) -> Any:
    """`data` with the short spellings declared on `cls`'s fields written in full (see the module docstring)."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(cls):
        return data
    hints, fields = hints_of(cls), _fields(cls)
    out = dict(data)
    for name, value in data.items():
        f = fields.get(name) if isinstance(name, str) else None
        if f is None:
            continue
        section = f.metadata.get("options")
        kind = optional_inner(hints[name])
        if section and isinstance(value, dict):
            rest = {k: v for k, v in value.items() if k != "path"}
            if "path" in value:
                out[name] = value["path"]
            else:
                del out[name]
            written = out.get(section, {})
            out[section] = deep_merge(written, rest) if isinstance(written, dict) else written
        elif dataclasses.is_dataclass(kind) and not isinstance(value, (dict, list)) and value is not None \
                and not dataclasses.is_dataclass(value) and _scalar_field(kind):
            out[name] = {_scalar_field(kind): value}
        elif dataclasses.is_dataclass(kind):
            out[name] = spell_out(kind, out[name])  # out[name]: the short spelling of another field may be in it
    return out


def build(cls: type, data: Any, base: Any = None, where: str = "") -> Any:
    """An instance of dataclass `cls`: `base` (default: `cls()`) with the settings of mapping `data` applied."""
    base = cls() if base is None else base
    if data is None:
        return base
    fields = _fields(cls)
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'the configuration'} must be a mapping of {', '.join(fields)}; "
                          f"got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(key_of(where, k) for k in unknown)}; valid keys"
                          f"{' of ' + where if where else ''}: {', '.join(fields)}")
    hints = hints_of(cls)
    values = {name: coerce(hints[name], value, key_of(where, name), getattr(base, name, None))
              for name, value in data.items()}
    try:
        return dataclasses.replace(base, **values)
    except ConfigError:
        raise
    except (MemAgentError, TypeError) as e:  # a section's own error type (e.g. eval's ScoringError)
        raise ConfigError(f"{where + ': ' if where and isinstance(e, TypeError) else ''}{e}") from None


def coerce(tp: Any, value: Any, key: str, base: Any = None) -> Any:
    """`value` as type `tp` (the field `key`), or ConfigError saying what the field takes."""
    inner = optional_inner(tp)
    if value is None:
        if inner is not tp or tp is Any:
            return None
        if typing.get_origin(tp) is dict:
            return {}
        raise ConfigError(f"{key} must not be null")
    tp = inner
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        return build(tp, value, base if dataclasses.is_dataclass(base) else None, key)
    if typing.get_origin(tp) is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{key} must be a mapping of names to values, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
    elif tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    elif tp is float:
        return _number(value, key)
    elif tp is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value)  # also "1e-6", which YAML 1.1 reads as a string
    except (ValueError, OverflowError):
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return number


def parse_override(item: str) -> dict[str, Any]:
    """'loss.clip_high=0.2' -> {'loss': {'clip_high': 0.2}} (the value read as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not key=value (dotted keys for nested fields, e.g. loss.kl_coef=0)")
    if any(not p.strip() for p in key.split(".")):
        raise ConfigError(f"override {item!r}: the key has an empty part; e.g. loss.kl_coef=0")
    shown = item if len(item) <= 80 else item[:60] + "..."
    value: Any = load_yaml(raw, f"override {shown!r}: the value", ConfigError) if raw.strip() else ""
    for part in reversed(key.strip().split(".")):
        value = {part: value}
    return value


def parse_overrides(overrides: list[str], cls: type | None = None) -> dict[str, Any]:
    """The nested mapping of `key=value` overrides, short spellings of `cls` written in full; later ones win."""
    out: dict[str, Any] = {}
    for item in overrides:
        new = spell_out(cls, parse_override(item)) if cls is not None else parse_override(item)
        _check_conflict(out, new, item)
        out = deep_merge(out, new)
    return out


def _check_conflict(old: dict[str, Any], new: dict[str, Any], item: str, path: str = "") -> None:
    for k, v in new.items():
        if isinstance(v, dict) and k in old and not isinstance(old[k], dict):
            raise ConfigError(f"override {item!r} conflicts with an earlier override of {path + str(k)}")
        if isinstance(v, dict) and isinstance(old.get(k), dict):
            _check_conflict(old[k], v, item, f"{path}{k}.")


def load_mapping(text: str, where: str, what: str) -> dict[str, Any]:
    """The mapping in YAML `text` (bounded: memagent.bounded.load_yaml); an empty text is {}."""
    data = load_yaml(text, where, ConfigError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a YAML mapping of {what} (key: value lines), got a {type(data).__name__}")
    return data


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, JSON-able dict of a (nested) config dataclass."""
    return dataclasses.asdict(cfg)

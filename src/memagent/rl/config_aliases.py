"""Short spellings of TrainConfig keys, one table for the YAML file and the `key=value` overrides.

    written        means                  when
    data           data.path              the value is a string: `data=FILE`, `data: FILE` (beside data.max_chunks)
    model.path     model                  always: YAML `model: {path: ID, ...}`, override `model.path=ID`
    model.KEY...   model_options.KEY...   always: the model's loading options share its name
                                          (`model.gradient_checkpointing=true`, YAML `model: {cpu_offload: true}`)

In YAML an aliased entry wins over the same key written out in full (`model: {cpu_offload: true}` over
`model_options: {cpu_offload: false}`); among overrides, the later one wins.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeyAlias:
    """`written` (a trailing "*" matches one or more further parts) stands for `means` (its "*": those parts)."""

    written: tuple[str, ...]
    means: tuple[str, ...]
    str_only: bool = False  # only for a string value


KEY_ALIASES: tuple[KeyAlias, ...] = (  # the first match applies
    KeyAlias(("data",), ("data", "path"), str_only=True),
    KeyAlias(("model", "path"), ("model",)),
    KeyAlias(("model", "*"), ("model_options", "*")),
)


def canonical_key(parts: list[str], value: Any) -> list[str]:
    """The TrainConfig key that the dotted key `parts` (set to `value`) stands for: `parts` unless aliased."""
    for alias in KEY_ALIASES:
        if alias.str_only and not isinstance(value, str):
            continue
        if alias.written[-1] == "*":
            head = alias.written[:-1]
            if len(parts) > len(head) and tuple(parts[: len(head)]) == head:
                return [*alias.means[:-1], *parts[len(head):]]
        elif tuple(parts) == alias.written:
            return list(alias.means)
    return parts


def canonical_mapping(data: dict[str, Any]) -> dict[str, Any]:
    """A YAML mapping with its aliased entries rewritten: its top-level keys, and the keys one level down
    in a section that an alias reaches into (`model: {...}`)."""
    sections = {a.written[0] for a in KEY_ALIASES if len(a.written) > 1}
    plain: dict[str, Any] = {}
    aliased: dict[str, Any] = {}
    for key, value in data.items():
        nested = key in sections and isinstance(value, dict)
        for parts, v in ([([key, str(k)], x) for k, x in value.items()] if nested else [([key], value)]):
            canon = canonical_key(parts, v)
            if canon == parts and not nested:
                plain[key] = v
            else:
                aliased = deep_merge(aliased, nest(canon, v))
    return deep_merge(plain, aliased)


def nest(parts: list[str], value: Any) -> dict[str, Any]:
    """['a', 'b'], 1 -> {'a': {'b': 1}}."""
    out: Any = value
    for p in reversed(parts):
        out = {p: out}
    return out


def deep_merge(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`base` updated by `new`, section by section (a mapping in both is merged, anything else replaced)."""
    merged = dict(base)
    for k, v in new.items():
        merged[k] = deep_merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged

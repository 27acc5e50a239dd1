"""Plug-ins by name: what the workflow registry (memagent.agent.registry) and the reward registry
(memagent.rewards.registry) share. Each keeps factories registered in this process and reads its entry-point
group once, on first need; `import_target` imports a "module:attribute.path" as both registries name their
built-ins and entry points."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable


class Registry:
    """The factories of one kind of plug-in (`what`: "workflow", "reward") registered in this process, and the
    installed entry points of `group`, read once."""

    def __init__(self, group: str, what: str) -> None:
        self.group, self.what = group, what
        self.factories: dict[str, Callable[..., Any]] = {}
        self.entry_points: dict[str, Any] | None = None  # name -> EntryPoint, read on first need

    def installed(self) -> dict[str, Any]:
        if self.entry_points is None:
            self.entry_points = {ep.name: ep for ep in entry_points(group=self.group)}
        return self.entry_points

    def refresh(self) -> None:
        """Read the installed entry points again on the next lookup (a package installed in a running process)."""
        self.entry_points = None

    def register(self, name: str, factory: Callable[..., Any]) -> None:
        """Make `factory` the plug-in called `name` (it replaces a built-in or entry point of that name). Names are
        words: letters, digits, '-', '_'."""
        if not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{self.what} name must be a word of letters, digits, '-' or '_', got {name!r}")
        if not callable(factory):
            raise TypeError(f"{self.what} {name!r}: the factory must be callable, got {type(factory).__name__}")
        self.factories[name] = factory

    def unregister(self, name: str) -> None:
        self.factories.pop(name, None)


def import_target(target: str) -> Any:
    """The object "module:attribute.path" names (ImportError or AttributeError when it is not there)."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj

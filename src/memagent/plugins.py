"""Plug-ins by name: the one lookup of workflows (memagent.agent.registry), rewards (memagent.rewards.registry) and
backends (memagent.backends). Each kind keeps its built-ins (named by "module:attribute", imported when asked for),
the factories registered in this process, and the entry points of its group, read once on first need.

One error policy for the three: an unknown name is the kind's `unknown` error listing the valid names; a plug-in
(or a built-in) that fails as it is imported, or is not callable, is one `fault` error naming it and its target."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable


def is_plugin(obj: Any) -> bool:
    """Whether `obj` is a third party's (defined outside the memagent package): its faults are reported as its own."""
    module = getattr(obj, "__module__", None) or ""
    return module != "memagent" and not module.startswith("memagent.")


def short_error(exc: BaseException) -> str:
    """"Type: message" on one line, at most 300 characters of message."""
    text = str(exc).replace("\n", " ")[:300]
    return f"{type(exc).__name__}{': ' + text if text else ''}"


def import_target(target: str) -> Any:
    """The object "module:attribute.path" names (ImportError or AttributeError when it is not there)."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


class Registry:
    """The plug-ins of one kind (`what`: "workflow", "reward", "backend"). `builtins` maps a name to
    "module:attribute" or to a factory; `names()` lists every valid name in the kind's order."""

    def __init__(self, group: str, what: str, builtins: dict[str, Any], names: Callable[[], list[str]],
                 unknown: type[Exception], fault: type[Exception]) -> None:
        self.group, self.what, self.builtins, self.names = group, what, builtins, names
        self.unknown, self.fault = unknown, fault
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

    def get(self, name: str) -> Callable[..., Any]:
        """The factory of `name`: registered in this process, else built in, else an installed entry point."""
        if name in self.factories:
            return self.factories[name]
        if name in self.builtins:
            target = self.builtins[name]
            return target if callable(target) else self._load(name, target, "built-in")
        ep = self.installed().get(name)
        if ep is None:
            raise self.unknown(f"unknown {self.what} {name!r}; valid {self.what}s: {', '.join(self.names())}")
        return self._load(name, ep.value, f"entry point {ep.group}")

    def _load(self, name: str, target: str, where: str) -> Callable[..., Any]:
        what = f"{self.what} {name!r} ({where}, {target})"
        fix = ("install what it needs" if where == "built-in" else
               "this is a fault of the plug-in, not of memagent: fix or uninstall it")
        try:
            obj = import_target(target)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a plug-in that breaks (or exits) as it is imported
            raise self.fault(f"{what} failed as it was imported: {short_error(exc)}; {fix}, or choose another "
                             f"{self.what}") from None
        if not callable(obj):
            raise self.fault(f"{what} is not callable; {fix}, or choose another {self.what}")
        return obj

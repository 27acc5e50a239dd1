"""The shape of the package: its import graph has no cycle and respects the layers; files and functions stay small.

Every module of `src/memagent` is parsed with `ast` (nothing is imported). Every import counts, wherever it
is written: module level, inside a function, under `if TYPE_CHECKING:`. `from . import x` and `from ..a import b`
are resolved against the importing module; `from memagent.p import name` is an arrow to `memagent.p.name` when
that is a module, else to `memagent.p`. Importing `memagent.p.q` is an arrow to `memagent.p.q` only (the package's
`__init__` runs too, but an `__init__` that re-exports its own submodules is no cycle worth reporting). In a
module that calls `import_module` or `__import__`, every string constant that is exactly a module's dotted name
counts as an arrow too (lazy export tables such as `memagent.rl.__init__`'s).

The layers, lowest first. A module may import from its own layer and from lower-ranked ones; two layers of
the same rank (`rl` and `eval`) may not import each other.

    rank  layer     modules
    0     base      errors, config, io, jsonl, lock, progress, flags, bounded, text, agent.prompts (the paper's
                    templates, the config's defaults), timeline/* (the memory timeline's rows and its HTML
                    report), the package `memagent` itself (leaf helpers: each imports at most other base modules)
    1     backends  backends/*                   the model Protocol and its implementations, tokenizer loading
    2     agent     agent/*                      chunking, the read-write loop, workflows, answer extraction
    3     tasks     tasks/*                      samples, data synthesis, released formats, metrics
    4     rl        rl/*                         training
    4     eval      eval/*, profile, protocol/*, scale/*
                                                 running the agent over inputs and scoring it; the protocol
                                                 profile and its resolution (protocol/resolve), which every
                                                 command (ask, eval, serve, the harnesses) resolves settings by
    5     demo      demo/*                       the toy experiment: trains (rl) and evaluates (eval)
    6     app       cli (module or package), ask/*, serve/*, harness/* (lm-eval, Inspect AI)
                                                 commands, their drivers (`ask`) and the HTTP service: they
                                                 wire everything; nothing below imports them

`PLACES` maps a module (or package prefix, longest wins) to its layer; a new module outside every prefix fails
`test_every_module_has_a_layer` until it is placed here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "memagent"

RANKS = {"base": 0, "backends": 1, "agent": 2, "tasks": 3, "rl": 4, "eval": 4, "demo": 5, "app": 6}
PLACES = {
    "memagent": "base",  # the package __init__ (only __version__); longer prefixes below win
    **{f"memagent.{m}": "base" for m in ("errors", "config", "io", "jsonl", "lock", "progress", "flags", "timeline")},
    "memagent.backends": "backends",
    "memagent.agent": "agent",
    "memagent.agent.prompts": "base",  # the paper's templates, AgentConfig's defaults: imports nothing of memagent
    "memagent.tasks": "tasks",
    "memagent.rl": "rl",
    **{f"memagent.{m}": "eval" for m in ("eval", "profile", "protocol", "scale")},
    "memagent.demo": "demo",
    **{f"memagent.{m}": "app" for m in ("cli", "serve", "ask", "harness")},
}

MAX_FILE_LINES = 600  # issue 25: split where a seam is, not at a count
MAX_FUNCTION_LINES = 60

Graph = dict[str, set[str]]  # module -> the memagent modules it imports


# -- the checker: pure functions over a source tree or a graph -------------------------------------------------
def module_files(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package) for every .py under `root` (a package directory)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known: set[str], top: str) -> set[str]:
    """The modules of package `top` that one import statement of `module` reaches."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name == top or a.name.startswith(top + ".")}
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target != top and not target.startswith(top + "."):
        return set()
    return {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}


def import_graph(root: Path) -> Graph:
    """Every module of the package at `root` -> the package's modules it imports (all imports, any depth)."""
    files = module_files(root)
    known = set(files)
    graph: Graph = {}
    for module, (path, is_pkg) in files.items():
        deps: set[str] = set()
        names: set[str] = set()  # string constants that name one of the package's modules
        dynamic = False  # the module calls import_module / __import__
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _targets(node, module, is_pkg, known, root.name)
            elif isinstance(node, ast.Constant) and node.value in known:
                names.add(node.value)
            elif isinstance(node, ast.Call):
                func = node.func
                dynamic |= getattr(func, "id", getattr(func, "attr", None)) in ("import_module", "__import__")
        graph[module] = (deps | (names if dynamic else set())) - {module}
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def find_cycles(graph: Graph) -> list[list[str]]:
    """One shortest cycle [a, b, ..., a] through the first module of each strongly connected component."""
    return [_cycle_in(graph, comp) for comp in strongly_connected(graph)]


def _cycle_in(graph: Graph, comp: list[str]) -> list[str]:
    """A shortest cycle through the first module of a strongly connected component (breadth-first)."""
    start, members = comp[0], set(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w in members and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # cannot happen for a strongly connected component


def layer_of(module: str, places: dict[str, str]) -> str | None:
    """The layer of the longest prefix of `module` in `places` (None when no prefix is placed)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in places:
            return places[".".join(parts[:n])]
    return None


def layer_violations(graph: Graph, places: dict[str, str], ranks: dict[str, int]) -> list[tuple[str, str, str]]:
    """(importer, imported, why) for each arrow into a higher layer or into a sibling layer of equal rank."""
    out = []
    for src in sorted(graph):
        a = layer_of(src, places)
        for dst in sorted(graph[src]):
            b = layer_of(dst, places)
            if a is None or b is None or a == b:
                continue
            if ranks[b] > ranks[a]:
                out.append((src, dst, f"{a} (rank {ranks[a]}) imports the higher layer {b} (rank {ranks[b]})"))
            elif ranks[b] == ranks[a]:
                out.append((src, dst, f"{a} and {b} are sibling layers (rank {ranks[a]}); neither imports the other"))
    return out


def report(graph: Graph) -> str:
    """Every cycle (with the modules of its strongly connected component) and every layer violation."""
    lines = ["import cycles:"]
    for comp, cycle in zip(strongly_connected(graph), find_cycles(graph)):
        lines.append(f"  {' -> '.join(cycle)}   (entangled: {', '.join(comp)})")
    lines += ["layer violations:"] + [f"  {s} -> {d}: {why}" for s, d, why in layer_violations(graph, PLACES, RANKS)]
    return "\n".join(lines)


# -- the package ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(SRC)


def test_every_module_has_a_layer(graph):
    unplaced = [m for m in graph if layer_of(m, PLACES) is None]
    assert not unplaced, f"place these modules in PLACES of {__file__}: {unplaced}"


def test_no_cycle_and_no_upward_import(graph):
    assert not find_cycles(graph) and not layer_violations(graph, PLACES, RANKS), report(graph)


def test_errors_and_config_are_leaves(graph):
    assert graph["memagent.errors"] == set()
    assert graph["memagent.agent.prompts"] == set()  # the paper's templates: the config's defaults
    assert graph["memagent.config"] <= {"memagent.errors", "memagent.agent.prompts"}


# -- the checker fails on what it must catch --------------------------------------------------------------------
def test_checker_finds_a_cycle_and_names_it():
    g = {"memagent.tasks.a": {"memagent.tasks.b"}, "memagent.tasks.b": {"memagent.tasks.c"},
         "memagent.tasks.c": {"memagent.tasks.a", "memagent.errors"}, "memagent.errors": set(),
         "memagent.x": {"memagent.y"}, "memagent.y": {"memagent.x"}}
    assert find_cycles(g) == [["memagent.tasks.a", "memagent.tasks.b", "memagent.tasks.c", "memagent.tasks.a"],
                              ["memagent.x", "memagent.y", "memagent.x"]]
    g["memagent.tasks.c"] = {"memagent.errors"}  # the cycle broken
    assert find_cycles(g) == [["memagent.x", "memagent.y", "memagent.x"]]


def test_checker_finds_upward_and_sibling_imports():
    g = {"memagent.config": {"memagent.agent.workflow"}, "memagent.agent.workflow": {"memagent.errors"},
         "memagent.rl.trainer": {"memagent.eval.records", "memagent.tasks.schema"},
         "memagent.tasks.schema": {"memagent.backends.tokenizer"}, "memagent.cli": {"memagent.demo.pipeline"}}
    found = [(s, d) for s, d, _ in layer_violations(g, PLACES, RANKS)]
    assert found == [("memagent.config", "memagent.agent.workflow"), ("memagent.rl.trainer", "memagent.eval.records")]
    why = dict(((s, d), w) for s, d, w in layer_violations(g, PLACES, RANKS))
    assert why[("memagent.config", "memagent.agent.workflow")] == "base (rank 0) imports the higher layer agent (rank 2)"
    assert "sibling" in why[("memagent.rl.trainer", "memagent.eval.records")]


def test_an_arrow_added_to_the_package_graph_is_caught(graph):
    cycle = dict(graph)
    cycle["memagent.agent.chunking"] = cycle["memagent.agent.chunking"] | {"memagent.agent.workflow"}
    assert find_cycles(cycle) == [["memagent.agent.chunking", "memagent.agent.workflow", "memagent.agent.chunking"]]
    upward = dict(graph)
    upward["memagent.backends.hf"] = upward["memagent.backends.hf"] | {"memagent.tasks.metrics"}
    assert [(s, d) for s, d, _ in layer_violations(upward, PLACES, RANKS)] == [
        ("memagent.backends.hf", "memagent.tasks.metrics")]


def test_parser_counts_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "memagent"
    (pkg / "tasks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("import os\n")
    (pkg / "lazy.py").write_text("from importlib import import_module\nTABLE = {'x': 'memagent.errors'}\n"
                                 "NOT_A_MODULE = 'memagent.nothing'\ndef get(n):\n    return import_module(TABLE[n])\n")
    (pkg / "tasks" / "__init__.py").write_text("from . import schema\n")
    (pkg / "tasks" / "schema.py").write_text(
        "from ..errors import X\n"
        "def f():\n    from memagent.tasks import corpora\n    import memagent.agent.workflow as w\n")
    (pkg / "tasks" / "corpora.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .schema import Y\nfrom memagent import errors\n")
    g = import_graph(pkg)
    assert g == {"memagent": set(), "memagent.errors": set(), "memagent.lazy": {"memagent.errors"},
                 "memagent.tasks": {"memagent.tasks.schema"},
                 "memagent.tasks.schema": {"memagent.errors", "memagent.tasks.corpora", "memagent.agent.workflow"},
                 "memagent.tasks.corpora": {"memagent.tasks.schema", "memagent.errors"}}
    assert find_cycles(g) == [["memagent.tasks.corpora", "memagent.tasks.schema", "memagent.tasks.corpora"]]


# -- size -------------------------------------------------------------------------------------------------------
def oversized(root: Path, max_file: int, max_function: int) -> list[str]:
    """Files over `max_file` lines and functions (def to last line, nested ones counted alone) over `max_function`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent)
        if len(text.splitlines()) > max_file:
            out.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > max_function:
                    out.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return out


def test_size_checker_counts_lines(tmp_path):
    pkg = tmp_path / "memagent"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n" + "    x = 1\n" * 4 + "\n\ndef g():\n    pass\n")
    assert oversized(pkg, 10, 5) == []
    assert oversized(pkg, 7, 4) == ["memagent/a.py: 9 lines", "memagent/a.py:1 f: 5 lines"]


def test_no_file_over_600_lines_no_function_over_60():
    found = oversized(SRC, MAX_FILE_LINES, MAX_FUNCTION_LINES)
    assert not found, "\n".join(found)

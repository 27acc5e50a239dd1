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
                    report), documents/* (PDF, HTML, EPUB readers), the package `memagent` itself (leaf helpers: each imports at most other base modules)
    1     backends  backends/*                   the model Protocol and its implementations, tokenizer loading
    2     agent     agent/*                      chunking, the read-write loop, workflows, answer extraction
    3     tasks     tasks/*                      samples, data synthesis, released formats, metrics
    4     rl        rl/*                         training
    4     eval      eval/*, protocol/* (the profile, its resolution, the official reference)
                                                 running the agent over inputs and scoring it; the protocol
                                                 profile and its resolution (protocol/resolve), which every
                                                 command (ask, eval, serve, the harnesses) resolves settings by
    5     scale     scale/*                      the same runs over Ray actors: the sweep's RayExecutor (eval's
                                                 Executor protocol), the ask driver's shards; its flag
                                                 declarations (scale.options) are base: every command reads them
    6     demo      demo/*                       the toy experiment: trains (rl) and evaluates (eval)
    7     app       cli (module or package), ask/*, serve/*, harness/* (lm-eval, Inspect AI)
                                                 commands, their drivers (`ask`) and the HTTP service: they
                                                 wire everything; nothing below imports them

`PLACES` maps a module (or package prefix, longest wins) to its layer; a new module outside every prefix fails
`test_every_module_has_a_layer` until it is placed here.

Imports (issue 25): no module imports an underscore name of another (`from memagent.x import _y`, `from . import
_y`): make it public or move it. An import inside a function is allowed only for a package of `LAZY_PACKAGES`
(heavy to import or optional, each with its reason), marked on the statement: `import torch  # lazy: torch`. A
third-party import must name its own package; a memagent module imported lazily must import that package when it
is imported (itself, a package `__init__` above it, or a module they import at top level, transitively; checked
with `ast`). At most `MAX_LAZY_MEMAGENT` function-level imports of memagent modules. scripts/import_scan.py is an
independent scan of the same tree (JSON); `test_the_independent_scan_agrees_with_the_checker` compares the two.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "memagent"

RANKS = {"base": 0, "backends": 1, "agent": 2, "tasks": 3, "rl": 4, "eval": 4, "scale": 5, "demo": 6, "app": 7}
PLACES = {
    "memagent": "base",  # the package __init__ (only __version__); longer prefixes below win
    **{f"memagent.{m}": "base" for m in ("errors", "config", "io", "jsonl", "lock", "progress", "flags", "timeline",
                                        "sections", "documents")},
    "memagent.backends": "backends",
    "memagent.agent": "agent",
    "memagent.agent.prompts": "base",  # the paper's templates, AgentConfig's defaults: imports nothing of memagent
    "memagent.tasks": "tasks",
    "memagent.rewards": "tasks",  # the Reward protocol, its registry and built-ins: on the metrics, below rl and eval
    "memagent.rl": "rl",
    **{f"memagent.{m}": "eval" for m in ("eval", "protocol")},
    "memagent.scale": "scale",
    "memagent.scale.options": "base",  # the --ray flags and the worker plan: imports only errors and flags
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


# -- imports inside functions and imports of private names (issue 25) -------------------------------------------
# A function-level import is allowed only for a package below, named by a trailing `# lazy: PKG` marker; each is
# heavy to import or optional (an extra of pyproject.toml), so a command that does not need it never pays for it.
LAZY_PACKAGES = {
    "gguf": "optional (extra `gguf`): only reading a GGUF file (memagent model import, --model FILE.gguf)",
    "fcntl": "POSIX only: the owner lock of temp index folders (Windows has none, and no folder is taken as dead)",
    "torch": "1-2 s to import and CUDA set-up; only training and the transformers backend use it",
    "transformers": "2-3 s to import (pulls torch); only model loading and tokenizers need it",
    "tokenizers": "Rust extension; only building the tiny/toy tokenizers",
    "safetensors": "only reading and writing model weights",
    "peft": "optional (extra `lora`)",
    "vllm": "optional (extra `vllm`), imports torch and CUDA",
    "ray": "optional (extra `ray`)",
    "fastapi": "optional (extra `serve`)",
    "starlette": "optional (extra `serve`, under fastapi)",
    "uvicorn": "optional (extra `serve`)",
    "httpx": "the HTTP client under the openai backend; only when a server is called",
    "openai": "0.6-0.9 s to import (measured: its types and aiohttp); only when a server is called",
    "matplotlib": "about 0.5 s to import; only when a PNG is drawn",
    "numpy": "only the synthesis steps and plots that compute with arrays",
    "yaml": "only when a YAML config or profile is read",
    "lm_eval": "optional (extra `harness`)",
    "inspect_ai": "optional (extra `harness`)",
    "playwright": "optional (dev: page screenshots)",
    "tensorboard": "optional (extra `tensorboard`)",
    "wandb": "optional (extra `wandb`)",
    "jinja2": "only when a chat template is rendered",
    "datasets": "optional (extra `bench`): Hugging Face datasets as corpora",
    "rouge_score": "2.7 s to import (measured: nltk, absl); only the LongBench ROUGE metrics",
    "pyarrow": "0.24 s to import (measured); only when a released .parquet file is read",
    "bm25s": "0.35 s to import (measured, scipy); only the RAG-BM25 baseline",
    "python_multipart": "optional (extra `serve`): streamed multipart uploads",
    "pypdf": "optional (extra `documents`): PDF documents",
    "ebooklib": "optional (extra `documents`): EPUB documents",
}
MAX_LAZY_MEMAGENT = 35  # function-level imports of memagent modules (each for one of the packages above)
LAZY_MARK = re.compile(r"#\s*lazy:\s*([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class FunctionImport:
    """One import statement inside a def: where, what it imports, and its `# lazy:` marker (None: none)."""

    module: str
    line: int
    text: str  # the statement's first line, stripped
    memagent: tuple[str, ...]  # the memagent modules it imports (empty for a third-party or standard one)
    packages: tuple[str, ...]  # the top-level packages it imports otherwise
    marker: str | None


def _walk_imports(tree: ast.AST, in_def: bool = False, typing_only: bool = False) -> Iterator[tuple[ast.AST, bool, bool]]:
    """(import node, inside a def, under `if TYPE_CHECKING:`) for every import of `tree`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_def, typing_only
            continue
        is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        checking = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if checking:
            yield from _walk_block(node.body, in_def, True)
            yield from _walk_block(node.orelse, in_def, typing_only)
        else:
            yield from _walk_imports(node, in_def or is_def, typing_only)


def _walk_block(body: list[ast.stmt], in_def: bool, typing_only: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
    for stmt in body:
        yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), in_def, typing_only)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known: set[str], top: str
              ) -> tuple[set[str], set[str]]:
    """(the modules of package `top` an import reaches, the other top-level packages it imports)."""
    ours = _targets(node, module, is_pkg, known, top)
    if isinstance(node, ast.Import):
        others = {a.name.split(".")[0] for a in node.names} - {top}
    else:
        others = set() if node.level or ours else {(node.module or "").split(".")[0]}
    return ours, others


def function_imports(root: Path) -> list[FunctionImport]:
    """Every import statement inside a def of the package at `root`, in file order."""
    files = module_files(root)
    known = set(files)
    out = []
    for module, (path, is_pkg) in files.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node, in_def, _ in _walk_imports(ast.parse(text, filename=str(path))):
            if not in_def:
                continue
            ours, others = _imported(node, module, is_pkg, known, root.name)
            marks = [m.group(1) for ln in lines[node.lineno - 1:node.end_lineno] for m in LAZY_MARK.finditer(ln)]
            out.append(FunctionImport(module, node.lineno, lines[node.lineno - 1].strip(), tuple(sorted(ours)),
                                      tuple(sorted(others)), marks[-1] if marks else None))
    return out


def top_level_imports(root: Path) -> dict[str, tuple[set[str], set[str]]]:
    """Module -> (the package's modules, the other top-level packages) it imports when it is imported: every
    import outside a def, except those under `if TYPE_CHECKING:`."""
    files = module_files(root)
    known = set(files)
    out = {}
    for module, (path, is_pkg) in files.items():
        ours: set[str] = set()
        others: set[str] = set()
        for node, in_def, typing_only in _walk_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not in_def and not typing_only:
                o, t = _imported(node, module, is_pkg, known, root.name)
                ours |= o
                others |= t
        out[module] = (ours - {module}, others)
    return out


def reaches(module: str, package: str, tops: dict[str, tuple[set[str], set[str]]]) -> bool:
    """Whether importing `module` imports `package` at import time: it (or a package `__init__` above it, or a
    module they import at top level, transitively) imports `package` at top level."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for parent in (".".join(parts[:n]) for n in range(len(parts), 0, -1)):
            if parent in seen or parent not in tops:
                continue
            seen.add(parent)
            ours, others = tops[parent]
            if package in others:
                return True
            todo.extend(ours)
    return False


def lazy_import_problems(root: Path, allowed: dict[str, str] = LAZY_PACKAGES) -> list[str]:
    """Each function-level import that is not marked `# lazy: PKG`, names a PKG outside `allowed`, imports a
    third-party package other than PKG, or imports a memagent module that does not reach PKG at import time."""
    tops = top_level_imports(root)
    out = []
    for fi in function_imports(root):
        where = f"{fi.module}:{fi.line} `{fi.text}`"
        if fi.marker is None:
            out.append(f"{where}: an import inside a function; move it to the top (or mark a heavy or optional "
                       "package: `# lazy: PKG`, PKG in LAZY_PACKAGES)")
        elif fi.marker not in allowed:
            out.append(f"{where}: `# lazy: {fi.marker}` names a package that is not heavy or optional; move the "
                       "import to the top (or declare the package in LAZY_PACKAGES with its reason)")
        elif fi.packages and set(fi.packages) != {fi.marker}:
            out.append(f"{where}: imports {', '.join(fi.packages)} but is marked `# lazy: {fi.marker}`")
        elif fi.memagent and not any(reaches(m, fi.marker, tops) for m in fi.memagent):
            out.append(f"{where}: marked `# lazy: {fi.marker}` but {', '.join(fi.memagent)} does not import "
                       f"{fi.marker} when imported; move the import to the top")
    return out


def lazy_memagent_imports(root: Path) -> list[str]:
    """The function-level imports of the package's own modules, one line each."""
    return [f"{fi.module}:{fi.line} `{fi.text}`" for fi in function_imports(root) if fi.memagent]


def underscore_imports(root: Path) -> list[str]:
    """Each import of an underscore name (not a dunder) from another module of the package, at any depth:
    `from memagent.x import _y`, `from . import _y`, `import memagent._x`."""
    files = module_files(root)
    known = set(files)
    private = lambda name: name.startswith("_") and not name.endswith("__")  # noqa: E731
    out = []
    for module, (path, is_pkg) in files.items():
        text = path.read_text(encoding="utf-8")
        for node, _, _ in _walk_imports(ast.parse(text, filename=str(path))):
            if not _targets(node, module, is_pkg, known, root.name) - {module}:
                continue
            if isinstance(node, ast.Import):
                names = [p for a in node.names for p in a.name.split(".")[1:]]
            else:  # the names, and the parts of the module path below the package (all of a relative one)
                path_parts = (node.module or "").split(".")
                names = [a.name for a in node.names] + (path_parts if node.level else path_parts[1:])
            for name in filter(private, names):
                out.append(f"{module}:{node.lineno} imports {name} (`{text.splitlines()[node.lineno - 1].strip()}`)")
    return out


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


# -- imports inside functions and of private names -------------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "memagent"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_lazy_checker_passes_marked_imports_and_fails_unmarked_or_wrong_ones(tmp_path):
    pkg = _tree(tmp_path, {
        "heavy.py": "import torch\n",  # imports torch at top level
        "via.py": "from memagent import heavy\n",  # reaches torch through heavy
        "light.py": "import json\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
        "ok.py": "def f():\n    import torch  # lazy: torch\n    from vllm import LLM  # lazy: vllm\n"
                 "    from memagent.via import x  # lazy: torch\n    from . import heavy  # lazy: torch\n"
                 "    from transformers import (A,\n        B)  # lazy: transformers\n",
        "bad.py": "class C:\n    def m(self):\n        import json\n"  # unmarked (standard library too)
                  "def g():\n    import torch  # lazy: vllm\n"  # the wrong package
                  "    import json  # lazy: json\n"  # a package that is not heavy
                  "    from memagent.light import y  # lazy: torch\n"  # light does not import torch at run time
                  "    from memagent.heavy import z\n",  # unmarked memagent import
    })
    problems = lazy_import_problems(pkg)
    assert [p.split(" `")[0] for p in problems] == [
        "memagent.bad:3", "memagent.bad:5", "memagent.bad:6", "memagent.bad:7", "memagent.bad:8"]
    assert "move it to the top" in problems[0] and "imports torch but is marked `# lazy: vllm`" in problems[1]
    assert "not heavy or optional" in problems[2] and "memagent.light does not import torch" in problems[3]
    assert lazy_memagent_imports(pkg) == ["memagent.bad:7 `from memagent.light import y  # lazy: torch`",
                                          "memagent.bad:8 `from memagent.heavy import z`",
                                          "memagent.ok:4 `from memagent.via import x  # lazy: torch`",
                                          "memagent.ok:5 `from . import heavy  # lazy: torch`"]
    tops = top_level_imports(pkg)
    assert reaches("memagent.via", "torch", tops) and not reaches("memagent.light", "torch", tops)
    only_torch = lazy_import_problems(pkg, {"torch": "heavy"})  # vllm and transformers undeclared: not allowed
    assert [p.split(" `")[0] for p in only_torch if p.startswith("memagent.ok")] == ["memagent.ok:3", "memagent.ok:6"]


def test_underscore_checker_finds_private_names_from_other_modules(tmp_path):
    pkg = _tree(tmp_path, {
        "a.py": "_x = 1\n__all__ = []\ny = 2\n",
        "sub/__init__.py": "",
        "sub/_private.py": "",
        "sub/b.py": "from memagent.a import y, __all__\nfrom memagent.a import y as _y\nimport httpx as _h\n"
                    "from os import _exit\n",  # public names under private aliases, a third-party private name
        "sub/c.py": "from memagent.a import _x\ndef f():\n    from .. import a as _a\n    from . import _private\n"
                    "from ._private import q\nimport memagent.sub._private\n",
    })
    assert underscore_imports(pkg) == [
        "memagent.sub.c:1 imports _x (`from memagent.a import _x`)",
        "memagent.sub.c:4 imports _private (`from . import _private`)",
        "memagent.sub.c:5 imports _private (`from ._private import q`)",
        "memagent.sub.c:6 imports _private (`import memagent.sub._private`)"]


def test_no_import_of_an_underscore_name_across_modules():
    found = underscore_imports(SRC)
    assert not found, "make these names public or move them:\n" + "\n".join(found)


def test_function_level_imports_only_for_heavy_or_optional_packages():
    found = lazy_import_problems(SRC)
    assert not found, f"{len(found)} function-level imports:\n" + "\n".join(found)


def test_at_most_35_function_level_memagent_imports():
    found = lazy_memagent_imports(SRC)
    assert len(found) <= MAX_LAZY_MEMAGENT, f"{len(found)} function-level memagent imports:\n" + "\n".join(found)


def test_the_independent_scan_agrees_with_the_checker(graph):
    """scripts/import_scan.py walks the tree itself: its counts equal this checker's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("import_scan", SRC.parents[1] / "scripts" / "import_scan.py")
    scan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scan)
    out = scan.scan(SRC, Path(__file__))
    assert out["modules"] == len(graph) and out["arrows"] == sum(len(v) for v in graph.values())
    assert out["cycles"] == strongly_connected(graph)
    assert len(out["upward"]) == len(layer_violations(graph, PLACES, RANKS))
    assert len(out["underscore_imports"]) == len(underscore_imports(SRC))
    assert out["lazy_memagent"]["count"] == len(lazy_memagent_imports(SRC))
    assert sum(out["lazy_by_reason"].values()) == len(function_imports(SRC))

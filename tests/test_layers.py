"""The shape of the package: its import rules and the size of its files and functions.

The import rules are import-linter's contracts in pyproject.toml ([tool.importlinter]): the layers (a module
imports only its own layer and those below; rl and eval independent; a module in no layer fails), no cycle
between packages or modules, and the modules that may import torch at module level. `test_import_contracts`
runs them (`lint-imports`); `test_a_planted_upward_import_breaks_the_contracts` shows they fail on a copy of the
tree with an upward import and a module in no layer.

What import-linter cannot see stays here, checked with `ast` (nothing is imported): an import inside a function
is allowed only for a package of `LAZY_PACKAGES` (heavy to import or optional, each with its reason), marked on
the statement: `import torch  # lazy: torch`; a third-party import must name its own package; a memagent module
imported lazily must import that package when it is imported (itself, a package `__init__` above it, or a module
they import at top level, transitively). At most `MAX_LAZY_MEMAGENT` function-level imports of memagent modules.
No module imports an underscore name of another (`from memagent.x import _y`): make it public or move it.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SRC = Path(__file__).resolve().parents[1] / "src" / "memagent"
PYPROJECT = SRC.parents[1] / "pyproject.toml"

MAX_FILE_LINES = 600  # issue 25: split where a seam is, not at a count
MAX_FUNCTION_LINES = 60


def lint_imports(src: Path = SRC.parent) -> subprocess.CompletedProcess:
    """import-linter over the package found in `src` (a folder holding `memagent/`), pyproject.toml's contracts."""
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
                           "--no-cache", str(PYPROJECT)], capture_output=True, text=True, env=env, timeout=300)


def test_import_contracts():
    run = lint_imports()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 3 kept, 0 broken." in run.stdout


def test_a_planted_upward_import_breaks_the_contracts(tmp_path):
    tree = tmp_path / "src" / "memagent"
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tree / "agent" / "chunking.py", "a", encoding="utf-8") as f:
        f.write("\nfrom memagent.eval import sweep  # planted: agent imports the eval layer above it\n")
    run = lint_imports(tmp_path / "src")
    assert run.returncode == 1 and "Contracts: 1 kept, 2 broken." in run.stdout, run.stdout + run.stderr
    assert "memagent.agent is not allowed to import memagent.eval" in run.stdout  # the layers
    assert "- .agent -> .eval (1 import)" in run.stdout  # and a cycle: eval imports agent
    assert "memagent.agent.chunking -> memagent.eval.sweep" in run.stdout
    (tree / "agent" / "chunking.py").write_text((SRC / "agent" / "chunking.py").read_text(encoding="utf-8"))
    (tree / "newpkg.py").write_text("")  # a module in no layer
    run = lint_imports(tmp_path / "src")
    assert run.returncode == 1 and "memagent.newpkg" in run.stdout, run.stdout + run.stderr


# -- the checker: pure functions over a source tree ------------------------------------------------------------
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


# -- imports inside functions and imports of private names (issue 25) -------------------------------------------
# A function-level import is allowed only for a package below, named by a trailing `# lazy: PKG` marker; each is
# heavy to import or optional (an extra of pyproject.toml), so a command that does not need it never pays for it.
LAZY_PACKAGES = {
    "gguf": "optional (extra `gguf`): only reading a GGUF file (memagent model import, --model FILE.gguf)",
    "fcntl": "POSIX only: the owner lock of temp index folders (Windows has none, and no folder is taken as dead)",
    "pypdf": "optional (extra `documents`): only reading a PDF",
    "ebooklib": "optional (extra `documents`): only reading an EPUB",
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

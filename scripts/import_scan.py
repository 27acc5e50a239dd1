"""An import scan of src/memagent, independent of tests/test_layers.py's checker (its own `ast` walk; only the
layer table, RANKS and PLACES, is read from that file, as data): prints one JSON object.

    python scripts/import_scan.py [--src src/memagent] [--layers tests/test_layers.py] [--full]

    modules_per_package  modules (files) per package; top-level modules of memagent count under "memagent"
    arrows               distinct module -> module imports inside memagent (any depth, TYPE_CHECKING too)
    cycles               strongly connected groups of more than one module
    upward               arrows into a higher layer, or between two layers of the same rank
    underscore_imports   imports of an underscore name (not a dunder) from another memagent module
    lazy_by_reason       imports inside a def, counted by their `# lazy: PKG` marker ("unmarked": none)
    lazy_memagent        of those, the imports of memagent modules (count, and by marker)

Lists are given in full with --full, else their counts and the first few entries.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"#\s*lazy:\s*([A-Za-z_][A-Za-z0-9_]*)")
SHOW = 10  # entries of each list shown without --full


def modules(src: Path) -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (path, pkg)
    return out


def resolve(node: ast.ImportFrom, name: str, pkg: bool) -> str:
    """The absolute module path of a `from X import ...` in module `name`."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if pkg else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def scan_module(name: str, path: Path, pkg: bool, known: set[str]) -> dict:
    """The imports of one module: arrows, underscore names, function-level imports with their markers."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    in_def: set[int] = set()  # ids of import nodes inside a def
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_def.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    arrows, private, lazy = set(), [], []
    dynamic = any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None))
                  in ("import_module", "__import__") for n in ast.walk(tree))
    for node in ast.walk(tree):
        if dynamic and isinstance(node, ast.Constant) and node.value in known:
            arrows.add(node.value)
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == "memagent"]
            hidden = [p for t in targets for p in t.split(".")[1:]]
        else:
            mod = resolve(node, name, pkg)
            ours = mod.split(".")[0] == "memagent"
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names] if ours else []
            hidden = ([a.name for a in node.names] + mod.split(".")[1:]) if ours else []
        arrows.update(t for t in targets if t != name)
        if targets and set(targets) != {name}:
            private += [f"{name}:{node.lineno} {h}" for h in hidden if h.startswith("_") and not h.endswith("__")]
        if id(node) in in_def:
            marks = [m.group(1) for ln in lines[node.lineno - 1:node.end_lineno] for m in MARK.finditer(ln)]
            lazy.append(dict(where=f"{name}:{node.lineno}", text=lines[node.lineno - 1].strip(),
                             marker=marks[-1] if marks else None, memagent=bool(targets)))
    return dict(arrows=arrows, private=private, lazy=lazy)


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def layer_table(path: Path) -> tuple[dict[str, int], dict[str, str]]:
    """RANKS and PLACES of tests/test_layers.py: only those two assignments are evaluated (data, no checker)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    ns: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in ("RANKS", "PLACES") for t in node.targets):
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), ns)  # noqa: S102
    return ns["RANKS"], ns["PLACES"]


def layer(module: str, places: dict[str, str]) -> str | None:
    parts = module.split(".")
    return next((places[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in places), None)


def scan(src: Path, layers: Path) -> dict:
    files = modules(src)
    known = set(files)
    per = {m: scan_module(m, p, pkg, known) for m, (p, pkg) in files.items()}
    graph = {m: r["arrows"] for m, r in per.items()}
    ranks, places = layer_table(layers)
    upward = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer(a, places), layer(b, places)
            if la and lb and la != lb and ranks[lb] >= ranks[la]:
                upward.append(f"{a} ({la}) -> {b} ({lb})")
    lazy = [x for r in per.values() for x in r["lazy"]]
    mem = [x for x in lazy if x["memagent"]]

    def package(m: str) -> str:  # memagent.agent.workflow and memagent.agent (its __init__) -> agent
        parts = m.split(".")
        return parts[1] if len(parts) >= 3 or (len(parts) == 2 and files[m][1]) else "memagent"

    return dict(
        modules=len(files),
        modules_per_package=dict(sorted(Counter(package(m) for m in files).items())),
        arrows=sum(len(v) for v in graph.values()),
        cycles=sccs(graph),
        upward=upward,
        underscore_imports=[x for r in per.values() for x in r["private"]],
        lazy_by_reason=dict(sorted(Counter(x["marker"] or "unmarked" for x in lazy).items())),
        lazy_memagent=dict(count=len(mem), by_reason=dict(sorted(Counter(x["marker"] or "unmarked" for x in mem).items())),
                           imports=[f"{x['where']} {x['text']}" for x in mem]),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src" / "memagent")
    ap.add_argument("--layers", type=Path, default=ROOT / "tests" / "test_layers.py")
    ap.add_argument("--full", action="store_true", help="every entry of every list")
    args = ap.parse_args(argv)
    out = scan(args.src, args.layers)
    if not args.full:
        for key in ("cycles", "upward", "underscore_imports"):
            out[key] = dict(count=len(out[key]), first=out[key][:SHOW])
        out["lazy_memagent"]["imports"] = out["lazy_memagent"]["imports"][:SHOW]
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

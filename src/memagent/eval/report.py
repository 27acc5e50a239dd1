"""Results of a sweep as the paper shows them: Table 1 (rows model + method, columns lengths, cells
mean score in % ± its standard error, with n) and a plot of score against length (log x), one of each per task.
With `cost` each row also shows the model calls and seconds per document (means over its finished records), so
workflows (memagent, lookup, skim, ...) compare on cost beside accuracy. `split_by` (a record tag, e.g. a two-hop
sample's `order`) splits each row by that tag's value ("memagent (order=value-first)").

Only the last record of each key counts (a retried failure replaces its error record), and `keys` limits
the table to one run's records (a results file also holds the records of earlier settings). Failed samples
count as the score their record holds: 0 ("wrong") or nothing (None, "skip"); each table says how many failed.
Names from data and options (task, model, method) are escaped: they cannot inject Markdown or HTML.
"""
from __future__ import annotations

import html
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Collection, Iterable

from memagent.eval.records import atomic_write_lines, latest, load_records
from memagent.eval.scoring import cell_stats

__all__ = ["aggregate", "length_label", "markdown_tables", "md_escape", "plot_scores", "read_records",
           "write_report"]

_METHOD_ORDER = {"memagent": 0, "lookup": 1, "skim": 2, "full-context": 7, "rag-bm25": 8}  # other workflows: 5
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]#+!|~])")


def md_escape(text: Any) -> str:
    """`text` safe inside a Markdown table cell or heading: HTML escaped, Markdown punctuation backslashed,
    line breaks folded to spaces."""
    flat = " ".join(str(text).split())
    return _MD_SPECIAL.sub(r"\\\1", html.escape(flat, quote=False))


def read_records(path: str | Path) -> list[dict]:
    """The last record of each key of a results file."""
    return list(latest(load_records(path)).values())


def _length_key(n: int | None) -> tuple[int, int]:
    return (1, 0) if n is None else (0, n)


def aggregate(records: Iterable[dict], keys: Collection[str] | None = None,
              split_by: str | None = None) -> dict[str, Any]:
    """{task: {"metric", "unit", "lengths", "rows": {(model, method): {length: (mean, se, n)}},
    "failed": {(model, method): count}, "cost": {(model, method): (calls, seconds) per document}, "skipped": bool}};
    mean/se None when nothing counts (n < 2 for se)."""
    cells: dict[tuple, list[float | None]] = defaultdict(list)
    costs: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    failed: dict[tuple, int] = defaultdict(int)
    meta: dict[str, dict[str, Any]] = {}
    wanted = set(keys) if keys is not None else None
    chosen = [r for r in latest(records).values() if wanted is None or r["key"] in wanted]
    labels = _split_labels(chosen, _method_labels(chosen), split_by)
    for r in chosen:
        length = r.get("length")
        cells[(r["task"], r["model"], labels[r["key"]], length)].append(r["score"])
        if r.get("status") != "error":
            costs[(r["task"], r["model"], labels[r["key"]])].append(
                (float((r.get("tokens") or {}).get("calls", 0)), float(r.get("seconds") or 0.0)))
        m = meta.setdefault(r["task"], {"metric": r["metric"], "unit": r["length_unit"], "lengths": set(),
                                        "skipped": False})
        m["lengths"].add(length)
        if r.get("status") == "error":
            failed[(r["task"], r["model"], labels[r["key"]])] += 1
            m["skipped"] |= r["score"] is None
    out: dict[str, Any] = {}
    for task in sorted(meta):
        rows: dict[tuple[str, str], dict[int | None, tuple]] = {}
        for (t, model, method, length), scores in cells.items():
            if t == task:
                rows.setdefault((model, method), {})[length] = cell_stats(scores)
        ordered = dict(sorted(rows.items(), key=lambda kv: (kv[0][0], _METHOD_ORDER.get(kv[0][1].split(" ")[0], 5),
                                                           kv[0][1])))
        out[task] = dict(metric=meta[task]["metric"], unit=meta[task]["unit"],
                         lengths=sorted(meta[task]["lengths"], key=_length_key), rows=ordered,
                         failed={row: failed[(task, *row)] for row in ordered if failed[(task, *row)]},
                         cost={row: _means(costs[(task, *row)]) for row in ordered},
                         skipped=meta[task]["skipped"])
    return out


def _means(pairs: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    if not pairs:
        return None, None
    return sum(c for c, _ in pairs) / len(pairs), sum(t for _, t in pairs) / len(pairs)


def _split_labels(records: list[dict], labels: dict[str, str], split_by: str | None) -> dict[str, str]:
    """Row labels with the record's `split_by` tag appended ("(order=value-first)"; "(order=?)" without it)."""
    if not split_by:
        return labels
    return {r["key"]: f"{labels[r['key']]} ({split_by}={(r.get('tags') or {}).get(split_by, '?')})" for r in records}


def _method_labels(records: list[dict]) -> dict[str, str]:
    """Each record's row label: its method, with its settings fingerprint when one (model, method) holds
    records of several settings (then they are never averaged together)."""
    fps: dict[tuple, set] = defaultdict(set)
    for r in records:
        fps[(r["model"], r["method"])].add(r.get("fingerprint"))
    return {r["key"]: r["method"] if len(fps[(r["model"], r["method"])]) == 1 else
            f"{r['method']} @{str(r.get('fingerprint'))[:8]}" for r in records}


def length_label(length: int | None, unit: str) -> str:
    if length is None:
        return "all"
    if unit in ("docs", "chunks"):
        return f"{length} {unit}"
    if length % 1048576 == 0:
        return f"{length // 1048576}M"
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


def _cell(stats: tuple[float | None, float | None, int]) -> str:
    mean, se, n = stats
    if mean is None:
        return f"n/a (n={n})"
    if se is None:
        return f"{100 * mean:.2f} (n={n})"
    return f"{100 * mean:.2f} ± {100 * se:.2f} (n={n})"


def markdown_tables(agg: dict[str, Any], cost: bool = False) -> str:
    """One markdown table per task in the layout of the paper's Table 1; `cost`: with the columns calls/doc and
    s/doc (model calls and seconds per document, means over the row's finished records: they compare workflows;
    seconds vary run to run, so a table without them is reproducible to the byte)."""
    parts = []
    for task, t in agg.items():
        cols = [length_label(n, t["unit"]) for n in t["lengths"]] + (["calls/doc", "s/doc"] if cost else [])
        lines = [f"### {md_escape(task)} ({md_escape(t['metric'])}, %)", "",
                 "| model | method | " + " | ".join(cols) + " |",
                 "|---|---|" + "---|" * len(cols)]
        for (model, method), cells in t["rows"].items():
            vals = [_cell(cells[n]) if n in cells else "n/a" for n in t["lengths"]]
            if cost:
                calls, secs = t.get("cost", {}).get((model, method), (None, None))
                vals += ["n/a" if calls is None else f"{calls:.1f}", "n/a" if secs is None else f"{secs:.3f}"]
            lines.append(f"| {md_escape(model)} | {md_escape(method)} | " + " | ".join(vals) + " |")
        lines += ["", "cells: mean ± standard error (n records scored)" + (
            "; calls/doc, s/doc: model calls and seconds per document (all lengths, finished records)" if cost else "")]
        if t["failed"]:
            how = "left out of the means" if t["skipped"] else "counted as wrong"
            counts = ", ".join(f"{md_escape(method)} {k}" for (_, method), k in t["failed"].items())
            lines.append(f"failed samples ({how}): {counts}")
        lines.append("")
        parts.append("\n".join(lines))
    return "\n".join(parts)


def plot_scores(agg: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """A PNG per task with a length column: score (%) against length, log x, one line per model + method,
    with a bar of one standard error each way."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    paths = []
    for task, t in agg.items():
        lengths = [n for n in t["lengths"] if n is not None and n > 0]
        if not lengths:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (model, method), cells in t["rows"].items():
            xs = [n for n in lengths if n in cells and cells[n][0] is not None]
            err = [100 * (cells[n][1] or 0.0) for n in xs]  # one standard error each way
            ax.errorbar(xs, [100 * cells[n][0] for n in xs], yerr=err, marker="o", capsize=3,
                        label=_plain(f"{Path(model).name} {method}"))
        ax.set_xscale("log")
        ax.set_xticks(lengths, [length_label(n, t["unit"]) for n in lengths], rotation=30)
        ax.minorticks_off()
        ax.set_ylim(-2, 102)
        ax.set_xlabel({"docs": "documents", "chunks": "chunks"}.get(t["unit"], "context tokens"))
        ax.set_ylabel(_plain(f"{t['metric']} (%)"))
        ax.set_title(_plain(f"{task}: score against length"))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(out_dir) / f"scores_{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _plain(text: str) -> str:
    """Text matplotlib shows as is ($ would start mathtext)."""
    return text.replace("$", r"\$")


def write_report(results: str | Path | Iterable[dict], out_dir: str | Path, keys: Collection[str] | None = None,
                 split_by: str | None = None, cost: bool = False) -> tuple[str, Path, list[Path]]:
    """Write table.md (atomically) and the plots from a results file, or its records read already (only `keys`'
    records when given; rows split by the record tag `split_by` when given; `cost`: calls/doc and s/doc columns);
    returns (markdown, table path, plots)."""
    agg = aggregate(load_records(results) if isinstance(results, (str, Path)) else results, keys, split_by)
    text = markdown_tables(agg, cost)
    table = atomic_write_lines(Path(out_dir) / "table.md", [text])
    return text, table, plot_scores(agg, out_dir)

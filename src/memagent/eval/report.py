"""Results of a sweep as the paper shows them: Table 1 (rows model + method, columns lengths,
cells mean score in %) and a plot of score against length (log x), one of each per task."""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

__all__ = ["aggregate", "markdown_tables", "plot_scores", "write_report"]

_METHOD_ORDER = {"memagent": 0, "full-context": 1, "rag-bm25": 2}


def read_records(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def aggregate(records: Iterable[dict]) -> dict[str, Any]:
    """{task: {"metric", "unit", "lengths", "rows": {(model, method): {length: (mean, n)}}}}."""
    sums: dict[tuple, list[float]] = defaultdict(list)
    meta: dict[str, dict[str, Any]] = {}
    for r in records:
        sums[(r["task"], r["model"], r["method"], r["length"])].append(float(r["score"]))
        meta.setdefault(r["task"], {"metric": r["metric"], "unit": r["length_unit"], "lengths": set()})
        meta[r["task"]]["lengths"].add(r["length"])
    out: dict[str, Any] = {}
    for task in sorted(meta):
        rows: dict[tuple[str, str], dict[int, tuple[float, int]]] = {}
        for (t, model, method, length), scores in sums.items():
            if t == task:
                rows.setdefault((model, method), {})[length] = (sum(scores) / len(scores), len(scores))
        ordered = dict(sorted(rows.items(), key=lambda kv: (kv[0][0], _METHOD_ORDER.get(kv[0][1], 9), kv[0][1])))
        out[task] = dict(metric=meta[task]["metric"], unit=meta[task]["unit"],
                         lengths=sorted(meta[task]["lengths"]), rows=ordered)
    return out


def length_label(length: int, unit: str) -> str:
    if unit == "docs":
        return f"{length} docs"
    if length % 1048576 == 0:
        return f"{length // 1048576}M"
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


def markdown_tables(agg: dict[str, Any]) -> str:
    """One markdown table per task in the layout of the paper's Table 1."""
    parts = []
    for task, t in agg.items():
        cols = [length_label(n, t["unit"]) for n in t["lengths"]]
        lines = [f"### {task} ({t['metric']}, %)", "",
                 "| model | method | " + " | ".join(cols) + " |",
                 "|---|---|" + "---|" * len(cols)]
        counts = set()
        for (model, method), cells in t["rows"].items():
            vals = []
            for n in t["lengths"]:
                if n in cells:
                    vals.append(f"{100 * cells[n][0]:.2f}")
                    counts.add(cells[n][1])
                else:
                    vals.append("n/a")
            lines.append(f"| {model} | {method} | " + " | ".join(vals) + " |")
        span = f"{min(counts)}" if len(counts) == 1 else f"{min(counts)}-{max(counts)} (incomplete)"
        lines += ["", f"samples per cell: {span}", ""]
        parts.append("\n".join(lines))
    return "\n".join(parts)


def plot_scores(agg: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """A PNG per task: score (%) against length, log x, one line per model + method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for task, t in agg.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (model, method), cells in t["rows"].items():
            xs = [n for n in t["lengths"] if n in cells]
            ax.plot(xs, [100 * cells[n][0] for n in xs], marker="o", label=f"{Path(model).name} {method}")
        ax.set_xscale("log")
        ax.set_xticks(t["lengths"], [length_label(n, t["unit"]) for n in t["lengths"]], rotation=30)
        ax.minorticks_off()
        ax.set_ylim(-2, 102)
        ax.set_xlabel("documents" if t["unit"] == "docs" else "context tokens")
        ax.set_ylabel(f"{t['metric']} (%)")
        ax.set_title(f"{task}: score against length")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(out_dir) / f"scores_{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(results: str | Path, out_dir: str | Path) -> tuple[str, Path, list[Path]]:
    """Write table.md (atomically) and the plots from a results file; returns (markdown, table path, plots)."""
    agg = aggregate(read_records(results))
    text = markdown_tables(agg)
    table = Path(out_dir) / "table.md"
    tmp = table.with_name("table.md.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, table)
    return text, table, plot_scores(agg, out_dir)

"""The demo's table (the layout of the paper's Table 1) and its plot of accuracy against length."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from memagent.demo.failures import toy_key_order


def accuracy_rows(results: dict[str, Any], cfg: Any) -> tuple[str, list[tuple[str, str]], list[list[str]]]:
    """(title, (multiple, length) of each length column, rows of cells: method first) of the accuracy table,
    shared by the terminal and markdown forms."""
    mults = list(next(iter(results["accuracy"].values())).keys())
    title = f"toy QA accuracy (%), seed {results['seed']}; chance {100 * results['chance']:.0f}%"
    columns = [(f"{m}x", f"{int(m) * cfg.train_chunks} chunks") for m in mults]
    rows = [[method, *[f"{100 * row[m]:.1f}" for m in mults]] for method, row in results["accuracy"].items()]
    return title, columns, rows


def print_table(results: dict[str, Any], cfg: Any) -> None:
    title, columns, rows = accuracy_rows(results, cfg)
    t = Table(title=title)
    t.add_column("method", no_wrap=True, min_width=14)
    for mult, length in columns:  # "16x" over "64 chunks"
        t.add_column(f"{mult}\n{length}", justify="right", no_wrap=True)
    for row in rows:
        t.add_row(*row)
    Console().print(t)
    Console().print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items()))
    if results.get("numerics"):  # demo/numerics.py: what decides the float sums
        n = results["numerics"]
        Console().print(f"float kernels: MKL branch {n['mkl_cbwr'] or 'MKL default'}, ATen {n['aten_cpu_capability']}, "
                        f"{n['threads']} thread(s)")


def markdown_table(results: dict[str, Any], cfg: Any) -> str:
    """The same table as GitHub markdown (written to results.md next to results.json)."""
    title, columns, rows = accuracy_rows(results, cfg)
    lines = [title, "", "| method | " + " | ".join(f"{m} ({n})" for m, n in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if results.get("update_errors"):  # demo/diagnose.py: one memory update at a time, greedy
        lines += ["", "per-step errors (%): keep = the memory holds the answer, write = the chunk does, ignore = "
                  "neither (claimed: the new memory names the asked key anyway)", "",
                  "| method | keep: value lost | keep: took the chunk's value | write into empty: missed "
                  "| write over another fact: missed | ignore, empty memory: claimed | ignore, other fact: claimed |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for method, e in results["update_errors"].items():
            cells = (e["keep"]["value_lost"], e["keep"]["took_chunk_value"], e["write_empty"]["missed"],
                     e["write_over"]["missed"], e["ignore_empty"]["claimed"], e["ignore_other"]["claimed"])
            lines.append(f"| {method} | " + " | ".join(f"{100 * c:.1f}" for c in cells) + " |")
    for mult, kinds in (results.get("failures") or {}).items():  # demo/failures.py
        lines += ["", f"memagent-rl documents at {mult}x, by where they broke: "
                  + ", ".join(f"{k} {v}" for k, v in kinds.items())]
    if results.get("by_key"):  # demo/failures.py: a key the model takes for another stands out
        keys = toy_key_order({k for accs in results["by_key"].values() for k in accs})
        lines += ["", "memagent-rl accuracy (%) by asked key", "", "| length | " + " | ".join(keys) + " |",
                  "|---|" + "---:|" * len(keys)]
        for mult, accs in results["by_key"].items():
            lines.append(f"| {mult}x | " + " | ".join(f"{100 * accs[k]:.0f}" if k in accs else "-" for k in keys) + " |")
    lines += ["", "seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items())]
    return "\n".join(lines) + "\n"


def plot_accuracy(results: dict[str, Any], cfg: Any, path: Path) -> Path:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, ax = plt.subplots(figsize=(6, 4))
    for method, row in results["accuracy"].items():
        xs = [int(m) * cfg.train_chunks for m in row]
        ax.plot(xs, [100 * v for v in row.values()], marker="o", label=method)
    ax.axhline(100 * results["chance"], color="grey", linestyle=":", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("document length (chunks)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(f"memagent demo (seed {results['seed']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_results(out: Path, results: dict[str, Any], table: dict[str, Any], cfg: Any, task: str = "",
                  more: Sequence[str] = ()) -> dict[str, Any]:
    """A demo run's report, returning `results`: results.json (`results`), results.md (the table of `table`, its
    title naming `task`, then the lines `more`), the table printed, and accuracy.png."""
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown_table(table, cfg)
    if task:
        text = text.replace("toy QA", f"{task} toy QA", 1)
    (out / "results.md").write_text(text + ("\n".join(more) + "\n" if more else ""))
    print_table(table, cfg)
    plot_accuracy(table, cfg, out / "accuracy.png")
    return results

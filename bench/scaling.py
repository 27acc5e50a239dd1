"""Benchmark 1, linear scaling: wall-clock and peak RSS of `memagent ask` on documents of 16K, 64K,
256K and 1M tokens (tiny model, C = 4096 so every length is a whole number of chunks).

Each length runs the real CLI in a fresh process; peak RSS is that process's own (os.wait4).
Targets: log-log slope of time against length <= 1.05; peak RSS at 1M within 10% of that at 16K.
Run: .venv/bin/python bench/scaling.py [--lengths 16384,65536,262144,1048576]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from common import ROOT, WORK, filler_text, table, tiny_model, write_result


def fit_slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="16384,65536,262144,1048576")
    ap.add_argument("--chunk-tokens", type=int, default=4096)
    ap.add_argument("--memory-tokens", type=int, default=64)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    model = tiny_model()
    tok = AutoTokenizer.from_pretrained(model)
    base = filler_text(tok, 16384)  # 16K tokens; longer documents repeat it
    rows, runs = [], []
    for n in map(int, args.lengths.split(",")):
        doc = WORK / f"doc_{n}.txt"
        if not doc.exists():
            with open(doc, "w") as f:
                for _ in range(max(1, n // 16384)):
                    f.write(base)
        trace = WORK / f"trace_{n}.jsonl"
        cmd = [sys.executable, "-m", "memagent.cli", "ask", "--model", str(model), "--document", str(doc),
               "--question", "What does the city keep?", "--chunk-tokens", str(args.chunk_tokens),
               "--memory-tokens", str(args.memory_tokens), "--answer-tokens", "16", "--trace", str(trace),
               "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if status != 0:
            sys.exit(f"memagent ask failed on {n} tokens: {proc.stderr.read().decode()[-2000:]}")
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        tokens = sum(r.get("chunk_tokens", 0) for r in records)
        loop = sum(r["seconds"] for r in records)  # batch size 1: the time inside the backend
        rss_mb = usage.ru_maxrss / 1024
        runs.append(dict(tokens=tokens, calls=len(records), wall_s=wall, backend_s=loop, peak_rss_mb=rss_mb))
        rows.append([tokens, len(records), wall, loop, rss_mb])
        print(f"{tokens} tokens: {wall:.1f} s, peak RSS {rss_mb:.0f} MB", flush=True)
    table(rows, ["tokens", "calls", "wall s", "in backend s", "peak RSS MB"])
    xs = [r["tokens"] for r in runs]
    slope = fit_slope(xs, [r["wall_s"] for r in runs])
    slope_backend = fit_slope(xs, [r["backend_s"] for r in runs])
    rss_ratio = runs[-1]["peak_rss_mb"] / runs[0]["peak_rss_mb"]
    print(f"slope (wall) {slope:.3f}, slope (in backend) {slope_backend:.3f}, RSS ratio {rss_ratio:.3f}")
    write_result("scaling", dict(
        config=dict(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, model="tiny (random)"),
        runs=runs, slope_wall=slope, slope_backend=slope_backend,
        headline=dict(scaling_slope=round(slope, 4), rss_ratio_1m_16k=round(rss_ratio, 4)),
        targets=dict(scaling_slope="<= 1.05", rss_ratio_1m_16k="<= 1.10"),
    ))


if __name__ == "__main__":
    main()

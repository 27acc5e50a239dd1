"""The chunk index's cost (memagent.documents.index, used by the `lookup` and `skim` workflows), with a fake
instant backend so that what is measured is the index's own cost, not the model's.

1. Per chunk: `lookup` (each chunk read AND written to the index, then one query call that finds nothing, then
   the answer) against `memagent` (each chunk read) on the same document, best of `--repeats` alternating
   rounds. The fake backend answers at once (a fixed reply, no prompt ids), so the rest of a chunk's cost is
   only the agent's own work (tokenising the stream, decoding the chunk, the prompt, the memory cap): the worst
   case for the ratio; a real model adds seconds per chunk and the ratio tends to 1. Target: <= 1.10. On a
   shared machine the two runs differ by more than the index costs, so `ChunkIndex.add` is also timed alone
   (per chunk, as a share of memagent's per-chunk time).
2. Peak RSS of `lookup` (index on) on a 1M-token and a 16K-token document, each in a fresh process (os.wait4),
   the document streamed from a file. Target: ratio <= 1.10. The index file's size at its largest is reported.

Run: .venv/bin/python bench/bench_index.py [--repeats 5] [--lengths 16384,1048576]
Writes bench/results/index.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from common import ROOT, WORK, best_times, filler_text, table, write_result

C, M = 4096, 64  # chunk and memory tokens (the scaling benchmark's); 1M tokens = 256 chunks


class InstantBackend:
    """A backend that replies at once: "memo" to a memory update, nothing to a query (no hit), a boxed answer."""

    max_window = None

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._ids = {t: tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("memo", "", "\\boxed{x}")}

    def prompt_length(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts: Sequence[str], params: Any) -> list[Any]:
        from memagent.backends.base import Generation

        out = []
        for p in prompts:
            text = "" if "Search query:" in p else "memo" if "<section>" in p else "\\boxed{x}"
            out.append(Generation(text, list(self._ids[text])))
        return out


def _tokenizer() -> Any:
    from memagent.backends.tiny import build_tokenizer

    return build_tokenizer()


def _document(tok: Any, n_tokens: int) -> Path:
    """A file of about `n_tokens` tokens (16K of filler, repeated), made once in bench/results/tmp."""
    path = WORK / f"index_doc_{n_tokens}.txt"
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        base = filler_text(tok, 16384)
        with open(path, "w") as f:
            for _ in range(max(1, n_tokens // 16384)):
                f.write(base)
    return path


def _read(workflow: str, tok: Any, doc: Path, **options: Any) -> dict[str, Any]:
    """One document through `workflow` on the instant backend: its calls and chunks."""
    from memagent.agent.registry import AgentInput, build_workflow, run_workflow
    from memagent.config import AgentConfig

    cfg = AgentConfig(chunk_tokens=C, memory_tokens=M, answer_tokens=16, query_tokens=64)
    wf = build_workflow(workflow, InstantBackend(tok), cfg, **options)
    [res] = run_workflow(wf, [AgentInput("What does the city keep?", Path(doc), "d")])
    return dict(calls=wf.stats.calls, chunks=res.num_chunks)


def per_chunk(tok: Any, n_tokens: int, repeats: int) -> dict[str, Any]:
    doc = _document(tok, n_tokens)
    runs = {"memagent": lambda: _read("memagent", tok, doc), "lookup": lambda: _read("lookup", tok, doc)}
    best, value, timings = best_times(runs, repeats)
    k = value["memagent"]["chunks"]
    ratio = best["lookup"] / best["memagent"]
    add_ms = index_add_ms(tok, doc, repeats)
    return dict(tokens=n_tokens, chunks=k, calls=value, best_s=best, per_chunk_ms={
        w: 1000 * s / k for w, s in best.items()}, ratio=ratio, index_add_ms_per_chunk=add_ms,
        index_add_share=add_ms / (1000 * best["memagent"] / k), timings=timings)


def index_add_ms(tok: Any, doc: Path, repeats: int) -> float:
    """The index's own cost alone: best milliseconds of `ChunkIndex.add` per chunk (write and close included),
    the chunks made beforehand (a list here, in the benchmark only)."""
    from memagent.agent.chunking import iter_chunks
    from memagent.documents.index import ChunkIndex

    chunks = list(iter_chunks(Path(doc), tok, C))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        with ChunkIndex() as ix:
            ix.add_all(chunks)
        best = min(best, time.perf_counter() - t0)
    return 1000 * best / len(chunks)


def child(n_tokens: int) -> None:
    """Run in a fresh process: `lookup` over the document, then print its calls and the index file's size."""
    import tempfile

    tok = _tokenizer()
    doc = _document(tok, n_tokens)
    folder = Path(tempfile.mkdtemp(prefix="bench-index-"))
    t0 = time.perf_counter()
    out = _read("lookup", tok, doc, index_dir=folder, keep_index=True)
    out["seconds"] = time.perf_counter() - t0
    files = list(folder.iterdir())
    out["index_mb"] = sum(f.stat().st_size for f in files) / 2**20
    for f in files:
        f.unlink()
    folder.rmdir()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cost-tokens", type=int, default=262144, help="document length of the per-chunk timing")
    ap.add_argument("--lengths", default="16384,1048576")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    tok = _tokenizer()
    cost = per_chunk(tok, args.cost_tokens, args.repeats)
    print(f"per chunk: memagent {cost['per_chunk_ms']['memagent']:.2f} ms, lookup {cost['per_chunk_ms']['lookup']:.2f}"
          f" ms ({cost['chunks']} chunks of {C}): ratio {cost['ratio']:.3f}; ChunkIndex.add alone "
          f"{cost['index_add_ms_per_chunk']:.3f} ms a chunk ({100 * cost['index_add_share']:.1f}% of memagent's)", flush=True)
    rss = [measure(n) for n in map(int, args.lengths.split(","))]
    table([[r["tokens"], r["chunks"], r["calls"], r["seconds"], r["peak_rss_mb"], r["index_mb"]] for r in rss],
          ["tokens", "chunks", "calls", "seconds", "peak RSS MB", "index MB"])
    rss_ratio = rss[-1]["peak_rss_mb"] / rss[0]["peak_rss_mb"]
    print(f"peak RSS ratio {rss[-1]['tokens']} / {rss[0]['tokens']} tokens: {rss_ratio:.3f}")
    write_result("index", dict(
        config=dict(chunk_tokens=C, memory_tokens=M, backend="instant fake (bench_index.InstantBackend): the "
                    "measure is the index's cost, not a model's", tokenizer="tiny", repeats=args.repeats),
        per_chunk=cost, rss=rss, rss_ratio=rss_ratio,
        headline=dict(index_cost_ratio=round(cost["ratio"], 4), index_add_share=round(cost["index_add_share"], 4),
                      index_rss_ratio_1m_16k=round(rss_ratio, 4)),
        targets=dict(index_cost_ratio="<= 1.10", index_add_share="<= 0.10", index_rss_ratio_1m_16k="<= 1.10"),
    ))


def measure(n_tokens: int) -> dict[str, Any]:
    """Peak RSS of `child(n_tokens)` in a fresh process (os.wait4's ru_maxrss, MB), with what it printed."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(n_tokens)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        sys.exit(f"the {n_tokens}-token run failed: {err.decode()[-2000:]}")
    return dict(tokens=n_tokens, peak_rss_mb=usage.ru_maxrss / 1024, **json.loads(out.decode().splitlines()[-1]))


if __name__ == "__main__":
    main()

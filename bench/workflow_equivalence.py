"""Are the workflows' results and traces unchanged by a refactor? Record them, then compare.

    MEMAGENT_SRC=OLD/src python bench/workflow_equivalence.py record /tmp/before.json   # the old code
    python bench/workflow_equivalence.py record /tmp/after.json      # on the new code
    python bench/workflow_equivalence.py compare /tmp/before.json /tmp/after.json

On the tiny model of `memagent tiny-model` (seed 0, CPU): memagent, lookup (2 lookups of 2 hits) and skim (k=2)
over 5 documents of 3 to 10 chunks (odd ones with a seed key), greedy and sampled (temperature 0.8, seed 3),
lock-step and pipelined (2 requests in flight) and as a stream. Each run keeps every result field (answers,
memories, conversations with their token ids) and every trace record and on_step record without `seconds`.
`compare` requires them equal; pipelined records are compared as a multiset (the order in which concurrent
replies come back is the threads', not the code's), lock-step ones in order, keys in order too.
"""
from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


class Locked:
    """A concurrent view of an in-process backend: `max_concurrency` threads, one generate at a time."""

    def __init__(self, backend: Any, n: int) -> None:
        self.b, self.max_concurrency, self.lock = backend, n, threading.Lock()
        self.tokenizer, self.max_window = backend.tokenizer, backend.max_window

    def prompt_length(self, prompt: str) -> int:
        return self.b.prompt_length(prompt)

    def generate(self, prompts: list[str], params: Any) -> list[Any]:
        with self.lock:
            return self.b.generate(prompts, params)


def record(path: Path) -> None:
    import torch

    from memagent.agent.registry import AgentInput, build_workflow, run_workflow, stream_workflow
    from memagent.backends.hf import TransformersBackend
    from memagent.backends.tiny import build_tiny_model
    from memagent.config import AgentConfig

    torch.set_num_threads(1)
    words = "river city bridge north south stone water light tower field".split()
    items = [AgentInput(f"Where is the {words[i]}?", " ".join(words[(i + j) % 10] for j in range(40 + 23 * i)),
                        f"d{i}", seed_key=100 + i if i % 2 else None) for i in range(5)]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(Path(tmp) / "tiny", seed=0)
        backend = TransformersBackend.from_pretrained(Path(tmp) / "tiny", device="cpu", dtype="float32")
        for name, opts in [("memagent", {}), ("lookup", dict(lookups=2, hits=2)), ("skim", dict(k=2))]:
            for temp in (0.0, 0.8):
                cfg = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=64,
                                  max_batch_docs=3, temperature=temp, seed=3)
                for schedule, b in (("lockstep", backend), ("pipelined", Locked(backend, 2))):
                    trace, steps = io.StringIO(), []
                    wf = build_workflow(name, b, cfg, keep_conversations=True, trace_path=trace,
                                        on_step=steps.append, schedule=schedule, **opts)
                    results = run_workflow(wf, items)
                    out[f"{name} {temp} {schedule}"] = dict(
                        results=[asdict(r) for r in results], calls=wf.stats.calls,
                        trace=[_timeless(json.loads(line)) for line in trace.getvalue().splitlines()],
                        steps=[_timeless(s) for s in steps])
                streamed: list[Any] = []
                stream_workflow(build_workflow(name, backend, cfg, keep_conversations=True, **opts), iter(items),
                                streamed.append)
                out[f"{name} {temp} stream"] = dict(results=sorted((asdict(r) for r in streamed),
                                                                   key=lambda r: r["doc_id"]))
    path.write_text(json.dumps(out) + "\n", encoding="utf-8")
    print(f"{len(out)} runs written to {path}")


def _timeless(rec: dict[str, Any]) -> list[list[Any]]:
    return [[k, v] for k, v in rec.items() if k != "seconds"]  # pairs: the keys' order is compared too


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    bad = 0
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            print(f"{name}: only in one file")
            bad += 1
            continue
        diffs = [k for k in sorted(set(x) | set(y)) if _norm(name, k, x.get(k)) != _norm(name, k, y.get(k))]
        print(f"{name}: {'IDENTICAL' if not diffs else 'DIFFERENT: ' + ', '.join(diffs)}")
        bad += bool(diffs)
    return 1 if bad else 0


def _norm(name: str, key: str, value: Any) -> Any:
    if "pipelined" in name and key in ("trace", "steps"):
        return sorted(json.dumps(v) for v in value)
    return value


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("MEMAGENT_SRC", str(Path(__file__).resolve().parents[1] / "src")))
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)

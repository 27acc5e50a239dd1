"""`skim` (rank the chunks against the question, read only the top k with the memory) against `memagent` (read
every chunk) on the main demo's single-hop task, with the demo's trained RL model (issue 26).

The documents are the demo's own evaluation documents (demo/pipeline.py `make_data`: `make_samples(spec,
train_chunks * m, eval_docs, seed + 10_000, prefix="eval")`), greedy, at each multiple; the model is the one
`memagent demo --out RUN` saved (RUN/model). Reported per multiple: accuracy, model calls per document and
seconds per document of both workflows. Targets: skim within 5 points of memagent at 16x and 64x with at most
a quarter of its calls.

Run: memagent demo --out runs/demo; .venv/bin/python bench/skim_single_hop.py --run runs/demo [--k 4]
Writes bench/results/skim_single_hop.json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common import write_result

from memagent.demo.config import DemoConfig
from memagent.demo.evaluate import run_memagent
from memagent.demo.failures import accuracy
from memagent.tasks.toy import make_samples


def measure(run: Path, k: int, multiples: tuple[int, ...], docs: int, seed: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # lazy: transformers

    cfg = DemoConfig.for_run(quick=False, seed=seed, out=str(run))
    model = AutoModelForCausalLM.from_pretrained(run / "model").eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(run / "model")
    rows: dict[str, dict[str, dict[str, float]]] = {"memagent": {}, "skim": {}}
    for mult in multiples:
        samples = make_samples(cfg.spec, cfg.train_chunks * mult, docs, cfg.seed + 10_000, prefix="eval")
        for name, options in (("memagent", {}), ("skim", {"k": k})):
            t = time.perf_counter()
            answered = run_memagent(model, tokenizer, samples, cfg.spec, workflow=name, workflow_options=options)
            rows[name][str(mult)] = {"accuracy": round(100 * accuracy(answered, samples), 1),
                                     "calls_per_doc": sum(r.calls for r in answered) / len(samples),
                                     "seconds_per_doc": round((time.perf_counter() - t) / len(samples), 4)}
            print(f"{mult}x {name}: {rows[name][str(mult)]}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=Path("runs/demo"))
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--multiples", default="16,64")
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    multiples = tuple(int(m) for m in a.multiples.split(","))
    rows = measure(a.run, a.k, multiples, a.docs, a.seed)
    checks = {m: {"points_below": round(rows["memagent"][m]["accuracy"] - rows["skim"][m]["accuracy"], 1),
                  "calls_ratio": round(rows["skim"][m]["calls_per_doc"] / rows["memagent"][m]["calls_per_doc"], 4)}
              for m in rows["skim"]}
    met = all(c["points_below"] <= 5 and c["calls_ratio"] <= 0.25 for c in checks.values())
    write_result("skim_single_hop", {"run": str(a.run), "seed": a.seed, "k": a.k, "docs": a.docs,
                                     "rows": rows, "checks": checks, "target_met": met,
                                     "command": f"python bench/skim_single_hop.py --run {a.run} --k {a.k}"})


if __name__ == "__main__":
    main()

"""The updates demo's one-prompt baselines (full-context, rag-bm25) measured again for a finished run, after the
`bm25_context` fix (a stream that fits the window was rebuilt by joining decoded passages, which glued words of the
toy's word-level tokenizer; only rag-bm25 at 1x, where the whole stream fits, read that text).

The full-context model is trained again exactly as the run trained it (its config and seed, the same rows drawn in
the same order, the pinned MKL branch, one thread); its full-context row must equal the run's (`same_model`: the
check that it is the same model), and both rows are measured on the run's evaluation streams.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/demo_updates_baselines.py RUN/results.json
Writes bench/results/demo_updates_baselines.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
import time
from pathlib import Path

from common import write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a `memagent demo --task updates` run's results.json")
    args = ap.parse_args()
    import torch

    from memagent.demo.numerics import pin_mkl_branch
    from memagent.demo.pipeline import train_full_context
    from memagent.demo.updates import UpdatesConfig, build_updates_tokenizer, make_update_samples, training_rows
    from memagent.demo.updates_eval import one_prompt_answers, scores

    pin_mkl_branch()
    run = json.loads(args.results.read_text())
    known = {f.name for f in dataclasses.fields(UpdatesConfig)} - {"spec"}
    cfg = UpdatesConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in run["config"].items() if k in known})
    t0 = time.perf_counter()
    rng = random.Random(cfg.seed)  # run_updates' order: tokenizer, torch seed, the rows (warm, fc, copy)
    tokenizer = build_updates_tokenizer(cfg.spec)
    torch.manual_seed(cfg.seed)
    rows = training_rows(cfg, tokenizer, rng)
    with tempfile.TemporaryDirectory() as tmp:
        model = train_full_context(cfg, tokenizer, rows["fc"], Path(tmp))
    train_s = time.perf_counter() - t0
    window = cfg.train_chunks * cfg.spec.chunk_tokens
    acc: dict[str, dict[str, float]] = {"full-context": {}, "rag-bm25": {}}
    stale: dict[str, dict[str, float]] = {"full-context": {}, "rag-bm25": {}}
    for mult in cfg.multiples:
        samples = make_update_samples(cfg.spec, cfg.train_chunks * mult, cfg.eval_docs, cfg.seed + 10_000,
                                      prefix="eval")
        for method, retrieve in (("full-context", False), ("rag-bm25", True)):
            got = one_prompt_answers(model, tokenizer, samples, cfg.spec, window, retrieve)
            acc[method][str(mult)], stale[method][str(mult)] = scores(got, samples)
        print(mult, {m: a[str(mult)] for m, a in acc.items()}, flush=True)
    same = acc["full-context"] == run["accuracy"]["full-context"]
    write_result("demo_updates_baselines", dict(
        run=str(args.results), seed=cfg.seed, accuracy=acc, stale=stale, same_model=same,
        run_accuracy={m: run["accuracy"][m] for m in acc}, train_s=round(train_s, 1),
        beside="the shared 2-core machine's other work: see machine.load_avg"))


if __name__ == "__main__":
    main()

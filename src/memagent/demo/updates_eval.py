"""The updates demo's run and evaluation (the task: demo/updates.py): memagent-rl, memagent-no-rl, rag-bm25 and
full-context at 1x to 64x the training length, greedy, and the standing-question path over the same samples.

- memagent-rl / memagent-no-rl: the paper's workflow over the sample's text (the stream's), batched;
- full-context: the full-context model over the text cut in the middle to its window (`train_chunks` events);
- rag-bm25: the same model over the BM25 passages (one event each: `passage_tokens` = chunk_tokens) that fit the
  same window, in document order (eval/baselines.py `bm25_context`). Every assignment of the asked key scores
  alike, so which of them it keeps is BM25's tie-break (length, then the earlier passage), never their time;
- standing: the RL model as a standing question (memagent.Stream) on a new stream file per sample, registered on
  the empty stream and advanced after each event is appended, then asked (the tail and the final call). The
  streams' equivalence (streams/standing.py) says its answers are memagent-rl's; they are compared answer by
  answer and every sample where they differ is listed, never hidden. Only the first `standing_docs` samples of a
  length: one stream and one call per event each, unbatched.

Besides accuracy, `stale`: the share of answers that are an OLDER value of the asked key (the failure an
overwrite memory should avoid and retrieval should show).
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from memagent.agent.answer import extract_boxed
from memagent.backends.base import SamplingParams
from memagent.demo.config import agent_config, full_prompt
from memagent.demo.evaluate import run_memagent, toy_backend
from memagent.demo.pipeline import (FC_SAID, RL_SAID, WARMUP_SAID, rl_train_config, run_facts, save_model, start_run,
                                    timed, train_full_context, warm_up_pair)
from memagent.demo.report import write_results
from memagent.demo.seeds import EVALUATION_SEEDS, TUNING_SEEDS
from memagent.demo.updates import (UpdatesConfig, build_updates_tokenizer, make_update_samples, rl_update_questions,
                                   training_rows)
from memagent.eval.baselines import bm25_context, middle_truncate
from memagent.streams import Stream, StreamAnswer
from memagent.tasks.toy import ToySpec

METHODS = ("memagent-rl", "memagent-no-rl", "rag-bm25", "full-context")
TARGET = 0.9  # the issue's: memagent-rl at least 90% at every length


def scores(answers: Sequence[str | None], samples: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(accuracy, stale): the shares of answers that are the current value, and that are an older value instead."""
    if len(answers) != len(samples) or not samples:
        raise ValueError(f"need as many answers as samples, at least one; got {len(answers)} and {len(samples)}")
    right = sum(a == s["answers"][0] for a, s in zip(answers, samples))
    stale = sum(a != s["answers"][0] and a in s["history"][:-1] for a, s in zip(answers, samples))
    return right / len(samples), stale / len(samples)


def one_prompt_answers(model: Any, tokenizer: Any, samples: Sequence[dict[str, Any]], spec: ToySpec, window: int,
                       retrieve: bool) -> list[str | None]:
    """The full-context model's greedy answers from the text cut to `window` tokens (retrieve: the BM25 passages
    that fit it instead)."""
    def context(s: dict[str, Any]) -> str:
        if retrieve:
            return bm25_context(s["question"], s["context"], tokenizer, window, passage_tokens=spec.chunk_tokens).context
        return middle_truncate(s["context"], tokenizer, window).context

    prompts = [full_prompt(s["question"], context(s)) for s in samples]
    gens = toy_backend(model, tokenizer, 64).generate(prompts, SamplingParams(max_new_tokens=3))
    return [extract_boxed(g.text) for g in gens]


def standing_answers(model: Any, tokenizer: Any, samples: Sequence[dict[str, Any]], spec: ToySpec,
                     folder: Path) -> list[StreamAnswer]:
    """Each sample as a stream file in `folder`: its question standing from the empty stream, advanced after each
    event is appended (one memory update per full chunk), then answered (at most two calls)."""
    backend, config = toy_backend(model, tokenizer, 1), agent_config(spec, batch_docs=1)
    out = []
    for s in samples:
        with Stream.create(folder / f"{s['id']}.db") as stream:
            question = stream.standing(s["question"], backend, config, model="memagent-rl")
            for e in s["events"]:
                stream.append(e["text"], role=e["role"], time=e["time"])
                question.advance()
            if stream.text() != s["context"]:  # the stream of a sample is its document (demo/updates.py)
                raise RuntimeError(f"{s['id']}: the stream's text is not the sample's document")
            out.append(question.answer())
    return out


def evaluate_updates(cfg: UpdatesConfig, models: dict[str, Any], tokenizer: Any,
                     evals: dict[int, list[dict[str, Any]]], log: Callable[[str], None]) -> dict[str, Any]:
    """accuracy and stale {method: {multiple: share}}, seconds_per_doc, and standing: {docs, accuracy,
    memagent_rl_accuracy (the same samples), same (answers equal to memagent-rl's), differ (their ids), calls (the
    most an answer made)} by multiple."""
    spec = cfg.spec
    window = cfg.train_chunks * spec.chunk_tokens
    acc: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    stale: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    seconds: dict[str, dict[str, float]] = {m: {} for m in (*METHODS, "standing")}
    standing: dict[str, dict[str, Any]] = {k: {} for k in ("docs", "accuracy", "memagent_rl_accuracy", "same",
                                                           "differ", "calls")}
    runs: dict[str, Callable[[list[dict[str, Any]]], list[str | None]]] = {
        "memagent-rl": lambda ss: [r.answer for r in run_memagent(models["memagent-rl"], tokenizer, ss, spec)],
        "memagent-no-rl": lambda ss: [r.answer for r in run_memagent(models["memagent-no-rl"], tokenizer, ss, spec)],
        "rag-bm25": lambda ss: one_prompt_answers(models["full-context"], tokenizer, ss, spec, window, True),
        "full-context": lambda ss: one_prompt_answers(models["full-context"], tokenizer, ss, spec, window, False)}
    for mult in cfg.multiples:
        samples, key = evals[mult], str(mult)
        got: dict[str, list[str | None]] = {}
        for method, answer in runs.items():
            t = time.perf_counter()
            got[method] = answer(samples)
            seconds[method][key] = (time.perf_counter() - t) / len(samples)
            acc[method][key], stale[method][key] = scores(got[method], samples)
        sub = samples[:cfg.standing_docs]
        t = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="memagent-updates-") as folder:
            answered = standing_answers(models["memagent-rl"], tokenizer, sub, spec, Path(folder))
        seconds["standing"][key] = (time.perf_counter() - t) / len(sub)
        rl = got["memagent-rl"][:len(sub)]
        standing["docs"][key] = len(sub)
        standing["accuracy"][key] = scores([a.answer for a in answered], sub)[0]
        standing["memagent_rl_accuracy"][key] = scores(rl, sub)[0]
        standing["same"][key] = sum(a.answer == r for a, r in zip(answered, rl))
        standing["differ"][key] = [s["id"] for a, r, s in zip(answered, rl, sub) if a.answer != r]
        standing["calls"][key] = max(a.calls for a in answered)
        log(f"{mult}x ({cfg.train_chunks * mult} events): " + ", ".join(f"{m} {acc[m][key]:.3f}" for m in METHODS)
            + f"; standing {standing['same'][key]}/{len(sub)} answers equal to memagent-rl's")
    return {"accuracy": acc, "stale": stale, "standing": standing, "seconds_per_doc": seconds}


def verdicts(found: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets: memagent-rl at least 90% at every length; the standing path's answers memagent-rl's."""
    rl = found["accuracy"]["memagent-rl"]
    st = found["standing"]
    return {"memagent_rl_at_least_90_every_length": all(v >= TARGET for v in rl.values()),
            "memagent_rl_lowest": min(rl.values()),
            "standing_equals_memagent_rl": all(st["same"][k] == st["docs"][k] for k in st["docs"])}


def seed_role(seed: int) -> str:
    """The seed protocol (demo/seeds.py): evaluation seeds are never used to choose anything."""
    return "evaluation" if seed in EVALUATION_SEEDS else "tuning" if seed in TUNING_SEEDS else "other"


def table_rows(found: dict[str, Any], standing_docs: int) -> dict[str, dict[str, float]]:
    """The printed table's rows: the four methods, then the standing path (over its first samples)."""
    return {**found["accuracy"], f"standing (first {standing_docs})": found["standing"]["accuracy"]}


def save_updates(cfg: UpdatesConfig, out: Path, model: Any, tokenizer: Any, found: dict[str, Any],
                 seconds: dict[str, float]) -> dict[str, Any]:
    """The RL model (loadable by `memagent ask` and `memagent stream ask`), results.json, results.md, the printed
    table and accuracy.png (demo/report.py's forms)."""
    save_model(out, model, tokenizer, cfg.spec)
    results = {"task": "updates", "seed_role": seed_role(cfg.seed), **found, "targets": verdicts(found),
               **run_facts(cfg, seconds), "spec": asdict(cfg.spec)}
    flat = {"accuracy": table_rows(found, cfg.standing_docs), "seed": cfg.seed, "chance": results["chance"],
            "seconds": results["seconds"], "numerics": results["numerics"]}
    st = found["standing"]
    lines = ["", "standing answers equal to memagent-rl's: " + ", ".join(
        f"{k}x {st['same'][k]}/{st['docs'][k]}" for k in st["docs"]),
        f"memagent-rl at least {100 * TARGET:.0f}% at every length: "
        + ("met" if results["targets"]["memagent_rl_at_least_90_every_length"] else "MISSED")]
    return write_results(out, results, flat, cfg, "updates", lines)


def run_updates(cfg: UpdatesConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole updates demo: data, warm-up, Multi-Conv DAPO, full-context baseline, evaluation, results."""
    from memagent.rl.trainer import train  # lazy: torch

    out, seconds, rng = start_run(cfg)
    tokenizer = build_updates_tokenizer(cfg.spec)
    rows, rl_data, evals = timed(seconds, "data", lambda: (
        training_rows(cfg, tokenizer, rng), rl_update_questions(cfg),
        {m: make_update_samples(cfg.spec, cfg.train_chunks * m, cfg.eval_docs, cfg.seed + 10_000, prefix="eval")
         for m in cfg.multiples}))
    model, no_rl = timed(seconds, "warmup", lambda: warm_up_pair(cfg, tokenizer, rows["warm"], out), log, WARMUP_SAID)
    timed(seconds, "rl", lambda: train(rl_train_config(cfg, out), rl_data, model=model, tokenizer=tokenizer,
                                       sft_data=rows["copy"]), log, RL_SAID)
    fc_model = timed(seconds, "full_context", lambda: train_full_context(cfg, tokenizer, rows["fc"], out), log, FC_SAID)
    models = {"memagent-rl": model, "memagent-no-rl": no_rl, "full-context": fc_model}
    found = timed(seconds, "eval", lambda: evaluate_updates(cfg, models, tokenizer, evals, log))
    return save_updates(cfg, out, model, tokenizer, found, seconds)

"""`memagent demo --task two-hop`: where overwriting a memory must fail, and looking back does not.

A two-hop toy question names key A; the document holds a pointer fact "fact A B" and a value fact "fact B V"
in two random chunks (tasks/toy.py `make_two_hop_sample`); the answer is V. When the value fact comes first
("value-first"), an agent whose memory holds one fact cannot know to keep it; `lookup` can search the text
it has read once the pointer is known (agent/lookup.py).

Phases (the main demo's, demo/pipeline.py, with two reading workflows trained side by side):
1. data: two-hop documents of `train_chunks` chunks;
2. warm-up, NOT question-aware, the main demo's kind of demonstrations (`demonstrations`: keep the memory or
   copy the fact of the chunk, at random; answer with the second word the memory holds), with pointer facts
   ("k3 k7", `pointer_share` of the facts) among them so that a fact of either kind can be copied. The
   `lookup` model's warm-up has `query_share` of its rows as query demonstrations instead: one fixed form,
   the question's key and the word the memory points to (`query_word`), whatever they hold. The hits it
   reads are ordinary memory updates, already in the warm-up. Both models see `warmup_rows` rows;
3. Multi-Conv DAPO through `rl.trainer.train` for each model, `workflow=memagent` and `workflow=lookup`
   (every conversation a row, the query calls included), the same steps, batch and group;
4. the full-context baseline (question-aware, a window of `train_chunks` chunks, cut in the middle beyond);
5. evaluation, greedy, at every length: memagent, lookup, skim (the memagent model reading the top `skim_k`
   chunks ranked against the question) and full-context, split by order; model calls per document too.

Why this form of query (docs/demo.md, "The two-hop demo", has the measurements): `lookups` = 2 rounds of one
hit each, the query "A m" (m: the memory's second word). Round 1 finds the pointer chunk (A is in no other
chunk; a chunk holding m ranks as high only if m is as rare, and the earlier chunk wins a tie); round 2, with
the memory "A B", finds the value chunk (the pointer chunk is left out once looked at); the two hits copied,
the memory is "B V". What RL has to learn is to copy what the
hits hold: it does within ~40 steps. A query of the memory's word alone (`query_word="second"`) left the
model at "copy every chunk" (reward 0.5 at 4 chunks, flat for 120 steps).
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from memagent.agent.answer import extract_boxed
from memagent.prompts import render
from memagent.backends.base import SamplingParams
from memagent.config import WorkflowChoice
from memagent.demo.config import EMPTY_MEMORY, DemoConfig, boxed, full_prompt
from memagent.demo.evaluate import run_memagent, toy_backend
from memagent.demo.failures import accuracy
from memagent.demo.pipeline import demonstrations as format_demonstrations
from memagent.demo.pipeline import (FC_SAID, encode_rows, rl_questions, rl_train_config, run_facts, save_model,
                                    start_run, timed, train_full_context, value_copy_rows, warm_up)
from memagent.demo.report import write_results
from memagent.eval.baselines import middle_truncate
from memagent.io import atomic_write_text
from memagent.tasks.toy import build_toy_tokenizer, make_samples

ORDERS = ("value-first", "pointer-first")
METHODS = ("lookup-rl", "memagent-rl", "skim", "full-context")  # rows of the table, each split by order


@dataclass
class TwoHopConfig(DemoConfig):
    """One two-hop demo run: DemoConfig's knobs (lengths in chunks; multiples of `train_chunks`) and these."""

    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    eval_docs: int = 256  # per length (about half of each order)
    warmup_rows: int = 24_000
    fc_rows: int = 24_000
    rl_steps: int = 120
    query_share: float = 0.1  # share of the lookup model's warm-up rows that demonstrate the query call
    query_word: str = "question+second"  # a query demonstration's form: "question+second", "second" or "any"
    pointer_share: float = 0.3  # share of the warm-up's facts that are pointer facts (a key as the value)
    lookups: int = 2  # `lookup`'s rounds of query + hits
    hits: int = 1  # chunks `lookup` reads per query
    skim_k: int = 4  # chunks `skim` reads
    rl_copy_rows: int = 8_000
    # NOT in the paper: memagent's step reward (DemoConfig's; lookup keeps the outcome reward alone): each memory
    # update is paid for the gold facts it keeps ("A B", "B V"), so keeping the pointer earns its share at the
    # step it happens; "" = outcome only
    step_reward: str = "evidence"

    @classmethod
    def for_run(cls, quick: bool, seed: int, out: str,  # type: ignore[override]
                pure_dapo: bool = False, outcome_only: bool = False) -> "TwoHopConfig":
        """The recipe of the full run, or the CI version (--quick: small enough for a test); outcome_only: the
        paper's final-answer reward alone for memagent (the run before step rewards)."""
        cfg = cls(seed=seed, out=out)
        if quick:
            cfg = cls(seed=seed, quick=True, out=out, multiples=(1, 4), eval_docs=24, warmup_rows=3_000,
                      rl_steps=4, rl_batch=4, rl_group=4, rl_mini_batches=1, rl_schedule="constant",
                      fc_rows=1_000, fc_lr=None, rl_copy_rows=500)
        if outcome_only:
            cfg = dataclasses.replace(cfg, step_reward="")
        return dataclasses.replace(cfg, rl_copy_coef=0.0) if pure_dapo else cfg

    def lookup_options(self) -> dict[str, Any]:
        return {"lookups": self.lookups, "hits": self.hits, "lookup_tokens": 3, "query_template": QUERY_TEMPLATE}


# -- phase 2: the warm-up's demonstrations -------------------------------------------------------------
QUERY_TEMPLATE = "M {memory} Q {question} S >"  # the toy lookup query call (lookup's query_template option)
EXTRA_WORDS = ("S",)  # the query template's marker word, one more token of the toy tokenizer


def random_fact(cfg: TwoHopConfig, rng: random.Random, key: str) -> tuple[str, str]:
    """A fact of `key`: its value a value word, or (`pointer_share` of them) another key, as a pointer fact."""
    spec = cfg.spec
    if rng.random() < cfg.pointer_share:
        return key, rng.choice([k for k in spec.keys if k != key])
    return key, rng.choice(spec.values)


def demonstrations(cfg: TwoHopConfig, rng: random.Random, n: int) -> list[tuple[str, str, bool]]:
    """The main demo's demonstrations (demo/pipeline.py `demonstrations`: the format only, NOT question-aware)
    with pointer facts ("k3 k7") among the chunk's and the memory's facts, `pointer_share` of them, so that a
    fact of either kind can be copied."""
    keys = cfg.spec.keys
    return format_demonstrations(
        cfg, rng, n, memory_fact=lambda r: " ".join(random_fact(cfg, r, r.choice(keys))),
        chunk_facts=lambda r, q: [random_fact(cfg, r, k) for k in r.sample(keys, cfg.spec.facts)])


def query_words(cfg: TwoHopConfig, rng: random.Random, question: str, memory: str) -> str:
    """A query demonstration's reply (`query_word`): "question+second" the question's key and the word the memory
    points to (its second word; from an empty memory, the question alone); "second" that word alone; "any" a word
    of the memory at random (from an empty memory, a random key)."""
    if memory == EMPTY_MEMORY:
        return question if cfg.query_word == "question+second" else rng.choice(cfg.spec.keys)
    if cfg.query_word == "any":
        return rng.choice(memory.split())
    second = memory.split()[1]
    return f"{question} {second}" if cfg.query_word == "question+second" else second


def query_demonstrations(cfg: TwoHopConfig, rng: random.Random, n: int) -> list[tuple[str, str]]:
    """n (prompt, response) demonstrations of lookup's query call, in one fixed form (`query_words`) whatever
    the question and the memory hold: the form of a query, not what to look for."""
    spec, out = cfg.spec, []
    for _ in range(n):
        memory = EMPTY_MEMORY
        if rng.random() >= 0.2:
            memory = " ".join(random_fact(cfg, rng, rng.choice(spec.keys)))
        question = rng.choice(spec.keys)
        out.append((render(QUERY_TEMPLATE, question=question, memory=memory),
                    query_words(cfg, rng, question, memory)))
    return out


def warmup_pairs(cfg: TwoHopConfig, rng: random.Random, with_query: bool) -> list[tuple[str, str]]:
    """`cfg.warmup_rows` demonstrations (`demonstrations`) and, for the lookup model, `query_share` of them
    query calls in place of others."""
    n_query = round(cfg.warmup_rows * cfg.query_share) if with_query else 0
    pairs = [(p, r) for p, r, _ in demonstrations(cfg, rng, cfg.warmup_rows - n_query)]
    pairs += query_demonstrations(cfg, rng, n_query)
    rng.shuffle(pairs)
    return pairs


def full_context_pairs(cfg: TwoHopConfig, rng: random.Random) -> list[tuple[str, str]]:
    """Question-aware supervised answers from whole two-hop documents (2..train_chunks chunks)."""
    pairs = []
    for _ in range(cfg.fc_rows):
        s = make_samples(cfg.spec, rng.randint(2, cfg.train_chunks), 1, rng.randrange(10**9), prefix="fc",
                         two_hop=True)[0]
        pairs.append((full_prompt(s["question"], s["context"]), boxed(s["answers"][0])))
    return pairs


# -- phases 2-4: training ----------------------------------------------------------------------------------
def train_workflow(cfg: TwoHopConfig, workflow: str, tokenizer: Any, rng: random.Random, out: Path) -> Any:
    """Warm-up then Multi-Conv DAPO of one model rolled out with `workflow` (memagent or lookup)."""
    from memagent.rl.trainer import train  # lazy: torch

    warm = encode_rows(tokenizer, warmup_pairs(cfg, rng, with_query=workflow == "lookup"))
    model = warm_up(cfg, tokenizer, warm, out / workflow)
    copy_rows = value_copy_rows(cfg, tokenizer, rng, demonstrations) if cfg.rl_copy_coef > 0 else None
    options = cfg.lookup_options() if workflow == "lookup" else {}
    rl_cfg = dataclasses.replace(rl_train_config(cfg, out / workflow), workflow=WorkflowChoice(workflow, options))
    if workflow == "lookup":  # lookup keeps the outcome reward alone
        rl_cfg = dataclasses.replace(rl_cfg, step_reward="")
    train(rl_cfg, rl_questions(cfg, two_hop=True), model=model, tokenizer=tokenizer, sft_data=copy_rows)
    return model


# -- phase 5: evaluation --------------------------------------------------------------------------------
def by_order(results: list[Any], samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """{order: accuracy over the samples of that order (None where there is none), "all": over all}."""
    out: dict[str, float | None] = {}
    for order in ORDERS:
        picked = [(r, s) for r, s in zip(results, samples, strict=True) if s["order"] == order]
        out[order] = accuracy(*map(list, zip(*picked))) if picked else None
    out["all"] = accuracy(results, samples)
    return out


def evaluate_two_hop(cfg: TwoHopConfig, models: dict[str, Any], tokenizer: Any,
                     evals: dict[int, list[dict[str, Any]]], log: Callable[[str], None]) -> dict[str, Any]:
    """accuracy {method: {order | "all": {multiple: share}}} and calls {method: {multiple: calls per document}}
    (full-context: one call); `models`: lookup-rl, memagent-rl, full-context."""
    spec = cfg.spec
    runs = {"lookup-rl": (models["lookup-rl"], "lookup", cfg.lookup_options()),
            "memagent-rl": (models["memagent-rl"], "memagent", {}),
            "skim": (models["memagent-rl"], "skim", {"k": cfg.skim_k})}
    acc: dict[str, dict[str, dict[str, float | None]]] = {m: {o: {} for o in (*ORDERS, "all")} for m in METHODS}
    calls: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    seconds: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    window = cfg.train_chunks * spec.chunk_tokens
    for mult in cfg.multiples:
        samples, key = evals[mult], str(mult)
        for method, (model, workflow, options) in runs.items():
            t = time.perf_counter()
            answered = run_memagent(model, tokenizer, samples, spec, workflow=workflow, workflow_options=options)
            seconds[method][key] = (time.perf_counter() - t) / len(samples)
            calls[method][key] = sum(r.calls for r in answered) / len(samples)
            for order, share in by_order(answered, samples).items():
                acc[method][order][key] = share
        t = time.perf_counter()
        answered = _full_context(models["full-context"], tokenizer, samples, window, middle_truncate)
        seconds["full-context"][key] = (time.perf_counter() - t) / len(samples)
        calls["full-context"][key] = 1.0
        for order, share in by_order(answered, samples).items():
            acc["full-context"][order][key] = share
        log(f"{mult}x ({cfg.train_chunks * mult} chunks): " + ", ".join(
            f"{m} {acc[m]['value-first'][key] or 0:.2f}/{acc[m]['pointer-first'][key] or 0:.2f}" for m in METHODS)
            + " (value-first/pointer-first)")
    return {"accuracy": acc, "calls_per_doc": calls, "seconds_per_doc": seconds}


def _full_context(model: Any, tokenizer: Any, samples: list[dict[str, Any]], window: int, cut: Any) -> list[Any]:
    """The full-context baseline's answers as result-like objects (`.answer`), greedy, cut to `window`."""
    prompts = [full_prompt(s["question"], cut(s["context"], tokenizer, window).context) for s in samples]
    gens = toy_backend(model, tokenizer, 64).generate(prompts, SamplingParams(max_new_tokens=3))
    return [SimpleNamespace(answer=extract_boxed(g.text)) for g in gens]


LOOKUP_PROFILE = "lookup-profile.yaml"  # beside the saved model: `memagent ask --model OUT/model --workflow lookup
#   --profile OUT/model/lookup-profile.yaml` reads with the options the model was trained with


def save_lookup_profile(cfg: TwoHopConfig, path: Path) -> None:
    """A protocol profile holding only the `workflow` section (the rest comes from the model's memagent.json)."""
    import yaml  # lazy: yaml

    text = yaml.safe_dump({"name": "two-hop-lookup", "workflow": {"name": "lookup", "options": cfg.lookup_options()}},
                          sort_keys=False)
    atomic_write_text(path, text)


# -- the run --------------------------------------------------------------------------------------------------
def table_rows(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The printed table's rows: "method (order)" -> {multiple: accuracy}, the demo's report layout."""
    return {f"{m} ({o})": {k: (v if v is not None else float("nan")) for k, v in row.items()}
            for m, orders in results["accuracy"].items() for o, row in orders.items() if o != "all"}


def save_two_hop(cfg: TwoHopConfig, out: Path, found: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
    """results.json, results.md, the printed table and accuracy.png (demo/report.py's forms, a row per method
    and order), plus calls and seconds per document."""
    results = {"task": "two-hop", **found, **run_facts(cfg, seconds), "spec": asdict(cfg.spec)}
    flat = {"accuracy": table_rows(results), "seed": cfg.seed, "chance": results["chance"],
            "seconds": results["seconds"], "numerics": results["numerics"]}
    calls = ["", "model calls per document", "", "| method | " + " | ".join(f"{m}x" for m in cfg.multiples) + " |",
             "|---|" + "---:|" * len(cfg.multiples)]
    calls += [f"| {m} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " |"
              for m, row in found["calls_per_doc"].items()]
    return write_results(out, results, flat, cfg, "two-hop", calls)


def run_two_hop(cfg: TwoHopConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole two-hop demo (module doc); returns what results.json holds."""
    out, seconds, rng = start_run(cfg)
    tokenizer = build_toy_tokenizer(cfg.spec, EXTRA_WORDS)
    evals = {m: make_samples(cfg.spec, cfg.train_chunks * m, cfg.eval_docs, cfg.seed + 10_000, prefix="eval",
                             two_hop=True) for m in cfg.multiples}
    models: dict[str, Any] = {}
    for name, workflow in (("lookup-rl", "lookup"), ("memagent-rl", "memagent")):
        models[name] = timed(seconds, workflow, lambda: train_workflow(
            cfg, workflow, tokenizer, random.Random(f"{cfg.seed}-{workflow}"), out), log,
            f"{workflow}: warm-up and Multi-Conv DAPO {{:.0f}} s")
    models["full-context"] = timed(seconds, "full_context", lambda: train_full_context(
        cfg, tokenizer, encode_rows(tokenizer, full_context_pairs(cfg, rng)), out), log, FC_SAID)
    found = timed(seconds, "eval", lambda: evaluate_two_hop(cfg, models, tokenizer, evals, log))
    save_model(out, models["lookup-rl"], tokenizer, cfg.spec)
    save_lookup_profile(cfg, out / "model" / LOOKUP_PROFILE)
    return save_two_hop(cfg, out, found, seconds)

"""`memagent demo`: a complete miniature of the paper on 2 CPU cores, through the project's own
code paths (the workflow `MemoryAgent`, the transformers backend, the SFT and Multi-Conv DAPO
trainers, `save_pretrained`), only with a tiny model and the toy task family (tasks/toy.py).

Phases:
1. data: toy documents of `train_chunks` chunks, each chunk `facts` key-value facts;
2. warm-up (the paper's "workflow without RL" ablation): supervised, NOT question-aware
   demonstrations: keep the old memory or copy some fact of the chunk; answer with the value the
   memory holds;
3. Multi-Conv DAPO on the warmed-up model, reward on the final answer only, the advantage
   broadcast to every memory update, several optimiser mini-batches per rollout batch;
4. full-context baseline: the same architecture trained to answer from the whole document in a
   window of `train_chunks` chunks, cut in the middle beyond it;
5. evaluation of the three at 1x, 4x, 16x, 64x and 256x the training length, greedy.
"""
from __future__ import annotations

import dataclasses

import copy
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from memagent.demo.failures import accuracy, accuracy_by_key, failure_kinds
from memagent.tasks.toy import ToySpec, build_toy_tokenizer, chunk_text, make_samples, random_chunk

# The question comes last, next to where the model starts writing: the short convolutions then hand
# the asked key to the last position directly (with the paper's question-first order the tiny model
# learned the lookup far more slowly).
MEMORY_TEMPLATE = "M {memory} C {chunk} Q {question} >"
FINAL_TEMPLATE = "M {memory} Q {question} >"
FULL_TEMPLATE = "C {context} Q {question} >"
EMPTY_MEMORY = "none none"
METHODS = ("memagent-rl", "memagent-no-rl", "full-context")


@dataclass
class DemoConfig:
    seed: int = 0
    quick: bool = False
    out: str = "runs/demo"
    spec: ToySpec = field(default_factory=ToySpec)
    train_chunks: int = 4  # the training length, in chunks
    multiples: tuple[int, ...] = (1, 4, 16, 64, 256)  # evaluation lengths, times the training length
    eval_docs: int = 256
    hidden: int = 64
    heads: int = 4  # attention heads (1 head copies more precisely after the warm-up, but was not better after RL)
    warmup_rows: int = 48_000  # demonstrations (memory updates and answers)
    warmup_lr: float = 3e-3
    warmup_schedule: str = "constant"  # optim.schedule of the warm-up: constant or cosine (to 0)
    rl_steps: int = 400  # Multi-Conv DAPO steps: enough for every key to be learned (docs/demo.md)
    rl_chunks: tuple[int, ...] = ()  # lengths (chunks) of the RL questions, in equal shares; () = train_chunks only
    rl_batch: int = 16  # questions per rollout batch
    rl_group: int = 8
    rl_lr: float = 1e-3  # with 50 keys, seed 1 at 16x: 73% (5e-4 for 200 steps: 45%); 2e-3 collapsed
    rl_mini_batches: int = 4
    rl_schedule: str = "cosine"  # optim.schedule of Multi-Conv DAPO: constant or cosine (to 0)
    rl_kl_coef: float = 0.0  # beta of the k3 KL to the warm-up model (0: none, as in DAPO)
    rl_dynamic_sampling: bool = False  # DAPO: train only on groups whose rewards differ
    rl_sampling_rounds: int = 1  # rounds of rl_batch questions sampled to fill the batch
    fc_rows: int = 48_000  # demonstrations of the full-context baseline
    fc_lr: float | None = 1e-3  # lr of the full-context baseline (None: warmup_lr)
    fc_batch: int = 32  # more, smaller steps, as for the warm-up
    p_keep: float = 0.5
    final_share: float = 0.2  # share of answer demonstrations among the warm-up rows
    warmup_batch: int = 32  # rows per warm-up step: more, smaller steps learned the copy faster
    rl_copy_coef: float = 3.0  # NOT in the paper: weight of the value-copy loss mixed into RL (loss.sft_coef); 0 = pure
    rl_copy_rows: int = 16_000  # its non-question-aware demonstrations (value token only)

    @classmethod
    def for_run(cls, quick: bool, seed: int, out: str, pure_dapo: bool = False) -> "DemoConfig":
        """The default recipe, or --quick's; `pure_dapo` drops the value-copy loss (the paper's algorithm alone)."""
        if pure_dapo:
            return dataclasses.replace(cls.for_run(quick, seed, out), rl_copy_coef=0.0)
        if quick:  # the CI version: fewer lengths, documents and steps (and round 1's constant lrs)
            return cls(seed=seed, quick=True, out=out, multiples=(1, 4, 16), eval_docs=64,
                       warmup_rows=24_000, rl_steps=100, rl_schedule="constant", fc_rows=8_000, fc_lr=None)
        return cls(seed=seed, out=out)


def agent_config(spec: ToySpec, temperature: float = 0.0, batch_docs: int = 256) -> Any:
    from memagent.config import AgentConfig

    return AgentConfig(chunk_tokens=spec.chunk_tokens, memory_tokens=2, answer_tokens=3, query_tokens=4,
                       memory_template=MEMORY_TEMPLATE, final_template=FINAL_TEMPLATE, empty_memory=EMPTY_MEMORY,
                       temperature=temperature, max_batch_docs=batch_docs)


def full_prompt(question: str, context: str) -> str:
    from memagent.eval.baselines import render_baseline

    return render_baseline(question, context, FULL_TEMPLATE)


def boxed(value: str) -> str:
    return "\\boxed{ " + value + " }"


def encode_rows(tokenizer: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """`rl.sft.encode_conversation` for many (prompt, response) pairs at once (one batched tokenizer
    call each way): the prompt as the backend renders it (no chat template here), the response + EOS."""
    from memagent.rl.sft import encode_conversation

    if getattr(tokenizer, "chat_template", None):  # not the toy tokenizer: keep the general path
        return [encode_conversation(tokenizer, p, r) for p, r in pairs]
    p_ids = tokenizer([p for p, _ in pairs])["input_ids"]
    r_ids = tokenizer([r for _, r in pairs], add_special_tokens=False)["input_ids"]
    return [(list(p), list(r) + [tokenizer.eos_token_id]) for p, r in zip(p_ids, r_ids)]


# -- phase 2: the non-question-aware warm-up -------------------------------------------------------
def demonstrations(cfg: DemoConfig, rng: random.Random, n: int) -> list[tuple[str, str, bool]]:
    """n (prompt, response, copied) demonstrations that teach the format only: keep the memory or copy
    SOME fact of the chunk (chosen without looking at the question), and answer with the value the
    memory holds. `copied` is False where the value does not follow from the key written: an answer from an
    empty memory (its value is drawn at random), or a chunk holding the memory's key with another value."""
    from memagent.agent.prompts import render

    spec, out = cfg.spec, []
    for _ in range(n):
        q = rng.choice(spec.keys)
        memory = EMPTY_MEMORY if rng.random() < 0.3 else f"{rng.choice(spec.keys)} {rng.choice(spec.values)}"
        if rng.random() < cfg.final_share:  # answering is one copy; memory updates need most rows
            held = memory.split()[1] if memory != EMPTY_MEMORY else rng.choice(spec.values)
            out.append((render(FINAL_TEMPLATE, question=q, memory=memory), boxed(held), memory != EMPTY_MEMORY))
            continue
        facts = random_chunk(rng, spec, q, (q, rng.choice(spec.values)) if rng.random() < 0.3 else None)
        new = memory if rng.random() < cfg.p_keep else " ".join(rng.choice(facts))
        clash = any(k == memory.split()[0] and v != memory.split()[1] for k, v in facts)  # one key, two values
        out.append((render(MEMORY_TEMPLATE, question=q, memory=memory, chunk=chunk_text(rng, spec, facts)), new,
                    not clash))
    return out


def warmup_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """The warm-up's rows: `cfg.warmup_rows` demonstrations, encoded."""
    return encode_rows(tokenizer, [(p, r) for p, r, _ in demonstrations(cfg, rng, cfg.warmup_rows)])


def value_copy_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """The auxiliary loss's rows (`rl_copy_coef`): demonstrations cut to their value token, i.e. the prompt plus
    the first response token (the key a memory writes, or `\\boxed{`) -> the value that follows it. Not
    question-aware: it trains the copy, never the choice of what to keep."""
    pairs = [(p, r) for p, r, copied in demonstrations(cfg, rng, cfg.rl_copy_rows) if copied]
    return [(p + r[:1], r[1:2]) for p, r in encode_rows(tokenizer, pairs)]


def full_context_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Question-aware supervised answers from the whole document (1..train_chunks chunks)."""
    pairs = []
    for _ in range(cfg.fc_rows):
        s = make_samples(cfg.spec, rng.randint(1, cfg.train_chunks), 1, rng.randrange(10**9), prefix="fc")[0]
        pairs.append((full_prompt(s["question"], s["context"]), boxed(s["answers"][0])))
    return encode_rows(tokenizer, pairs)


def rl_questions(cfg: DemoConfig) -> list[dict[str, Any]]:
    """The Multi-Conv DAPO questions: `rl_steps * rl_batch` toy samples of `train_chunks` chunks, or, with
    `rl_chunks`, equal shares of each of those lengths in a seeded order."""
    n = cfg.rl_steps * cfg.rl_batch
    if not cfg.rl_chunks:
        return make_samples(cfg.spec, cfg.train_chunks, n, cfg.seed, prefix="train")
    k = len(cfg.rl_chunks)
    questions = [s for i, chunks in enumerate(cfg.rl_chunks)
                 for s in make_samples(cfg.spec, chunks, n // k + (i < n % k), cfg.seed, prefix="train")]
    random.Random(cfg.seed).shuffle(questions)
    return questions


# -- evaluation ------------------------------------------------------------------------------------
def toy_backend(model: Any, tokenizer: Any, max_batch_size: int) -> Any:
    """The transformers backend over a demo model: plain prompts (the toy tokenizer has no chat template)."""
    from memagent.backends.hf import TransformersBackend

    return TransformersBackend(model.eval(), tokenizer, use_chat_template=False, max_batch_size=max_batch_size)


def run_memagent(model: Any, tokenizer: Any, samples: list[dict[str, Any]], spec: ToySpec,
                 keep_conversations: bool = False) -> list[Any]:
    """The greedy workflow over toy samples: one AgentResult each, in order (with every model call kept when
    `keep_conversations`, for demo/failures.py)."""
    from memagent.agent.workflow import AgentInput, MemoryAgent

    backend = toy_backend(model, tokenizer, len(samples))
    agent = MemoryAgent(backend, agent_config(spec, batch_docs=len(samples)), progress=True,
                        keep_conversations=keep_conversations)
    return agent.run([AgentInput(s["question"], s["context"], s["id"]) for s in samples])


def eval_full_context(model: Any, tokenizer: Any, samples: list[dict[str, Any]], window: int) -> float:
    from memagent.agent.answer import extract_boxed
    from memagent.backends.base import SamplingParams
    from memagent.eval.baselines import middle_truncate

    backend = toy_backend(model, tokenizer, 64)
    prompts = [full_prompt(s["question"], middle_truncate(s["context"], tokenizer, window).context) for s in samples]
    gens = backend.generate(prompts, SamplingParams(max_new_tokens=3))
    return sum(extract_boxed(g.text) == s["answers"][0] for g, s in zip(gens, samples)) / len(samples)


def update_step_errors(model: Any, tokenizer: Any, spec: ToySpec, n: int, seed: int) -> dict[str, dict[str, float]]:
    from memagent.demo.diagnose import update_errors

    return update_errors(toy_backend(model, tokenizer, 256), spec, agent_config(spec), n=n, seed=seed + 20_000)


# -- the pipeline ----------------------------------------------------------------------------------
def run_demo(cfg: DemoConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    import torch

    from memagent.demo.model import build_demo_model
    from memagent.rl.config import LossConfig, OptimConfig, RolloutConfig, TrainConfig, UpdateConfig
    from memagent.rl.sft import SFTConfig, train_sft
    from memagent.rl.trainer import train

    out = Path(cfg.out)
    if (out / "results.json").exists() or (out / "warmup" / "checkpoints").exists():
        raise FileExistsError(f"{out} already holds a demo run; choose another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    spec, rng = cfg.spec, random.Random(cfg.seed)
    tokenizer = build_toy_tokenizer(spec)
    torch.manual_seed(cfg.seed)

    t = time.perf_counter()
    warm = warmup_rows(cfg, tokenizer, rng)
    fc = full_context_rows(cfg, tokenizer, rng)
    rl_data = rl_questions(cfg)
    evals = {m: make_samples(spec, cfg.train_chunks * m, cfg.eval_docs, cfg.seed + 10_000, prefix="eval")
             for m in cfg.multiples}
    copy_rows = None
    if cfg.rl_copy_coef > 0:
        copy_rows = value_copy_rows(cfg, tokenizer, rng)
    seconds["data"] = time.perf_counter() - t
    log(f"data: {len(warm)} warm-up rows, {len(fc)} full-context rows, {len(rl_data)} RL questions ({seconds['data']:.0f} s)")

    t = time.perf_counter()
    model = build_demo_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, hidden=cfg.hidden, heads=cfg.heads,
                             seed=cfg.seed)
    sft = SFTConfig(out_dir=str(out / "warmup"), seed=cfg.seed, batch_size=cfg.warmup_batch,
                    micro_batch_size=cfg.warmup_batch, save=False,
                    device="cpu", optim=OptimConfig(lr=cfg.warmup_lr, warmup_steps=20, weight_decay=0.0,
                                                    schedule=cfg.warmup_schedule))
    train_sft(sft, warm, model, tokenizer)
    no_rl = copy.deepcopy(model)
    seconds["warmup"] = time.perf_counter() - t
    log(f"warm-up: {seconds['warmup']:.0f} s")

    t = time.perf_counter()
    rl_cfg = TrainConfig(out_dir=str(out / "rl"), seed=cfg.seed, total_steps=cfg.rl_steps, save_every=0, device="cpu",
                         agent=agent_config(spec, temperature=1.0, batch_docs=cfg.rl_batch * cfg.rl_group),
                         rollout=RolloutConfig(batch_size=cfg.rl_batch, group_size=cfg.rl_group,
                                               max_batch_size=cfg.rl_batch * cfg.rl_group,
                                               dynamic_sampling=cfg.rl_dynamic_sampling,
                                               max_sampling_rounds=cfg.rl_sampling_rounds),
                         loss=LossConfig(kl_coef=cfg.rl_kl_coef, sft_coef=cfg.rl_copy_coef),
                         optim=OptimConfig(lr=cfg.rl_lr, warmup_steps=5, weight_decay=0.0, schedule=cfg.rl_schedule),
                         update=UpdateConfig(mini_batch_size=cfg.rl_batch // cfg.rl_mini_batches, micro_batch_size=512,
                                                  old_logprobs="rollout"))
    train(rl_cfg, rl_data, model=model, tokenizer=tokenizer, sft_data=copy_rows)
    seconds["rl"] = time.perf_counter() - t
    log(f"Multi-Conv DAPO: {seconds['rl']:.0f} s")

    t = time.perf_counter()
    fc_model = build_demo_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, hidden=cfg.hidden,
                                heads=cfg.heads, seed=cfg.seed + 1)
    train_sft(SFTConfig(out_dir=str(out / "full-context"), seed=cfg.seed, batch_size=cfg.fc_batch,
                        micro_batch_size=cfg.fc_batch, save=False,
                        device="cpu", optim=OptimConfig(lr=cfg.fc_lr or cfg.warmup_lr, warmup_steps=20, weight_decay=0.0)),
              fc, fc_model, tokenizer)
    seconds["full_context"] = time.perf_counter() - t
    log(f"full-context baseline: {seconds['full_context']:.0f} s")

    t = time.perf_counter()
    window = cfg.train_chunks * spec.chunk_tokens
    acc: dict[str, dict[str, float]] = {m: {} for m in METHODS}
    by_key: dict[str, dict[str, float]] = {}  # the RL model's accuracy by asked key: a key it confuses stands out
    failures: dict[str, dict[str, int]] = {}  # where the RL model's failed documents broke, at 16x
    for mult in cfg.multiples:
        samples = evals[mult]
        traced = mult == 16  # keep the 16x conversations for the failure kinds
        answered = run_memagent(model, tokenizer, samples, spec, keep_conversations=traced)
        acc["memagent-rl"][str(mult)] = accuracy(answered, samples)
        by_key[str(mult)] = accuracy_by_key(answered, samples)
        if traced:
            failures[str(mult)] = failure_kinds(answered, samples, EMPTY_MEMORY)
        del answered  # the 16x conversations are large
        acc["memagent-no-rl"][str(mult)] = accuracy(run_memagent(no_rl, tokenizer, samples, spec), samples)
        acc["full-context"][str(mult)] = eval_full_context(fc_model, tokenizer, samples, window)
        log(f"{mult}x ({cfg.train_chunks * mult} chunks): " + ", ".join(f"{m} {acc[m][str(mult)]:.3f}" for m in METHODS))
    # per-step error rates (demo/diagnose.py): why accuracy falls with length, one memory update at a time
    errors = {name: update_step_errors(m, tokenizer, spec, 256 if cfg.quick else 1000, cfg.seed)
              for name, m in (("memagent-rl", model), ("memagent-no-rl", no_rl))}
    for name, e in errors.items():
        log(f"{name} per-step errors: " + ", ".join(f"{c} {k} {100 * v:.1f}%" for c, d in e.items() for k, v in d.items()))
    seconds["eval"] = time.perf_counter() - t

    model.save_pretrained(out / "model", safe_serialization=True)
    tokenizer.save_pretrained(out / "model")
    from memagent.run import save_agent_settings

    save_agent_settings(out / "model", agent_config(spec))  # `memagent ask --model OUT/model` uses the demo's prompts
    seconds["total"] = sum(seconds.values())
    import resource

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    for mult, kinds in failures.items():
        log(f"memagent-rl failures at {mult}x: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    log(f"memagent-rl by asked key at {cfg.multiples[-1]}x: " + ", ".join(
        f"{k} {100 * v:.0f}%" for k, v in by_key[str(cfg.multiples[-1])].items()))
    results = {"accuracy": acc, "update_errors": errors, "failures": failures, "by_key": by_key, "seconds": {k: round(v, 1) for k, v in seconds.items()}, "seed": cfg.seed,
               "peak_rss_mb": round(peak_rss_mb), "chance": 1 / spec.n_values, "config": {k: v for k, v in asdict(cfg).items() if k != "spec"},
               "task": asdict(spec)}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from memagent.demo.report import markdown_table, plot_accuracy, print_table

    (out / "results.md").write_text(markdown_table(results, cfg))
    print_table(results, cfg)
    plot_accuracy(results, cfg, out / "accuracy.png")
    return results

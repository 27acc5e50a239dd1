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

import copy
import random
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from memagent.demo.config import (  # noqa: F401  (DemoConfig and agent_config: imported from here by the CLI)
    EMPTY_MEMORY, FINAL_TEMPLATE, MEMORY_TEMPLATE, METHODS, DemoConfig, agent_config, boxed, full_prompt,
)
from memagent.prompts import render
from memagent.demo.evaluate import evaluate
from memagent.demo.numerics import numerics
from memagent.demo.report import write_results
from memagent.protocol.resolve import save_agent_settings
from memagent.tasks.toy import build_toy_tokenizer, chunk_text, make_samples, random_chunk

T = TypeVar("T")


def encode_rows(tokenizer: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """`rl.sft.encode_conversation` for many (prompt, response) pairs at once (one batched tokenizer
    call each way): the prompt as the backend renders it (no chat template here), the response + EOS."""
    from memagent.rl.sft import encode_conversation  # lazy: torch

    if getattr(tokenizer, "chat_template", None):  # not the toy tokenizer: keep the general path
        return [encode_conversation(tokenizer, p, r) for p, r in pairs]
    p_ids = tokenizer([p for p, _ in pairs])["input_ids"]
    r_ids = tokenizer([r for _, r in pairs], add_special_tokens=False)["input_ids"]
    return [(list(p), list(r) + [tokenizer.eos_token_id]) for p, r in zip(p_ids, r_ids)]


# -- phase 2: the non-question-aware warm-up -------------------------------------------------------
Fact = tuple[str, str]  # (key, value)
Demonstration = tuple[str, str, bool]  # (prompt, response, copied)


def demonstrations(cfg: DemoConfig, rng: random.Random, n: int,
                   memory_fact: Callable[[random.Random], str] | None = None,
                   chunk_facts: Callable[[random.Random, str], list[Fact]] | None = None,
                   render_chunk: Callable[[random.Random, list[Fact]], str] | None = None) -> list[Demonstration]:
    """n (prompt, response, copied) demonstrations that teach the format only: keep the memory or copy
    SOME fact of the chunk (chosen without looking at the question), and answer with the value the
    memory holds. `copied` is False where the value does not follow from the key written: an answer from an
    empty memory (its value is drawn at random), or a chunk holding the memory's key with another value.
    memory_fact(rng): a non-empty memory; chunk_facts(rng, question): a chunk's facts. By default the toy
    task's: "key value", and `random_chunk` with the question's own fact in 30% of the chunks (the two-hop demo
    passes its own, with pointer facts). render_chunk(rng, facts): a chunk's text (default `chunk_text`; the
    updates demo puts an event's header before it)."""
    spec, out = cfg.spec, []

    def toy_memory(r: random.Random) -> str:
        return f"{r.choice(spec.keys)} {r.choice(spec.values)}"

    def toy_chunk(r: random.Random, q: str) -> list[Fact]:
        return random_chunk(r, spec, q, (q, r.choice(spec.values)) if r.random() < 0.3 else None)

    memory_fact, chunk_facts = memory_fact or toy_memory, chunk_facts or toy_chunk
    render_chunk = render_chunk or (lambda r, facts: chunk_text(r, spec, facts))
    for _ in range(n):
        q = rng.choice(spec.keys)
        memory = EMPTY_MEMORY if rng.random() < 0.3 else memory_fact(rng)
        if rng.random() < cfg.final_share:  # answering is one copy; memory updates need most rows
            held = memory.split()[1] if memory != EMPTY_MEMORY else rng.choice(spec.values)
            out.append((render(FINAL_TEMPLATE, question=q, memory=memory), boxed(held), memory != EMPTY_MEMORY))
            continue
        facts = chunk_facts(rng, q)
        new = memory if rng.random() < cfg.p_keep else " ".join(rng.choice(facts))
        clash = any(k == memory.split()[0] and v != memory.split()[1] for k, v in facts)  # one key, two values
        out.append((render(MEMORY_TEMPLATE, question=q, memory=memory, chunk=render_chunk(rng, facts)), new,
                    not clash))
    return out


def warmup_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """The warm-up's rows: `cfg.warmup_rows` demonstrations, encoded."""
    return encode_rows(tokenizer, [(p, r) for p, r, _ in demonstrations(cfg, rng, cfg.warmup_rows)])


def value_copy_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random,
                    demos: Callable[[Any, random.Random, int], list[Demonstration]] | None = None,
                    ) -> list[tuple[list[int], list[int]]]:
    """The auxiliary loss's rows (`rl_copy_coef`): demonstrations (`demos`, default `demonstrations`) cut to their
    value token, i.e. the prompt plus the first response token (the key a memory writes, or `\\boxed{`) -> the
    value that follows it. Not question-aware: it trains the copy, never the choice of what to keep."""
    pairs = [(p, r) for p, r, copied in (demos or demonstrations)(cfg, rng, cfg.rl_copy_rows) if copied]
    return [(p + r[:1], r[1:2]) for p, r in encode_rows(tokenizer, pairs)]


def full_context_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Question-aware supervised answers from the whole document (1..train_chunks chunks)."""
    pairs = []
    for _ in range(cfg.fc_rows):
        s = make_samples(cfg.spec, rng.randint(1, cfg.train_chunks), 1, rng.randrange(10**9), prefix="fc")[0]
        pairs.append((full_prompt(s["question"], s["context"]), boxed(s["answers"][0])))
    return encode_rows(tokenizer, pairs)


def rl_questions(cfg: DemoConfig, two_hop: bool = False) -> list[dict[str, Any]]:
    """The Multi-Conv DAPO questions: `rl_steps * rl_batch` toy samples (two-hop ones with `two_hop`) of
    `train_chunks` chunks, or, with `rl_chunks`, equal shares of each of those lengths in a seeded order."""
    n = cfg.rl_steps * cfg.rl_batch
    if not cfg.rl_chunks:
        return make_samples(cfg.spec, cfg.train_chunks, n, cfg.seed, prefix="train", two_hop=two_hop)
    k = len(cfg.rl_chunks)
    questions = [s for i, chunks in enumerate(cfg.rl_chunks)
                 for s in make_samples(cfg.spec, chunks, n // k + (i < n % k), cfg.seed, prefix="train",
                                       two_hop=two_hop)]
    random.Random(cfg.seed).shuffle(questions)
    return questions


# -- the pipeline: one function a phase, called in this order by run_demo ---------------------------
@dataclass
class DemoData:
    """Everything phase 1 draws, in the order it is drawn from the seeded rng."""

    warm: list[tuple[list[int], list[int]]]  # warm-up rows (prompt ids, response ids)
    fc: list[tuple[list[int], list[int]]]  # full-context baseline rows
    rl_data: list[dict[str, Any]]  # Multi-Conv DAPO questions (toy samples)
    evals: dict[int, list[dict[str, Any]]]  # evaluation samples by length multiple
    copy_rows: list[tuple[list[int], list[int]]] | None  # value-copy rows (None when rl_copy_coef is 0)


def prepare_out(cfg: DemoConfig) -> Path:
    """The run folder, refused when it already holds a demo run."""
    out = Path(cfg.out)
    if (out / "results.json").exists() or (out / "warmup" / "checkpoints").exists():
        raise FileExistsError(f"{out} already holds a demo run; choose another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def make_data(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> DemoData:
    """Phase 1: every row and question of the run (the rng order fixes the numbers: do not reorder)."""
    spec = cfg.spec
    warm = warmup_rows(cfg, tokenizer, rng)
    fc = full_context_rows(cfg, tokenizer, rng)
    rl_data = rl_questions(cfg)
    evals = {m: make_samples(spec, cfg.train_chunks * m, cfg.eval_docs, cfg.seed + 10_000, prefix="eval")
             for m in cfg.multiples}
    copy_rows = None
    if cfg.rl_copy_coef > 0:
        copy_rows = value_copy_rows(cfg, tokenizer, rng)
    return DemoData(warm, fc, rl_data, evals, copy_rows)


def warm_up(cfg: DemoConfig, tokenizer: Any, warm: list[tuple[list[int], list[int]]], out: Path) -> Any:
    """Phase 2: a fresh demo model trained on the warm-up rows (the paper's "workflow without RL")."""
    from memagent.demo.model import build_demo_model  # lazy: torch
    from memagent.rl.config import OptimConfig  # lazy: torch
    from memagent.rl.sft import SFTConfig, train_sft  # lazy: torch

    model = build_demo_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, hidden=cfg.hidden, heads=cfg.heads,
                             seed=cfg.seed)
    sft = SFTConfig(out_dir=str(out / "warmup"), seed=cfg.seed, batch_size=cfg.warmup_batch,
                    micro_batch_size=cfg.warmup_batch, save=False,
                    device="cpu", optim=OptimConfig(lr=cfg.warmup_lr, warmup_steps=20, weight_decay=0.0,
                                                    schedule=cfg.warmup_schedule))
    train_sft(sft, warm, model, tokenizer)
    return model


def rl_train_config(cfg: DemoConfig, out: Path) -> Any:
    """The TrainConfig of the demo's Multi-Conv DAPO phase."""
    from memagent.rl.config import LossConfig, OptimConfig, RolloutConfig, TrainConfig, UpdateConfig  # lazy: torch

    spec = cfg.spec
    return TrainConfig(out_dir=str(out / "rl"), seed=cfg.seed, total_steps=cfg.rl_steps, save_every=0, device="cpu",
                       agent=agent_config(spec, temperature=1.0, batch_docs=cfg.rl_batch * cfg.rl_group),
                       rollout=RolloutConfig(batch_size=cfg.rl_batch, group_size=cfg.rl_group,
                                             max_batch_size=cfg.rl_batch * cfg.rl_group,
                                             dynamic_sampling=cfg.rl_dynamic_sampling,
                                             max_sampling_rounds=cfg.rl_sampling_rounds),
                       loss=LossConfig(kl_coef=cfg.rl_kl_coef, sft_coef=cfg.rl_copy_coef),
                       optim=OptimConfig(lr=cfg.rl_lr, warmup_steps=5, weight_decay=0.0, schedule=cfg.rl_schedule),
                       update=UpdateConfig(mini_batch_size=cfg.rl_batch // cfg.rl_mini_batches, micro_batch_size=512,
                                           old_logprobs="rollout"),
                       step_reward=cfg.step_reward, step_mix=cfg.step_mix, step_scale=cfg.step_scale,
                       step_reward_options=dict(cfg.step_reward_options))


def train_rl(cfg: DemoConfig, model: Any, tokenizer: Any, data: DemoData, out: Path) -> None:
    """Phase 3: Multi-Conv DAPO on the warmed-up model, in place (plus the value-copy objective when its
    rows are given)."""
    from memagent.rl.trainer import train  # lazy: torch

    rl_cfg = rl_train_config(cfg, out)
    rl_data, copy_rows = data.rl_data, data.copy_rows
    train(rl_cfg, rl_data, model=model, tokenizer=tokenizer, sft_data=copy_rows)


def train_full_context(cfg: DemoConfig, tokenizer: Any, fc: list[tuple[list[int], list[int]]], out: Path) -> Any:
    """Phase 4: the full-context baseline, a fresh model of the same architecture (init seed + 1)."""
    from memagent.demo.model import build_demo_model  # lazy: torch
    from memagent.rl.config import OptimConfig  # lazy: torch
    from memagent.rl.sft import SFTConfig, train_sft  # lazy: torch

    fc_model = build_demo_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, hidden=cfg.hidden,
                                heads=cfg.heads, seed=cfg.seed + 1)
    train_sft(SFTConfig(out_dir=str(out / "full-context"), seed=cfg.seed, batch_size=cfg.fc_batch,
                        micro_batch_size=cfg.fc_batch, save=False,
                        device="cpu", optim=OptimConfig(lr=cfg.fc_lr or cfg.warmup_lr, warmup_steps=20, weight_decay=0.0)),
              fc, fc_model, tokenizer)
    return fc_model


def run_facts(cfg: DemoConfig, seconds: dict[str, float]) -> dict[str, Any]:
    """What a demo run's results.json holds beside its figures (the main and the two-hop demo's alike): the
    seconds of each phase and their total (added to `seconds`), the seed, chance, peak RSS, config, numerics."""
    seconds["total"] = sum(seconds.values())
    return {"seconds": {k: round(v, 1) for k, v in seconds.items()}, "seed": cfg.seed,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),  # Linux: KiB
            "chance": 1 / cfg.spec.n_values, "config": {k: v for k, v in asdict(cfg).items() if k != "spec"},
            "numerics": numerics()}


# -- the run skeleton the three demos share (this one, demo/updates_eval.py, demo/two_hop.py) ----------------
WARMUP_SAID, RL_SAID, FC_SAID = "warm-up: {:.0f} s", "Multi-Conv DAPO: {:.0f} s", "full-context baseline: {:.0f} s"


def start_run(cfg: DemoConfig) -> tuple[Path, dict[str, float], random.Random]:
    """A demo run's start: its folder (`prepare_out`), its seconds by phase (none yet) and its generator, and
    torch's global generator seeded, all from cfg.seed."""
    import torch  # lazy: torch

    out = prepare_out(cfg)
    torch.manual_seed(cfg.seed)
    return out, {}, random.Random(cfg.seed)


def timed(seconds: dict[str, float], phase: str, run: Callable[[], T], log: Callable[[str], None] | None = None,
          said: str = "") -> T:
    """run(), its wall time put in seconds[phase]; then `said` (a format of those seconds) logged, when given."""
    t = time.perf_counter()
    result = run()
    seconds[phase] = time.perf_counter() - t
    if log is not None and said:
        log(said.format(seconds[phase]))
    return result


def warm_up_pair(cfg: DemoConfig, tokenizer: Any, rows: list[tuple[list[int], list[int]]],
                 out: Path) -> tuple[Any, Any]:
    """Phase 2 (`warm_up`) and a copy of its model: the one Multi-Conv DAPO trains in place, and the ablation
    without RL."""
    model = warm_up(cfg, tokenizer, rows, out)
    return model, copy.deepcopy(model)


def save_model(out: Path, model: Any, tokenizer: Any, spec: Any) -> None:
    """The trained model in out/model, loadable by `memagent ask` with the demo's prompts (its agent settings)."""
    model.save_pretrained(out / "model", safe_serialization=True)
    tokenizer.save_pretrained(out / "model")
    save_agent_settings(out / "model", agent_config(spec))


def save_results(cfg: DemoConfig, out: Path, model: Any, tokenizer: Any, found: dict[str, Any],
                 seconds: dict[str, float], log: Callable[[str], None]) -> dict[str, Any]:
    """The RL model (loadable by `memagent ask`), results.json, results.md, the printed table and accuracy.png."""
    spec = cfg.spec
    save_model(out, model, tokenizer, spec)
    facts = run_facts(cfg, seconds)
    for mult, kinds in found["failures"].items():
        log(f"memagent-rl failures at {mult}x: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    log(f"memagent-rl by asked key at {cfg.multiples[-1]}x: " + ", ".join(
        f"{k} {100 * v:.0f}%" for k, v in found["by_key"][str(cfg.multiples[-1])].items()))
    results = {**found, **facts, "task": asdict(spec)}
    return write_results(out, results, results, cfg)


def run_demo(cfg: DemoConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole demo (module doc): data, warm-up, Multi-Conv DAPO, full-context baseline, evaluation, results."""
    out, seconds, rng = start_run(cfg)
    tokenizer = build_toy_tokenizer(cfg.spec)
    data = timed(seconds, "data", lambda: make_data(cfg, tokenizer, rng))
    log(f"data: {len(data.warm)} warm-up rows, {len(data.fc)} full-context rows, {len(data.rl_data)} RL questions "
        f"({seconds['data']:.0f} s)")
    model, no_rl = timed(seconds, "warmup", lambda: warm_up_pair(cfg, tokenizer, data.warm, out), log, WARMUP_SAID)
    timed(seconds, "rl", lambda: train_rl(cfg, model, tokenizer, data, out), log, RL_SAID)
    fc_model = timed(seconds, "full_context", lambda: train_full_context(cfg, tokenizer, data.fc, out), log, FC_SAID)
    found = timed(seconds, "eval", lambda: evaluate(cfg, dict(zip(METHODS, (model, no_rl, fc_model))), tokenizer,
                                                    data.evals, log))
    return save_results(cfg, out, model, tokenizer, found, seconds, log)

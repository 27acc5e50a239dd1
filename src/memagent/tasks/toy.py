"""A toy long-context QA family for CPU-scale models (the demo's task; PAPER.md's RULER-HotpotQA in
miniature).

A document is K chunks; each chunk holds `facts` key-value facts written "key value" (two words)
and `filler` pairs of filler words ("f3 f17"), in random order.
The question names a key; its fact appears in exactly one chunk; every other fact is a distractor
with another key. With the toy tokenizer every word is one token, so a chunk of `facts` facts is
exactly `2 * (facts + filler)` tokens, and `chunk_tokens` of that size cuts the document at chunk
boundaries.
Chance accuracy is 1 / n_values. Deterministic for a seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator


@dataclass(frozen=True)
class ToySpec:
    n_keys: int = 50
    n_values: int = 50
    facts: int = 4  # facts per chunk
    filler: int = 0  # filler word pairs per chunk
    n_filler: int = 20  # filler vocabulary

    @cached_property
    def keys(self) -> list[str]:
        return [f"k{i}" for i in range(self.n_keys)]

    @cached_property
    def values(self) -> list[str]:
        return [f"v{i}" for i in range(self.n_values)]

    @cached_property
    def filler_words(self) -> list[str]:
        return [f"f{i}" for i in range(self.n_filler)]

    @property
    def chunk_tokens(self) -> int:
        return 2 * (self.facts + self.filler)


def random_chunk(rng: random.Random, spec: ToySpec, avoid: str, fact: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """`spec.facts` facts with distinct keys other than `avoid`; `fact`, if given, in a random slot."""
    keys = rng.sample([k for k in spec.keys if k != avoid], spec.facts)
    facts = [(k, rng.choice(spec.values)) for k in keys]
    if fact is not None:
        facts[rng.randrange(spec.facts)] = fact
    return facts


def chunk_text(facts: list[tuple[str, str]], rng: random.Random | None = None, spec: ToySpec | None = None) -> str:
    """The facts as text; with `rng` and `spec`, `spec.filler` filler pairs at random places among them."""
    pairs = [f"{k} {v}" for k, v in facts]
    if rng is not None and spec is not None and spec.filler:
        for _ in range(spec.filler):
            pairs.insert(rng.randrange(len(pairs) + 1), f"{rng.choice(spec.filler_words)} {rng.choice(spec.filler_words)}")
    return " ".join(pairs)


def make_sample(rng: random.Random, spec: ToySpec, n_chunks: int, sample_id: str) -> dict[str, Any]:
    """One sample: {id, task, question, answers, context, num_chunks, gold_chunk}."""
    if n_chunks < 1:
        raise ValueError(f"a toy document needs at least one chunk, got {n_chunks}")
    key, value = rng.choice(spec.keys), rng.choice(spec.values)
    gold = rng.randrange(n_chunks)
    chunks = [chunk_text(random_chunk(rng, spec, key, (key, value) if i == gold else None), rng, spec)
              for i in range(n_chunks)]
    return dict(id=sample_id, task="toy", question=key, answers=[value], context=" ".join(chunks),
                num_chunks=n_chunks, gold_chunk=gold, metric="exact_match")


def make_samples(spec: ToySpec, n_chunks: int, n: int, seed: int, prefix: str = "toy") -> list[dict[str, Any]]:
    rng = random.Random(f"{seed}-{n_chunks}-{prefix}")
    return [make_sample(rng, spec, n_chunks, f"{prefix}-{n_chunks}-{i:05d}") for i in range(n)]


def iter_samples(spec: ToySpec, lengths: list[int], n: int, seed: int) -> Iterator[dict[str, Any]]:
    for k in lengths:
        yield from make_samples(spec, k, n, seed)


def build_toy_tokenizer(spec: ToySpec, extra_words: tuple[str, ...] = ()) -> Any:
    """A word-level tokenizer: every toy word (and template word) is one token; `\\boxed{` and `}` are
    single added tokens, so the model answers `\\boxed{ v3 }` in three tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    words = ["Q", "M", "C", ">", "none", *extra_words, *spec.keys, *spec.values, *spec.filler_words]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.add_tokens(["\\boxed{", "}"])
    return fast

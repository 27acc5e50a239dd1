"""A toy long-context QA family for CPU-scale models (the demo's task; docs/paper.md's RULER-HotpotQA in
miniature).

A document is K chunks. A chunk is `slots` slots of three words; `facts` slots hold a fact written
"fact KEY VALUE" (the marker word first), the others hold filler words. The question names a key;
its fact appears in exactly one chunk; every other fact is a distractor with another key. With the
toy tokenizer every word is one token, so a chunk is exactly `3 * slots` tokens and
`chunk_tokens = 3 * slots` cuts the document at chunk boundaries. Chance accuracy is 1 / n_values.
Deterministic for a seed.

Two-hop samples (`make_two_hop_sample`, `memagent data toy --two-hop`): the question's key points to another
key ("fact k3 k7"), whose fact holds the answer ("fact k7 v5"), in two random chunks; each sample records
`order` ("value-first" | "pointer-first"), so every table can be split by it (`memagent eval --split-by order`).

Why this shape (measured on the demo's tiny LFM2, see demo/pipeline.py): the marker before the key
lets a model find "the fact of this chunk" by looking for one fixed word, and a single fact per
chunk makes "copy the fact of the chunk" one well-defined target. With four bare "key value"
facts a chunk, the non-question-aware warm-up ("copy SOME fact of the chunk") did not learn to
pick one of the chunk's keys within minutes, so RL had nothing to explore with. Ten keys (and 50
values, so chance stays 2%): with 50 keys the 64-wide model kept mistaking a few key pairs for each
other, a slip that a 64-chunk document (~32 distractors before the answer) almost always meets; with
10 keys RL sees every pair ~27x as often and its reward plateaus (~0.99) by step ~125 (README).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator

MARKER = "fact"
FILLER = ("the", "a", "of", "and", "to", "in", "on", "it", "was", "for",
          "with", "as", "at", "by", "from", "or", "an", "be", "this", "that")


@dataclass(frozen=True)
class ToySpec:
    n_keys: int = 10  # few keys: with 50 the demo's 64-wide model confused key pairs (see README)
    n_values: int = 50
    facts: int = 1  # facts per chunk
    slots: int = 3  # three-word slots per chunk (facts + filler)

    def __post_init__(self) -> None:
        if not 1 <= self.facts <= self.slots:
            raise ValueError(f"a chunk holds 1..slots facts; got facts={self.facts}, slots={self.slots}")
        if self.n_keys <= self.facts or self.n_values < 1:
            raise ValueError(f"need more keys than facts per chunk and at least one value; got {self}")

    @cached_property
    def keys(self) -> list[str]:
        return [f"k{i}" for i in range(self.n_keys)]

    @cached_property
    def values(self) -> list[str]:
        return [f"v{i}" for i in range(self.n_values)]

    @property
    def words(self) -> list[str]:
        """Every word a toy document can hold."""
        return [MARKER, *FILLER, *self.keys, *self.values]

    @property
    def chunk_tokens(self) -> int:
        return 3 * self.slots


def random_chunk(rng: random.Random, spec: ToySpec, avoid: str, fact: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """`spec.facts` facts with distinct keys other than `avoid`; `fact`, if given, in a random position."""
    keys = rng.sample([k for k in spec.keys if k != avoid], spec.facts)
    facts = [(k, rng.choice(spec.values)) for k in keys]
    if fact is not None:
        facts[rng.randrange(spec.facts)] = fact
    return facts


def chunk_text(rng: random.Random, spec: ToySpec, facts: list[tuple[str, str]]) -> str:
    """The chunk's words: the facts in random slots, in order, filler words elsewhere."""
    where = set(rng.sample(range(spec.slots), len(facts)))
    it, words = iter(facts), []
    for slot in range(spec.slots):
        if slot in where:
            k, v = next(it)
            words += [MARKER, k, v]
        else:
            words += [rng.choice(FILLER) for _ in range(3)]
    return " ".join(words)


def make_sample(rng: random.Random, spec: ToySpec, n_chunks: int, sample_id: str) -> dict[str, Any]:
    """One sample: {id, task, question, answers, context, num_chunks, gold_chunk, metric, evidence}; evidence is
    the fact's words as the document writes them after the marker ("k3 v5"), what a memory holding it holds."""
    if n_chunks < 1:
        raise ValueError(f"a toy document needs at least one chunk, got {n_chunks}")
    key, value = rng.choice(spec.keys), rng.choice(spec.values)
    gold = rng.randrange(n_chunks)
    chunks = [chunk_text(rng, spec, random_chunk(rng, spec, key, (key, value) if i == gold else None))
              for i in range(n_chunks)]
    return dict(id=sample_id, task="toy", question=key, answers=[value], context=" ".join(chunks),
                num_chunks=n_chunks, gold_chunk=gold, metric="exact_match", evidence=[f"{key} {value}"])


def make_two_hop_sample(rng: random.Random, spec: ToySpec, n_chunks: int, sample_id: str) -> dict[str, Any]:
    """A two-hop sample: the question names key A; a pointer fact "fact A B" (its value is another key) and a
    value fact "fact B V" sit in two distinct random chunks; the answer is V. Every other fact is a distractor
    with a key other than A and B. `order` says which came first: "value-first" (an overwritten memory cannot
    know to keep "fact B V" when it reads it) or "pointer-first". {id, task="toy-two-hop", question, answers,
    context, num_chunks, pointer_chunk, value_chunk, order, metric, evidence}; evidence: the two facts' words
    ["A B", "B V"] (the pointer pays its share of the evidence reward when it is kept)."""
    if n_chunks < 2:
        raise ValueError(f"a two-hop toy document needs at least two chunks (one per fact), got {n_chunks}")
    if spec.n_keys < spec.facts + 2:
        raise ValueError(f"two-hop needs at least facts + 2 keys (the two hops and the distractors); got {spec}")
    first, second = rng.sample(spec.keys, 2)
    value = rng.choice(spec.values)
    pointer_chunk, value_chunk = rng.sample(range(n_chunks), 2)
    others = [k for k in spec.keys if k not in (first, second)]
    chunks = []
    for i in range(n_chunks):
        facts = [(k, rng.choice(spec.values)) for k in rng.sample(others, spec.facts)]
        own = (first, second) if i == pointer_chunk else (second, value) if i == value_chunk else None
        if own is not None:
            facts[rng.randrange(spec.facts)] = own
        chunks.append(chunk_text(rng, spec, facts))
    return dict(id=sample_id, task="toy-two-hop", question=first, answers=[value], context=" ".join(chunks),
                num_chunks=n_chunks, pointer_chunk=pointer_chunk, value_chunk=value_chunk,
                order="value-first" if value_chunk < pointer_chunk else "pointer-first", metric="exact_match",
                evidence=[f"{first} {second}", f"{second} {value}"])


def make_samples(spec: ToySpec, n_chunks: int, n: int, seed: int, prefix: str = "toy",
                 two_hop: bool = False) -> list[dict[str, Any]]:
    """`n` samples of `n_chunks` chunks, deterministic for (seed, n_chunks, prefix); two_hop: two-hop ones
    (`make_two_hop_sample`, ids "<prefix>2-..."), drawn from their own stream."""
    if two_hop:
        rng = random.Random(f"{seed}-{n_chunks}-{prefix}-two-hop")
        return [make_two_hop_sample(rng, spec, n_chunks, f"{prefix}2-{n_chunks}-{i:05d}") for i in range(n)]
    rng = random.Random(f"{seed}-{n_chunks}-{prefix}")
    return [make_sample(rng, spec, n_chunks, f"{prefix}-{n_chunks}-{i:05d}") for i in range(n)]


def iter_samples(spec: ToySpec, lengths: list[int], n: int, seed: int, two_hop: bool = False) -> Iterator[dict[str, Any]]:
    for k in lengths:
        yield from make_samples(spec, k, n, seed, two_hop=two_hop)


def build_toy_tokenizer(spec: ToySpec, extra_words: tuple[str, ...] = ()) -> Any:
    """A word-level tokenizer: every toy word (and template word) is one token; `\\boxed{` and `}` are
    single added tokens, so the model answers `\\boxed{ v3 }` in three tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # lazy: tokenizers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers

    specials = ["<pad>", "<eos>", "<unk>"]
    words = ["Q", "M", "C", ">", "none", *extra_words, *spec.words]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + words))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.add_tokens(["\\boxed{", "}"])
    return fast

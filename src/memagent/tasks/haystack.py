"""Haystacks, needles' keys and values, and fitting a text to a token length (RULER style).

Haystacks are sequences of text units joined by spaces; a task inserts its needles between
units and asks for as many units as bring the whole context closest to a token target.

- "noise": RULER's repeated sentence group "The grass is green. ..." (built in).
- "essay": the sentences of any text file the user gives (RULER uses Paul Graham's essays),
  repeated from the start when the target is longer than the file.

Departure from RULER: keys are adjective-noun pairs from a small built-in word list (RULER
draws them from the `wonderwords` package), and the common-words task draws from generated
pronounceable pseudo-words so that any length finds enough distinct words.
"""
from __future__ import annotations

import random
import re
import string
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from memagent.tasks.base import DataError, count_tokens

__all__ = [
    "NOISE",
    "essay_units",
    "fit_to_tokens",
    "make_keys",
    "make_values",
    "pseudo_words",
]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

ADJECTIVES = (
    "able acid angry basic big bitter black blue bold brave bright broad brown busy calm cheap "
    "clean clear close cold cool cruel curly damp dark dear deep dry dull eager early easy empty "
    "equal fair fancy fast fat fine firm flat fond free fresh full funny gentle giant glad good "
    "grand great green grey happy hard harsh heavy high hollow holy honest huge humble hungry icy "
    "ideal jolly juicy keen kind large late lazy light little lively local lone long loud lovely "
    "low loyal lucky mad magic main major merry mild modern moist narrow neat new nice noble "
    "noisy odd old open orange pale plain polite poor proud pure purple quick quiet rapid rare "
    "raw ready real red rich right rigid ripe rough round royal rude sad safe salty sharp shiny "
    "short shy silent silly simple slim slow small smart smooth soft solid sour spicy stale "
    "steady steep sticky stiff still strange strict strong sudden sunny super sweet swift tall "
    "tame tender thick thin tidy tiny tough true ugly upset urban vast violet vivid warm weak "
    "wet white whole wide wild windy wise witty young zany"
).split()
NOUNS = (
    "actor album anchor angle apple arrow atlas badge bakery balloon banana barn basket beach "
    "beard bell bench bicycle blanket boat bottle bracelet branch bread bridge brush bucket "
    "butter button cabin cable camera candle canoe canyon carpet castle cello chair cherry "
    "chimney circle cliff clock cloud coat coffee comet copper cotton crayon crown cup curtain "
    "daisy desert diamond dinner dolphin door dragon drum eagle engine falcon feather fence "
    "fiddle flag flame flute forest fountain garden garlic giraffe glove grape guitar hammer "
    "harbor helmet honey horizon island jacket jungle kettle kitten ladder lantern lemon "
    "library lizard magnet mango map marble meadow mirror monkey mountain needle nest ocean "
    "orchard otter owl paddle palace panda parrot pebble pencil pepper piano pillow planet "
    "pocket potato pumpkin puzzle quilt rabbit radio rainbow ribbon river robot rocket saddle "
    "sail salmon sandal scarf shadow shell shovel spider spoon squirrel stable statue storm "
    "sugar summit swan table teapot tiger tomato tower tractor trumpet tulip tunnel turtle "
    "umbrella valley violin volcano wagon walnut whale whistle window wizard zebra"
).split()
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


MAX_HAYSTACK_BYTES = 16 << 20  # 16 MiB of text: ~4M tokens, more than the longest context (--tokens) allowed
MAX_UNIT_CHARS = 2_000  # a "sentence" longer than this (a file without full stops) is split at spaces


def essay_units(path: str | Path) -> list[str]:
    """The sentences of a text file, white space folded; the essay haystack's units.

    The haystack is built from whole units repeated to fill a context and tokenised a few times over
    (`fit_to_tokens`), so a unit is at most MAX_UNIT_CHARS characters (a one-line file without full stops
    was one 50 MB unit, and sixteen copies of it exhausted RAM: exit 134 or killed) and the file at most
    MAX_HAYSTACK_BYTES."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"haystack file {path} does not exist; give a plain-text file (an essay, a book)")
    size = path.stat().st_size
    if size > MAX_HAYSTACK_BYTES:
        raise DataError(f"haystack file {path} has {size:,} bytes, over the limit of {MAX_HAYSTACK_BYTES:,} "
                        "(16 MiB, about 4M tokens: more than the longest context); give a shorter text, e.g. its "
                        "first 16 MB (head -c 16M)")
    units = text_units(path.read_text(encoding="utf-8", errors="replace"))
    if not units:
        raise DataError(f"haystack file {path} holds no text")
    return units


def text_units(text: str) -> list[str]:
    """The sentences of `text`, white space folded, a long one cut at spaces (`essay_units`' rule)."""
    text = " ".join(text.split())
    return [piece for s in re.split(r"(?<=[.!?])\s+", text) if s for piece in _split_long(s)]


def _split_long(sentence: str) -> list[str]:
    """`sentence` cut at spaces into pieces of at most about MAX_UNIT_CHARS characters (a word longer than
    that is cut where it is)."""
    if len(sentence) <= MAX_UNIT_CHARS:
        return [sentence]
    pieces, start = [], 0
    while start < len(sentence):
        end = min(len(sentence), start + MAX_UNIT_CHARS)
        if end < len(sentence):
            space = sentence.rfind(" ", start + 1, end)
            end = space if space > start else end
        pieces.append(sentence[start:end].strip())
        start = end
    return [p for p in pieces if p]


def make_keys(rng: random.Random, n: int) -> list[str]:
    """n distinct "adjective-noun" keys."""
    total = len(ADJECTIVES) * len(NOUNS)
    if n > total:
        raise DataError(f"asked for {n} distinct keys; the built-in word list gives {total}")
    return [f"{ADJECTIVES[i // len(NOUNS)]}-{NOUNS[i % len(NOUNS)]}" for i in rng.sample(range(total), n)]


def make_values(rng: random.Random, n: int, kind: str) -> list[str]:
    """n distinct needle values: "numbers" (7 digits), "uuids", or "words" (adjective-noun keys)."""
    if kind == "numbers":
        return [str(v) for v in rng.sample(range(1_000_000, 10_000_000), n)]
    if kind == "uuids":
        return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]
    if kind == "words":
        return make_keys(rng, n)
    raise DataError(f"unknown needle kind {kind!r}; use numbers, uuids or words")


def pseudo_words(rng: random.Random, n: int, syllables: int = 3) -> list[str]:
    """n distinct pronounceable lower-case words of `syllables` consonant-vowel pairs."""
    space = (len(_CONSONANTS) * len(_VOWELS)) ** syllables
    if n > space // 2:
        raise DataError(f"asked for {n} distinct pseudo-words of {syllables} syllables; at most {space // 2}")
    words: dict[str, None] = {}
    while len(words) < n:
        words["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))] = None
    return list(words)


def coded_words(rng: random.Random, n: int, length: int = 6) -> list[str]:
    """n distinct random lower-case strings (RULER's frequent-words vocabulary)."""
    words: dict[str, None] = {}
    while len(words) < n:
        words["".join(rng.choices(string.ascii_lowercase, k=length))] = None
    return list(words)


def fit_to_tokens(build: Callable[[int], str], tokenizer: Any, target: int, n_min: int = 0,
                  n_max: int = 1 << 26, name: str = "task") -> tuple[int, str, int]:
    """Find the size n whose text `build(n)` has a token count closest to `target`.

    `build` must grow (weakly) with n. Starts from a linear estimate, brackets the target and
    bisects: about log2 of the bracket's width tokenisations of the whole text.
    Returns (n, text, tokens).
    """
    memo: dict[int, tuple[str, int]] = {}

    def measure(n: int) -> int:
        if n not in memo:
            text = build(n)
            memo[n] = (text, count_tokens(tokenizer, text))
        return memo[n][1]

    base = measure(n_min)
    if base > target:
        raise DataError(f"{name}: the fixed part of the context already has {base} tokens, over the target {target}")
    probe = max(n_min + 1, n_min + 16)
    per_unit = max(1e-9, (measure(probe) - base) / (probe - n_min))
    guess = min(n_max, max(n_min, n_min + int((target - base) / per_unit)))
    lo, hi = max(n_min, int(guess * 0.95)), max(n_min + 1, int(guess * 1.05) + 1)
    while lo > n_min and measure(lo) > target:
        lo = max(n_min, lo - (hi - lo) * 2)
    while measure(hi) < target:
        if hi >= n_max:
            raise DataError(f"{name}: cannot reach {target} tokens within {n_max} units")
        lo, hi = hi, min(n_max, hi * 2)
    while hi - lo > 1:  # invariant: measure(lo) <= target <= measure(hi)
        mid = (lo + hi) // 2
        if measure(mid) < target:
            lo = mid
        else:
            hi = mid
    n = min((lo, hi), key=lambda k: abs(measure(k) - target))
    return n, memo[n][0], memo[n][1]


def insert_at_depths(units: Sequence[str], needles: Sequence[str], depths: Sequence[float]) -> list[str]:
    """Insert each needle between units at its relative depth in [0, 1] (0 = before the first)."""
    out = list(units)
    for needle, depth in sorted(zip(needles, depths), key=lambda nd: -nd[1]):
        out.insert(round(depth * len(units)), needle)
    return out

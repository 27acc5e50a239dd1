"""Where each failed toy document went wrong: the memory's path through a whole document.

`demo/diagnose.py` measures one update at a time from random states; this follows real runs
(`MemoryAgent(..., keep_conversations=True)` over toy samples) and names, for each wrong answer,
the first update that broke it:

- blocked_by_claim: when the answer's chunk came, the memory already named the asked key with a
  wrong value (an earlier update wrote "k5 v9" from a chunk that did not hold k5), and the update
  kept that note instead of the real fact; `claim_from_empty` / `claim_from_other` count whether
  that claim was written over the empty memory or over another fact;
- missed_write: the answer's chunk came and the update did not write the asked fact;
- after the write (the memory held "k5 v31"), the first update that changed it:
  `mixed` (kept the key, took another value), `overwrite` (wrote the chunk's whole fact),
  `key_changed` (kept the value under another key), `other`;
- answer_step: the memory held the fact to the end but the answer was wrong.

`accuracy_by_key` splits accuracy by the asked key: a model that takes one key for another (seed 4 of
the demo tracked k3's facts whenever asked for k1) shows one key far below the rest.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence


def toy_key_order(keys: Iterable[str]) -> list[str]:
    """Toy keys in their numeric order (k2 before k10), as `ToySpec.keys` lists them."""
    return sorted(keys, key=lambda k: (len(k), k))


def accuracy(results: Sequence[Any], samples: Sequence[dict[str, Any]]) -> float:
    """The share of results whose answer is the sample's (first) gold answer; results and samples in order."""
    if len(results) != len(samples) or not samples:
        raise ValueError(f"need as many results as samples, at least one; got {len(results)} and {len(samples)}")
    return sum(r.answer == s["answers"][0] for r, s in zip(results, samples)) / len(samples)


def accuracy_by_key(results: Sequence[Any], samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """{asked key: accuracy over the samples that ask it}, keys in the toy order (k0, k1, ..., k10)."""
    right: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    for r, s in zip(results, samples, strict=True):
        asked[s["question"]] += 1
        right[s["question"]] += r.answer == s["answers"][0]
    return {k: right[k] / asked[k] for k in toy_key_order(asked)}


def failure_kinds(results: Sequence[Any], samples: Sequence[dict[str, Any]], empty_memory: str) -> dict[str, int]:
    """Counts of `ok` and of each failure kind (module doc) over AgentResults kept with their conversations
    and their toy samples ({question, context, answers}), in the same order."""
    counts: Counter[str] = Counter()
    for r, s in zip(results, samples):
        q, gold = s["question"], s["answers"][0]
        if r.answer == gold:
            counts["ok"] += 1
            continue
        steps = [c for c in r.conversations if c.kind == "memory"]
        if not steps:
            raise ValueError("failure_kinds needs results run with keep_conversations=True")
        before = [empty_memory] + [c.text for c in steps[:-1]]  # the memory each update started from
        after = [c.text for c in steps]
        at = next(i for i, c in enumerate(steps) if f"fact {q} {gold}" in c.prompt)  # the answer's chunk
        want = f"{q} {gold}"
        if after[at] != want:
            if before[at].split()[:1] == [q]:
                counts["blocked_by_claim"] += 1
                first = next(i for i in range(at) if after[i].split()[:1] == [q])
                counts["claim_from_empty" if before[first] == empty_memory else "claim_from_other"] += 1
            else:
                counts["missed_write"] += 1
            continue
        j = next((i for i in range(at + 1, len(after)) if after[i] != want), None)
        if j is None:
            counts["answer_step"] += 1
            continue
        new = after[j].split()
        if len(new) == 2 and new[1] == gold:
            counts["key_changed"] += 1
        elif new[:1] == [q]:
            counts["mixed"] += 1
        elif f"fact {after[j]}" in steps[j].prompt:
            counts["overwrite"] += 1
        else:
            counts["other"] += 1
    return dict(counts)

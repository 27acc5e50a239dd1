"""Speculative decoding by prompt lookup (n-gram drafts taken from the sequence itself), one row at a time.

The `num_draft` tokens that followed the latest earlier occurrence of the last n tokens (n = max_ngram down to 1,
in the prompt and the reply so far) are drafted; the model reads the last token and the draft in one forward pass
and keeps the longest prefix it would have produced itself (`pick`: greedy, per-row seeded, or one generator's
draws) plus its own next token, so greedy replies are plain decoding's token for token and sampled ones keep its
distribution (an n-gram draft is speculative sampling's one-hot case). Why, why one row at a time, and the
measurements: docs/throughput.md ("One document's latency"). Plain Python (the CLI's options import it); the loop
over a model is `memagent.backends.lookup_decode`; vLLM speculates in its engine (`vllm_speculative_config`).
"""
from __future__ import annotations

from typing import Any, Sequence

SPECULATE = ("none", "ngram")  # --speculate: off, or prompt lookup
DRAFT_TOKENS = 10  # tokens proposed per step (the measurement: x2.8 at 10 on a copied memory)
MAX_NGRAM = 3  # longest suffix looked up; shorter ones are tried when it does not occur


def check_speculate(method: str | None) -> str:
    """`method` ("none" / "ngram"; None: "none"), or ValueError naming the valid ones."""
    method = method or "none"
    if method not in SPECULATE:
        raise ValueError(f"unknown speculation method {method!r}; choose one of: {', '.join(SPECULATE)}")
    return method


def lookup_draft(ids: Sequence[int], num_draft: int = DRAFT_TOKENS, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to `num_draft` tokens that followed the latest earlier occurrence of the last n tokens of `ids`
    (n from `max_ngram` down to 1; the longest suffix that occurs wins); [] when none occurs.

    >>> lookup_draft([5, 6, 7, 8, 9, 5, 6], num_draft=2)
    [7, 8]
    """
    if num_draft <= 0:
        return []
    seq = list(ids)
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        suffix = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):  # latest first; the suffix itself excluded
            if seq[start : start + n] == suffix:
                follow = seq[start + n : start + n + num_draft]
                if follow:
                    return follow
    return []


def accept(draft: Sequence[int], picked: Sequence[int]) -> list[int]:
    """The tokens a verification step emits: the longest prefix of `draft` equal to `picked` (the model's own
    token at each position), then the model's token at the first position that differs (or after the draft).
    picked: len(draft) + 1 tokens, picked[i] following the last token and draft[:i].

    >>> accept([4, 5, 6], [4, 5, 9, 7])
    [4, 5, 9]
    """
    n = 0
    while n < len(draft) and draft[n] == picked[n]:
        n += 1
    return list(picked[: n + 1])


def vllm_speculative_config(method: str, num_draft: int = DRAFT_TOKENS,
                            max_ngram: int = MAX_NGRAM) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for `method` (None for "none"): its n-gram proposer, the same draft
    length and longest n-gram as the transformers backend."""
    if check_speculate(method) == "none":
        return None
    return {"method": "ngram", "num_speculative_tokens": num_draft, "prompt_lookup_max": max_ngram,
            "prompt_lookup_min": 1}

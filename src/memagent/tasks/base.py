"""What every task module needs, below the sample reader: the data error, token counting, file hashing,
and writing sample files. Imports nothing from `memagent.tasks`, so every task module can import it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

from memagent.errors import MemAgentError
from memagent.io import atomic_write, file_sha256

__all__ = ["DataError", "LAZY_DOC_THRESHOLD", "count_tokens", "file_sha256", "write_samples"]

LAZY_DOC_THRESHOLD = 10_000  # samples with this many documents or more are stored lazily


class DataError(MemAgentError, ValueError):
    """Input data is malformed or cannot make the requested sample; the message names the entry."""


def count_tokens(tokenizer: Any, text: str) -> int:
    """Number of tokens of `text` under `tokenizer`, without special tokens.

    Uses the Rust tokenizer directly when there is one (no length warnings, no Python lists of
    special-token handling); otherwise `tokenizer.encode`.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return len(backend.encode(text, add_special_tokens=False).ids)
    return len(tokenizer.encode(text, add_special_tokens=False))


def write_samples(samples: Iterable[dict], path: str | Path) -> int:
    """Write samples as JSONL (UTF-8, keys in insertion order), atomically; returns the count.

    Same samples give byte-identical files. `-` writes to stdout.
    """
    if str(path) == "-":
        n = 0
        for sample in samples:
            sys.stdout.write(json.dumps(sample, ensure_ascii=False) + "\n")
            n += 1
        return n

    n = 0
    with atomic_write(path) as fh:  # a temp file beside `path`, removed if the run fails
        for sample in samples:
            fh.write(json.dumps(sample, ensure_ascii=False) + "\n")
            n += 1
    return n

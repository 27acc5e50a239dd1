"""JSONL trace of a run: one record per model call, flushed as it happens.

Memory-update record: doc_id, step, chunk_start (token offset of the chunk in the document, an
evidence pointer), chunk_tokens, prompt_tokens, memory_tokens, memory, truncated, seconds,
batch_size, and for a PDF, HTML or EPUB document source (the place the chunk came from: "page 214",
"pages 213-214", 'chapter 3 "The Storm"', 'heading "Methods"'; absent for plain text). Final record: doc_id, step, kind="final", prompt_tokens, memory_tokens, answer
(the boxed content or null), raw_answer, seconds, batch_size. `seconds` is the wall-clock of the
backend batch the call ran in (calls of one batch share it); in a pipelined run (a concurrent backend) each
call is its own request: `seconds` is its own, `batch_size` 1. A call decoded speculatively (--speculate) also
has draft_proposed and draft_accepted: the draft tokens proposed for it and how many the model kept
(`draft_fields`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from memagent.backends.base import Generation


def draft_fields(gen: Generation) -> dict[str, int]:
    """{draft_proposed, draft_accepted} of a speculatively decoded reply; {} for one decoded plainly."""
    if gen.draft_proposed is None:
        return {}
    return {"draft_proposed": gen.draft_proposed, "draft_accepted": gen.draft_accepted or 0}


class TraceWriter:
    """Append JSON lines to a file (or any text stream); each record is flushed at once."""

    def __init__(self, target: str | Path | TextIO) -> None:
        if isinstance(target, (str, Path)):
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            self._f: TextIO = open(target, "w", encoding="utf-8")
            self._own = True
        else:
            self._f, self._own = target, False

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._own:
            self._f.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

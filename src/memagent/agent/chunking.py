"""Streaming chunker: a document of any length becomes chunks of at most C tokens (paper: "The
workflow", step 1), read block by block so that memory never grows with the document.

Block-wise tokenisation: text is read in blocks of `block_chars` characters; each block is
tokenised up to its last "word boundary" (a space between two non-space characters), and the
rest is carried into the next block. Byte-level BPE tokenizers (GPT-2, Qwen, Llama 3 style)
pre-split text before " word", so the ids equal those of tokenising the whole text at once.
A block with no such boundary in its last `_BOUNDARY_WINDOW` characters (e.g. text without spaces)
is cut where it ends, and the ids at that cut may differ from whole-text tokenisation by a token
or two: once per block, i.e. once per million characters by default.

The document is read as text blocks by memagent.documents.reading (a string, a path, a stream; a PDF, HTML or
EPUB file, told apart by its first bytes, as pieces that each carry their place: a page, a heading, a chapter).
Each place is tokenised on its own (the carry is flushed at a change of place), and every chunk records the
places of its tokens as `source` ("page 214", "pages 213-214"); a plain text chunk has `source` None.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

from memagent.documents import Location, span_label
from memagent.documents.errors import DocumentError
from memagent.documents.reading import (BLOCK_CHARS, Chunk, DocumentSource, iter_located_blocks, iter_text_blocks,
                                        open_document)

__all__ = ["BLOCK_CHARS", "Chunk", "DocumentError", "DocumentSource", "Prepared", "iter_chunks", "iter_located_blocks",
           "iter_text_blocks", "iter_token_blocks", "middle_truncate", "open_document"]

_BOUNDARY_WINDOW = 4096
_BOUNDARY = re.compile(r"\S(?= \S)")


def _split_point(text: str, final: bool) -> int:
    """Index up to which `text` can be tokenised now without changing ids at the cut."""
    if final:
        return len(text)
    window_start = max(0, len(text) - _BOUNDARY_WINDOW)
    last = None
    for m in _BOUNDARY.finditer(text, window_start):
        last = m
    if last is not None:
        return last.end()  # just before the space
    return len(text) if len(text) > _BOUNDARY_WINDOW else 0


def iter_token_blocks(
    source: DocumentSource, tokenizer: Any, *, errors: str = "strict", block_chars: int = BLOCK_CHARS
) -> Iterator[list[int]]:
    """Token ids of the document, block by block (no special tokens added)."""
    for ids, _ in _located_token_blocks(source, tokenizer, errors, block_chars):
        yield ids


def _located_token_blocks(
    source: DocumentSource, tokenizer: Any, errors: str, block_chars: int
) -> Iterator[tuple[list[int], Location | None]]:
    """(token ids, their place) block by block; the text carried to the next block never crosses a place."""
    carry, loc = "", None
    blocks = iter_located_blocks(source, errors=errors, block_chars=block_chars)
    pending = next(blocks, None)
    while pending is not None:
        nxt = next(blocks, None)
        text, loc = carry + pending[0], pending[1]
        cut = _split_point(text, final=nxt is None or nxt[1] != loc)
        if cut:
            yield tokenizer(text[:cut], add_special_tokens=False)["input_ids"], loc
        carry = text[cut:]
        pending = nxt
    if carry:
        yield tokenizer(carry, add_special_tokens=False)["input_ids"], loc


def iter_chunks(
    source: DocumentSource,
    tokenizer: Any,
    chunk_tokens: int,
    *,
    errors: str = "strict",
    block_chars: int = BLOCK_CHARS,
) -> Iterator[Chunk]:
    """Split a document into consecutive chunks of at most `chunk_tokens` tokens, lazily.

    Every chunk but the last has exactly `chunk_tokens` tokens. Each chunk's ids are decoded back
    to text with the same tokenizer (a multi-byte character cut by a chunk boundary decodes as
    U+FFFD, as in the paper's reference code).
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    buf: list[int] = []
    marks: list[tuple[int, Location]] = []  # (offset in buf, the place that starts there), ascending
    index = start = 0
    for ids, loc in _located_token_blocks(source, tokenizer, errors, block_chars):
        if loc is not None and (not marks or marks[-1][1] != loc):
            marks.append((len(buf), loc))
        buf.extend(ids)
        n_full = len(buf) // chunk_tokens
        for k in range(n_full):
            piece = buf[k * chunk_tokens : (k + 1) * chunk_tokens]
            yield Chunk(index, tokenizer.decode(piece), piece, start, _source(marks, k * chunk_tokens, len(piece)))
            index += 1
            start += chunk_tokens
        del buf[: n_full * chunk_tokens]
        marks = _shift(marks, n_full * chunk_tokens)
    if buf:
        yield Chunk(index, tokenizer.decode(buf), list(buf), start, _source(marks, 0, len(buf)))


def _source(marks: list[tuple[int, Location]], begin: int, n: int) -> str | None:
    """The label of the places of tokens [begin, begin + n) of the buffer, or None (plain text)."""
    inside = [loc for at, loc in marks if at < begin + n]
    if not inside:
        return None
    first = next((loc for at, loc in reversed(marks) if at <= begin), inside[0])
    return span_label(first, inside[-1])


def _shift(marks: list[tuple[int, Location]], cut: int) -> list[tuple[int, Location]]:
    """The marks after the first `cut` tokens left the buffer: the place in force at the cut starts at 0."""
    if not marks or cut == 0:
        return marks
    kept = [(at - cut, loc) for at, loc in marks if at > cut]
    current = [loc for at, loc in marks if at <= cut]
    return ([(0, current[-1])] if current else []) + kept


@dataclass
class Prepared:
    """A document made to fit a token budget (cut in the middle here, or retrieved passages in eval)."""

    context: str  # what goes into the prompt
    document_tokens: int  # tokens of the whole document
    kept_tokens: int  # tokens of it in the prompt
    note: str = ""  # "cut" / "retrieved k of n passages" / ""


def middle_truncate(document: DocumentSource, tokenizer: Any, budget: int) -> Prepared:
    """The document if it fits `budget` tokens, else its first budget//2 and last budget - budget//2
    tokens decoded and joined (LongBench), reading the document as a stream."""
    head: list[int] = []
    tail: deque[int] = deque(maxlen=budget - budget // 2)
    total = 0
    whole: list[int] = []
    for chunk in iter_chunks(document, tokenizer, max(1, budget)):
        ids = chunk.token_ids  # [<= budget]
        total += len(ids)
        if total <= budget:
            whole.extend(ids)
        if len(head) < budget // 2:
            head.extend(ids[: budget // 2 - len(head)])
        tail.extend(ids)
    if total <= budget:
        return Prepared(tokenizer.decode(whole), total, total)
    text = tokenizer.decode(head + list(tail))  # one decode: correct for word-level tokenizers too
    return Prepared(text, total, len(head) + len(tail), "cut")

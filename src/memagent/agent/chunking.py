"""Streaming chunker: a document of any length becomes chunks of at most C tokens (paper: "The
workflow", step 1), read block by block so that memory never grows with the document.

Block-wise tokenisation: text is read in blocks of `block_chars` characters; each block is
tokenised up to its last "word boundary" (a space between two non-space characters), and the
rest is carried into the next block. Byte-level BPE tokenizers (GPT-2, Qwen, Llama 3 style)
pre-split text before " word", so the ids equal those of tokenising the whole text at once.
A block with no such boundary in its last `_BOUNDARY_WINDOW` characters (e.g. text without spaces)
is cut where it ends, and the ids at that cut may differ from whole-text tokenisation by a token
or two: once per block, i.e. once per million characters by default.

Documents that are not plain text (PDF, HTML, EPUB: memagent.documents, told apart by their first bytes) are read
as pieces that each carry their place (a page, a heading, a chapter). Each place is tokenised on its own (the
carry is flushed at a change of place), and every chunk records the places of its tokens as `source`
("page 214", "pages 213-214"); a plain text chunk has `source` None, and its ids are exactly as before.
"""
from __future__ import annotations

import codecs
import io
import os
import re
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, TextIO, Union

from memagent.documents import Location, detect, document_segments, span_label
from memagent.documents.errors import DocumentError

__all__ = ["BLOCK_CHARS", "Chunk", "DocumentError", "DocumentSource", "Prepared", "iter_chunks", "iter_located_blocks",
           "iter_text_blocks", "iter_token_blocks", "middle_truncate", "open_document"]

DocumentSource = Union[str, os.PathLike, BinaryIO, TextIO, Iterable[str], Iterable[bytes]]

BLOCK_CHARS = 1 << 16  # characters read and tokenised at a time; bounds RAM, not chunk boundaries
_BOUNDARY_WINDOW = 4096
_BOUNDARY = re.compile(r"\S(?= \S)")


@dataclass(frozen=True)
class Chunk:
    index: int  # 0-based chunk number
    text: str  # the chunk's token ids decoded back to text
    token_ids: list[int]  # [<= C]
    start_token: int  # offset of the chunk's first token in the document (an evidence pointer)
    source: str | None = None  # where its tokens came from ("page 214", "pages 213-214"); None for plain text


def _decode_stream(read, name: str, errors: str, block_bytes: int) -> Iterator[str]:
    """Decode a byte stream incrementally; errors name the byte offset."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
    offset = 0
    while True:
        raw = read(block_bytes)
        final = not raw
        pending = len(decoder.getstate()[0])  # bytes of a character split by the previous block
        try:
            text = decoder.decode(raw or b"", final=final)
        except UnicodeDecodeError as e:
            at = offset - pending + e.start
            raise DocumentError(
                f"{name} is not valid UTF-8 (byte {at}: {e.reason}); it may be a binary file. "
                "Convert it to UTF-8 text, or pass --errors replace to substitute U+FFFD for bad bytes"
            ) from None
        offset += len(raw or b"")
        if text:
            yield text
        if final:
            return


def iter_text_blocks(
    source: DocumentSource, *, errors: str = "strict", block_chars: int = BLOCK_CHARS
) -> Iterator[str]:
    """Yield the document as text blocks, never holding more than about one block.

    `source` is the text itself (str), a path (pathlib.Path / os.PathLike: plain text, PDF, HTML or EPUB, told
    apart by its first bytes), "-" only through the CLI (pass `sys.stdin.buffer`), an open binary or text file,
    or any iterable of str or bytes. With errors="strict", bytes that are not UTF-8 and NUL characters raise
    DocumentError.
    """
    for block, _ in iter_located_blocks(source, errors=errors, block_chars=block_chars):
        yield block


def iter_located_blocks(
    source: DocumentSource, *, errors: str = "strict", block_chars: int = BLOCK_CHARS
) -> Iterator[tuple[str, Location | None]]:
    """`iter_text_blocks` with each block's place: a Location for a PDF, HTML or EPUB file, None for text."""
    if errors not in ("strict", "replace"):
        raise DocumentError(f"errors must be 'strict' or 'replace', got {errors!r}")
    if isinstance(source, os.PathLike):
        path = Path(source)
        if not path.exists():
            raise DocumentError(f"document file not found: {path}")
        if path.is_dir():
            raise DocumentError(f"document path is a directory, not a file: {path}")
        kind = detect(path)
        if kind != "text":
            yield from _split_pieces(document_segments(path, kind, errors), block_chars)
            return
    for block in _plain_blocks(source, errors, block_chars):
        yield block, None


def _split_pieces(pieces: Iterable[tuple[str, Location]], block_chars: int) -> Iterator[tuple[str, Location]]:
    """Pieces of a document that is not plain text, in blocks of at most `block_chars` (NULs dropped)."""
    for text, loc in pieces:
        text = text.replace("\x00", "")
        for i in range(0, len(text), block_chars):
            yield text[i : i + block_chars], loc


def _plain_blocks(source: DocumentSource, errors: str, block_chars: int) -> Iterator[str]:
    """The blocks of a plain text document (a str, a text file's path, a stream, an iterable)."""
    blocks: Iterator[str]
    if isinstance(source, str):
        blocks = (source[i : i + block_chars] for i in range(0, len(source), block_chars))
        name = "the document"
    elif isinstance(source, os.PathLike):
        blocks = _file_blocks(Path(source), errors, block_chars)
        name = str(source)
    elif hasattr(source, "read"):
        name = getattr(source, "name", "the input stream")
        if isinstance(source, io.TextIOBase):
            blocks = iter(lambda: source.read(block_chars), "")
        else:
            blocks = _decode_stream(source.read, str(name), errors, block_chars)
    else:
        blocks = _iterable_blocks(source, errors, block_chars)
        name = "the document"
    offset = 0
    for block in blocks:
        if errors == "strict" and "\x00" in block:
            raise DocumentError(
                f"{name} contains a NUL character (character {offset + block.index(chr(0))}); "
                "it looks like a binary file. Pass --errors replace to read it anyway"
            )
        offset += len(block)
        yield block


def _file_blocks(path: Path, errors: str, block_chars: int) -> Iterator[str]:
    with open(path, "rb") as f:
        yield from _decode_stream(f.read, str(path), errors, block_chars)


def _iterable_blocks(source: Iterable[Any], errors: str, block_chars: int) -> Iterator[str]:
    it = iter(source)
    for item in it:
        if isinstance(item, bytes):
            # a stream of byte blocks: decode incrementally with the same error handling
            def chunks(first: bytes = item) -> Iterator[bytes]:
                yield first
                yield from it

            gen = chunks()
            yield from _decode_stream(lambda _n: next(gen, b""), "the document", errors, block_chars)
            return
        if not isinstance(item, str):
            raise DocumentError(f"a document iterable must yield str or bytes, got {type(item).__name__}")
        yield item


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


def open_document(path: str, stdin: BinaryIO | None = None) -> DocumentSource:
    """CLI helper: '-' means standard input (bytes), anything else a file path."""
    if path == "-":
        return stdin if stdin is not None else sys.stdin.buffer
    return Path(path)


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

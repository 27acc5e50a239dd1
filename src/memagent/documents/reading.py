"""A document source read as text: the text itself, a path (plain text, PDF, HTML or EPUB, told apart by its first
bytes), an open binary or text file, or an iterable of str or bytes, yielded block by block so that memory never
grows with the document. A plain text source is decoded incrementally (UTF-8; bad bytes and NUL characters are a
DocumentError naming the offset, or U+FFFD with errors="replace"); a PDF, HTML or EPUB file comes as its pieces,
each with its place (memagent.documents.document_segments). The chunker (memagent.agent.chunking) tokenises these
blocks; `ask --document -` reads standard input through `open_document`.
"""
from __future__ import annotations

import codecs
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, TextIO, Union

from memagent.documents import Location, detect, document_segments
from memagent.documents.errors import DocumentError

__all__ = ["BLOCK_CHARS", "Chunk", "DocumentSource", "iter_located_blocks", "iter_text_blocks", "open_document"]

DocumentSource = Union[str, os.PathLike, BinaryIO, TextIO, Iterable[str], Iterable[bytes]]

BLOCK_CHARS = 1 << 16  # characters read and tokenised at a time; bounds RAM, not chunk boundaries


@dataclass(frozen=True)
class Chunk:
    """A piece of a document of at most C tokens: what the chunker (memagent.agent.chunking.iter_chunks) yields
    and the chunk index (memagent.documents.index) keeps."""

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


def open_document(path: str, stdin: BinaryIO | None = None) -> DocumentSource:
    """CLI helper: '-' means standard input (bytes), anything else a file path."""
    if path == "-":
        return stdin if stdin is not None else sys.stdin.buffer
    return Path(path)

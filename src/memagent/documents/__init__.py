"""The documents users have: plain text, PDF, HTML and EPUB, told apart by their first bytes (`detect`), each
read as a stream of (text, place) pieces: page by page (PDF), heading by heading (HTML), chapter by chapter in
spine order (EPUB). The chunker (memagent.agent.chunking) reads every document through `reading`, so a
path given to `ask --document`, an `ask --input` line's `document`, or an upload to `memagent serve` may be any
of them; every chunk then carries the place its text came from (`Location.label`, "page 214"), and every memory
update records it as `source` in the trace.

    detect.py    the kind of a file, from its magic bytes (never its name)
    location.py  Location (page / chapter / heading) and the label of a span of them
    pdf.py       PDF with pypdf (the optional extra `documents`), one page at a time
    html.py      HTML with the standard library's streaming parser: the main text, bounded in size and depth
    epub.py      EPUB with ebooklib (the extra `documents`), the ZIP bounded before it is unpacked
    errors.py    DocumentError, and the error that names the extra when a reader is not installed
    reading.py   any document source (text, a path, a stream) as text blocks, and Chunk, the chunker's piece
    index.py     a document's chunks in an on-disk SQLite FTS5 index, searched with BM25 (lookup, skim)

`check_document(path)` reads what must be read to refuse a bad document before any model call (a PDF's page
tree and its first text, an HTML page's nesting, every EPUB chapter); a plain text file is checked as it is
read, as before. Every module here imports only base helpers (errors): the documents sit in the base layer.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from memagent.documents.detect import KINDS, detect, sniff
from memagent.documents.epub import check_epub, epub_segments
from memagent.documents.errors import EXTRA, DocumentError
from memagent.documents.html import check_html_file, html_segments
from memagent.documents.location import Location, span_label
from memagent.documents.pdf import check_pdf, pdf_segments

__all__ = ["EXTRA", "KINDS", "DocumentError", "Location", "check_document", "detect", "document_segments",
           "sniff", "span_label"]


def document_segments(path: str | os.PathLike, kind: str, errors: str = "strict") -> Iterator[tuple[str, Location]]:
    """The text of a PDF, HTML or EPUB file as (text, Location) pieces, in reading order."""
    if kind == "pdf":
        return pdf_segments(path)
    if kind == "html":
        return html_segments(path, errors)
    if kind == "epub":
        return epub_segments(path, errors)
    raise ValueError(f"no segment reader for {kind!r} documents")


def check_document(path: str | os.PathLike, errors: str = "strict") -> str:
    """The kind of the document at `path` ("text" | "pdf" | "html" | "epub"), after the checks a bad one fails
    before any model call; DocumentError names what is wrong and what to do."""
    p = Path(path)
    if not p.exists() or p.is_dir():
        raise DocumentError(f"document {p} {'is a folder' if p.is_dir() else 'not found'}; give a file path")
    kind = detect(p)  # a pipe or a device: text, read as before
    if kind == "pdf":
        check_pdf(p)
    elif kind == "epub":
        check_epub(p, errors)
    elif kind == "html":
        check_html_file(p, errors)
    return kind

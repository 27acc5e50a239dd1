"""What a document is, read from its first bytes (its magic), never from its file name.

- PDF: `%PDF-` within the first 1,024 bytes (where PDF readers look for the header).
- EPUB: a ZIP archive (`PK\\x03\\x04`); the EPUB reader then checks it is a book (META-INF/container.xml).
- HTML: after a byte-order mark and white space, one of the tags the WHATWG MIME sniffing standard
  ("rules for identifying an unknown MIME type", HTML patterns) names: `<!DOCTYPE HTML`, `<HTML`, `<HEAD`,
  `<BODY`, `<P`, `<DIV`, `<TITLE`, `<SCRIPT`, ... or `<!--`, each followed by a space or `>` (case ignored);
  an XHTML file's `<?xml ...?>` declaration is skipped first.
- anything else: text, read exactly as before (UTF-8, `--errors`).

So `paper.pdf` holding an HTML page is read as HTML, and `notes.txt` holding a PDF as a PDF.
A leaf module: it imports nothing from memagent.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

KINDS = ("text", "pdf", "html", "epub")
HEAD_BYTES = 4096  # read to decide

_BOM = (b"\xef\xbb\xbf",)
_HTML_TAGS = (b"!doctype html", b"html", b"head", b"script", b"iframe", b"h1", b"div", b"font", b"table", b"a",
              b"style", b"title", b"b", b"body", b"br", b"p")  # the WHATWG sniffing table's HTML patterns
_XML_DECL = re.compile(rb"<\?xml[^>]{0,500}\?>")


def sniff(head: bytes) -> str:
    """The kind ("pdf" | "epub" | "html" | "text") of a document whose first bytes are `head`."""
    if b"%PDF-" in head[:1024]:
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        return "epub"
    return "html" if looks_like_html(head) else "text"


def looks_like_html(head: bytes) -> bool:
    """Whether `head` opens with one of the WHATWG HTML patterns (see the module's docstring)."""
    rest = head
    for bom in _BOM:
        if rest.startswith(bom):
            rest = rest[len(bom):]
    rest = rest.lstrip(b" \t\n\r\x0c")
    m = _XML_DECL.match(rest)
    if m:
        rest = rest[m.end():].lstrip(b" \t\n\r\x0c")
        while rest.startswith(b"<!--") and b"-->" in rest:  # comments between the declaration and the root
            rest = rest[rest.index(b"-->") + 3:].lstrip(b" \t\n\r\x0c")
    low = rest[:64].lower()
    if low.startswith(b"<!--"):
        return True
    for tag in _HTML_TAGS:
        n = len(tag) + 1
        if low.startswith(b"<" + tag) and low[n:n + 1] in (b" ", b">", b"\t", b"\n", b"\r", b"\x0c"):
            return True
    return False


def detect(path: str | os.PathLike) -> str:
    """The kind of the file at `path`, from its first `HEAD_BYTES` bytes. A path that is not a regular file (a
    pipe, `<(cmd)`, a device) is text, as before: reading its first bytes here would take them from the reader."""
    if not Path(path).is_file():
        return "text"
    with open(Path(path), "rb") as f:
        return sniff(f.read(HEAD_BYTES))

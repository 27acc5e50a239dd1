"""A PDF's text layer, page by page, with pypdf (pure Python; the optional extra `documents`).

The file is opened as a file object, not a path: pypdf then reads objects from the file as they are needed
(given a path it would read the whole file into memory first). The page tree is walked one page at a time, and
after each page the reader's cache of parsed objects is emptied, so RAM stays flat in the number of pages
(bench/documents.py: a 2,000-page PDF against a 20-page one). Each page's text is one piece,
`Location("page", n)` ("page 214"), n counted from 1.

Refused before any model call (`check_pdf`), each with one DocumentError line:
- a file that starts like a PDF but is none, or is truncated (no `%%EOF` in its last 2 KiB) or corrupt;
- an encrypted PDF that needs a password (one that opens with the empty password, e.g. a copy-protected
  paper, is read);
- a page tree that loops, is deeper than `MAX_TREE_DEPTH` or names more than `MAX_PAGES` pages (the tree is
  walked here, one page at a time: pypdf's `reader.pages` would build every page object at once);
- a PDF with no pages, or with no text on any page: a scan ("no text layer: run OCR first").
A page that fails later, while it is read, is the same error naming its page.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from memagent.documents.errors import DocumentError, missing_extra
from memagent.documents.location import Location

TAIL_BYTES = 2048  # where %%EOF must be: the end of the file (pypdf's strict mode looks in the last 1 KiB)
MAX_TREE_DEPTH = 256  # levels of the page tree (real files have a handful)
MAX_PAGES = 100_000  # pages a tree may name: bounds a tree that repeats its branches (2**n pages from n levels)
INHERITED = ("/Resources", "/MediaBox", "/CropBox", "/Rotate")  # what a page inherits from its /Pages ancestors
OCR_HINT = "no text layer: run OCR first (e.g. `ocrmypdf IN.pdf OUT.pdf`), then give the PDF it writes"


@contextmanager
def _quiet() -> Iterator[None]:
    """pypdf's warnings about a damaged file go to the log at WARNING; keep them off the terminal."""
    log = logging.getLogger("pypdf")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _pypdf(path: Path) -> Any:
    try:
        import pypdf  # lazy: pypdf
    except ImportError:
        raise missing_extra("PDF", "pypdf", str(path)) from None
    return pypdf


def _bad(path: Path, e: BaseException) -> DocumentError:
    what = str(e).strip() or type(e).__name__
    return DocumentError(f"{path} starts like a PDF but cannot be read as one (pypdf: {what[:200]}); it may be "
                         "truncated or corrupt: get the file again, or save it again from the program that made it")


@contextmanager
def open_pdf(path: str | os.PathLike) -> Iterator[Any]:
    """A pypdf reader over the open file `path`, decrypted; DocumentError for a file it cannot open."""
    path = Path(path)
    pypdf = _pypdf(path)
    with open(path, "rb") as f, _quiet():
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - TAIL_BYTES))
        if b"%%EOF" not in f.read():
            raise DocumentError(f"{path} is a truncated or corrupt PDF (no %%EOF at its end); get the whole file again")
        f.seek(0)
        try:
            reader = pypdf.PdfReader(f)
            _decrypt(reader, path, pypdf)
            _catalog(reader, path)  # a file without a catalog fails here, not mid-read
        except DocumentError:
            raise
        except Exception as e:  # noqa: BLE001  (whatever pypdf raises on a damaged file is the file's fault)
            raise _bad(path, e) from None
        yield reader


def _decrypt(reader: Any, path: Path, pypdf: Any) -> None:
    if not reader.is_encrypted:
        return
    try:
        opened = reader.decrypt("") != pypdf.PasswordType.NOT_DECRYPTED
    except pypdf.errors.DependencyError:
        raise DocumentError(f"{path} is an encrypted PDF (AES) and decrypting it needs the package cryptography "
                            "(pip install cryptography), or decrypt it first (qpdf --decrypt IN.pdf OUT.pdf)") from None
    if not opened:
        raise DocumentError(f"{path} is an encrypted PDF that needs a password; decrypt it first "
                            "(e.g. qpdf --password=PASSWORD --decrypt IN.pdf OUT.pdf) and give the decrypted file")


def iter_pages(reader: Any, path: Path) -> Iterator[Any]:
    """The pages of the page tree in order, one at a time (pypdf's `reader.pages` would build them all at once),
    each with the attributes it inherits (Resources, MediaBox, CropBox, Rotate). A node that is its own
    ancestor, a tree deeper than `MAX_TREE_DEPTH` or one naming more than `MAX_PAGES` pages is a DocumentError."""
    from pypdf import PageObject  # lazy: pypdf
    from pypdf.generic import DictionaryObject, IndirectObject, NameObject  # lazy: pypdf
    frames: list[tuple[Any, dict[str, Any], Iterator[Any]]] = []  # the /Pages nodes on the path  [<= MAX_TREE_DEPTH]
    item: tuple[Any, dict[str, Any]] | None = (_catalog(reader, path).get("/Pages"), {})
    pages = 0
    while item is not None:
        ref, inherit = item
        node = ref.get_object() if ref is not None else None
        key = ref.idnum if isinstance(ref, IndirectObject) else id(node)
        if isinstance(node, DictionaryObject) and ("/Kids" in node or node.get("/Type") == "/Pages"):
            if any(k == key for k, _, _ in frames):
                raise DocumentError(f"{path}: its page tree loops (object {key} is its own ancestor); the PDF is "
                                    "corrupt: save it again from the program that made it")
            if len(frames) >= MAX_TREE_DEPTH:
                raise DocumentError(f"{path}: its page tree is deeper than {MAX_TREE_DEPTH} levels; the PDF is corrupt")
            kids = node.get("/Kids")
            kids = kids.get_object() if kids is not None else []
            inherited = {**inherit, **{a: node[a] for a in INHERITED if a in node}}
            frames.append((key, inherited, iter(kids if isinstance(kids, list) else [])))
        elif isinstance(node, DictionaryObject) and node:
            pages += 1
            if pages > MAX_PAGES:
                raise DocumentError(f"{path}: its page tree names more than {MAX_PAGES:,} pages; the PDF is corrupt "
                                    "or hostile (a tree that repeats its branches)")
            page = PageObject(reader, ref if isinstance(ref, IndirectObject) else None)
            page.update(node)
            for name, value in inherit.items():
                if name not in page:
                    page[NameObject(name)] = value
            yield page
        item = _next_kid(frames)


def _next_kid(frames: list[tuple[Any, dict[str, Any], Iterator[Any]]]) -> tuple[Any, dict[str, Any]] | None:
    while frames:
        _, inherited, kids = frames[-1]
        kid = next(kids, None)
        if kid is not None:
            return kid, inherited
        frames.pop()
    return None


def _catalog(reader: Any, path: Path) -> Any:
    try:
        return reader.root_object
    except Exception as e:  # noqa: BLE001
        raise _bad(path, e) from None


def page_text(reader: Any, page: Any, n: int, path: Path) -> str:
    """The text of `page` (number `n`, from 1). The reader's cache of parsed objects is emptied after it, so RAM
    stays flat in the number of pages."""
    try:
        return page.extract_text() or ""
    except Exception as e:  # noqa: BLE001  (a damaged page: the file's fault)
        raise DocumentError(f"{path}: page {n} cannot be read (pypdf: {str(e)[:200] or type(e).__name__}); the "
                            "PDF is damaged: save it again from the program that made it") from None
    finally:
        reader.resolved_objects.clear()


def _pages(reader: Any, path: Path) -> Iterator[tuple[int, Any]]:
    """(number from 1, page) of every page; an error of pypdf while walking the tree is a DocumentError."""
    pages = iter_pages(reader, path)
    n = 0
    while True:
        try:
            page = next(pages, None)
        except DocumentError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _bad(path, e) from None
        if page is None:
            return
        n += 1
        yield n, page


def check_pdf(path: str | os.PathLike) -> int:
    """The number of pages of a PDF that can be read; DocumentError for one that cannot (see the module's
    docstring). The whole page tree is walked; pages are read up to the first with text (a scan is read
    through, to find it has none)."""
    path = Path(path)
    with open_pdf(path) as reader:
        text_on = None
        count = 0
        for n, page in _pages(reader, path):
            count = n
            if text_on is None and page_text(reader, page, n, path).strip():
                text_on = n
            if n % 256 == 0:
                reader.resolved_objects.clear()
    if count == 0:
        raise DocumentError(f"{path} is a PDF with no pages; give one that holds the document")
    if text_on is None:
        raise DocumentError(f"{path} is a PDF with no text on any of its {count} page(s): {OCR_HINT}")
    return count


def pdf_segments(path: str | os.PathLike) -> Iterator[tuple[str, Location]]:
    """The text of every page of the PDF `path`, in page order: (text, Location("page", n))."""
    path = Path(path)
    with open_pdf(path) as reader:
        for n, page in _pages(reader, path):
            text = page_text(reader, page, n, path)
            if text.strip():
                yield text if text.endswith("\n") else text + "\n", Location("page", n)

"""An EPUB book's text, chapter by chapter in spine order, with ebooklib (the optional extra `documents`).

Before ebooklib opens the archive (it reads every file of the book into memory), the ZIP's directory is checked:
at most `MAX_ENTRIES` files, unpacking to at most `MAX_UNPACKED_BYTES` in all (a zip bomb is refused here; the
`zipfile` module stops each file at its declared size, so the declared sizes bound what is unpacked). Pictures,
fonts, audio and video are not read at all. Each spine item is read with the HTML walker (memagent.documents.html,
the whole chapter, no navigation or scripts; its bytes as the archive holds them, decoded here as the other readers
decode theirs: a bad byte is an error under --errors strict) and is one place, `Location("chapter", n, title)`: n its place
among the spine items that hold text, its title the table of contents' entry for it, else its first heading.

Refused with one DocumentError line: a ZIP that is not an EPUB (no META-INF/container.xml), a damaged archive or
package file, a spine item that is missing from the manifest or from the archive, a book with no chapter text.
"""
from __future__ import annotations

import codecs
import os
import posixpath
import zipfile
from pathlib import Path
from typing import Any, Iterator

from memagent.documents.errors import DocumentError, missing_extra
from memagent.documents.html import html_encoding, html_text_segments
from memagent.documents.location import Location, shorten

MAX_UNPACKED_BYTES = 512 << 20  # a novel is a few MB unpacked; illustrated books a few hundred
MAX_ENTRIES = 20_000  # files in the archive
MEDIA = frozenset(".jpg .jpeg .png .gif .webp .svgz .bmp .tif .tiff .ttf .otf .woff .woff2 .mp3 .mp4 .m4a .ogg "
                  ".wav .webm .avi .mov".split())  # not read: no text


def check_archive(path: Path) -> None:
    """The ZIP directory's bounds and the EPUB's container file, before anything is unpacked."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as e:
        raise DocumentError(f"{path} starts like a ZIP archive (an EPUB is one) but cannot be read as one ({e}); "
                            "it may be truncated or corrupt: get the file again") from None
    if len(infos) > MAX_ENTRIES:
        raise DocumentError(f"{path} is an archive of {len(infos):,} files, over the limit of {MAX_ENTRIES:,} for an "
                            "EPUB book")
    unpacked = sum(i.file_size for i in infos)
    if unpacked > MAX_UNPACKED_BYTES:
        raise DocumentError(f"{path} unpacks to {unpacked:,} bytes, over the limit of {MAX_UNPACKED_BYTES:,} for an "
                            "EPUB book (a zip bomb?); nothing was unpacked")
    if "META-INF/container.xml" not in {i.filename for i in infos}:
        raise DocumentError(f"{path} is a ZIP archive but not an EPUB book (it has no META-INF/container.xml); "
                            "give an EPUB, a PDF, an HTML page or a text file")


def _ebooklib(path: Path) -> Any:
    try:
        from ebooklib import epub  # lazy: ebooklib
    except ImportError:
        raise missing_extra("EPUB", "ebooklib", str(path)) from None
    return epub


def open_book(path: str | os.PathLike) -> Any:
    """The ebooklib book of `path` (its text files only), checked: every spine item is in the book."""
    path = Path(path)
    check_archive(path)
    epub = _ebooklib(path)

    class TextOnly(epub.EpubReader):  # type: ignore[misc, name-defined]
        def read_file(self, name: str) -> bytes:
            return b"" if posixpath.splitext(name)[1].lower() in MEDIA else super().read_file(name)

    try:
        book = TextOnly(str(path), {"ignore_ncx": True}).load()
    except KeyError as e:
        raise DocumentError(f"{path}: the EPUB lists a file its archive does not hold ({e.args[0] if e.args else e}); "
                            "the book is damaged: get it again") from None
    except Exception as e:  # noqa: BLE001  (whatever ebooklib raises on a damaged book is the file's fault)
        raise DocumentError(f"{path} is not a readable EPUB book (ebooklib: {str(e)[:200] or type(e).__name__}); "
                            "the book is damaged: get it again") from None
    for idref, _ in book.spine:
        if book.get_item_with_id(idref) is None:
            raise DocumentError(f"{path}: the EPUB's spine names the item {str(idref)[:80]!r}, which its manifest "
                                "does not hold; the book is damaged: get it again")
    return book


def _toc_titles(toc: Any, into: dict[str, str]) -> dict[str, str]:
    """{file name: title} of the table of contents (the first entry naming a file wins)."""
    for entry in toc or []:
        if isinstance(entry, (tuple, list)) and len(entry) == 2:
            _toc_titles([entry[0]], into)
            _toc_titles(entry[1], into)
            continue
        href, title = getattr(entry, "href", None), getattr(entry, "title", None)
        if href and title:
            into.setdefault(str(href).split("#")[0], shorten(str(title)))
    return into


def _chapter_text(item: Any, path: Path, errors: str) -> tuple[str, str | None]:
    """(the chapter's text, its first heading or None)."""
    # the bytes as the archive holds them: ebooklib's get_content() re-serialises an XHTML chapter through lxml,
    # which repairs bad bytes with U+FFFD (whatever --errors says) and drops a chapter nested past lxml's depth
    raw = item.content or b""
    if not isinstance(raw, bytes):
        raw = str(raw).encode("utf-8")
    encoding = html_encoding(raw[:4096])
    try:
        text = codecs.decode(raw, encoding, errors)
    except UnicodeDecodeError as e:
        name = "UTF-8" if encoding.startswith("utf-8") else encoding
        raise DocumentError(f"{path}: chapter file {item.get_name()} is not valid {name} (byte {e.start}: "
                            f"{e.reason}); pass --errors replace to substitute U+FFFD for bad bytes") from None
    pieces = list(html_text_segments([text], f"{path}: {item.get_name()}", skip_frame=False))
    heading = next((loc.title for _, loc in pieces if loc.title), None)
    return "".join(t for t, _ in pieces), heading


def epub_segments(path: str | os.PathLike, errors: str = "strict") -> Iterator[tuple[str, Location]]:
    """The text of every chapter of the EPUB `path`, in spine order: (text, Location("chapter", n, title))."""
    path = Path(path)
    book = open_book(path)
    epub = _ebooklib(path)
    titles = _toc_titles(book.toc, {})
    n = 0
    for idref, _ in book.spine:
        item = book.get_item_with_id(idref)
        if isinstance(item, epub.EpubNav) or not isinstance(item, epub.EpubHtml):
            continue
        text, heading = _chapter_text(item, path, errors)
        if not text.strip():
            continue
        n += 1
        title = titles.get(item.get_name(), heading)
        yield (text if text.endswith("\n") else text + "\n"), Location("chapter", n, title)


def check_epub(path: str | os.PathLike, errors: str = "strict") -> int:
    """The number of chapters with text; DocumentError for a book that cannot be read or holds no text."""
    n = sum(1 for _ in epub_segments(path, errors))
    if n == 0:
        raise DocumentError(f"{path} is an EPUB book with no text in its chapters (pictures only?); give one with text")
    return n

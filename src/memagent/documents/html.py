"""An HTML page's main text, streamed heading by heading: no scripts, styles, navigation, headers or footers.

The page is read in blocks of 64 KiB through the standard library's `html.parser` (the tokenizer BeautifulSoup's
default builder uses), so no tree is built and RAM does not grow with the page; only the chain of open elements
is kept, and it is bounded (`MAX_DEPTH`). Two passes over the file:

1. a check: the file's size (`MAX_HTML_BYTES`, before any parsing), the nesting depth, and whether the page
   marks its main text (`<main>`, `<article>` or `role="main"`);
2. the text: when the page marks its main text, only the text inside those elements; always without the
   elements that hold no reading text (`SKIP`: script, style, nav, form, ... and any element `hidden`,
   `aria-hidden="true"` or of a navigation role; header, footer and aside outside the main text).

Each heading (h1-h6) starts a new place (`Location("heading", n, title)`): the text under it is "heading
"Methods"" in the trace. Block elements end a line; runs of white space become one space (not inside <pre>).
The byte encoding is the byte-order mark's, else a `<meta charset>` in the first 4 KiB that names a text encoding,
else UTF-8 (`html_encoding`: a charset Python knows as a codec but that is no text encoding, zlib, base64, rot13,
punycode, unicode_escape, UTF-7 ..., or UTF-16/32, which a `<meta>` readable as ASCII cannot be, is ignored, as
browsers ignore a label they do not know). EPUB chapters (XHTML) are read with the same walker
(`html_text_segments`).

Time is linear in the page for every shape (issue 48, class 4): the parser rescans a construct it has not seen the
end of (a tag whose attribute runs on for megabytes, an unclosed comment) at each feed, so a block is fed only
once the text waiting is at least as long as what the parser holds (`_feeds`): the rescans sum to O(n).
"""
from __future__ import annotations

import codecs
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterable, Iterator

from memagent.documents.errors import DocumentError
from memagent.documents.location import Location, shorten

MAX_HTML_BYTES = 64 << 20  # a web page or an HTML book is a few MB; past this, save its text as a .txt file
MAX_DEPTH = 1_000  # open elements at once (browsers cap the DOM's depth near 512); deeper is no page to read
BLOCK_BYTES = 1 << 16

SKIP = frozenset("script style noscript template nav form button select textarea svg math iframe object canvas "
                 "head menu dialog".split())
OUTSIDE_MAIN_SKIP = frozenset({"header", "footer", "aside"})
SKIP_ROLES = frozenset({"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar"})
MAIN = frozenset({"main", "article"})
HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
BLOCK = frozenset("address article aside blockquote br dd div dl dt figcaption figure footer h1 h2 h3 h4 h5 h6 "
                  "header hr li main ol p pre section table td th tr ul".split())
SELF_CLOSING = {"p": {"p"}, "li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"}, "tr": {"tr", "td", "th"},
                "td": {"td", "th"}, "th": {"td", "th"}, "option": {"option"}}  # a start tag ends an open one of these
_SPACE = re.compile(r"\s+")
MAX_TAG_TOKENS = 10_000  # names, values and '=' of one start tag; real tags have a few dozen
LONG_TAG = 1 << 16  # a start tag with no '>' within this many characters has its tokens counted first
_TAG_TOKEN = re.compile(r""""[^"]*"|'[^']*'|[^\s"'>]+|>""")
_XML_ENCODING = re.compile(rb"""\s*<\?xml[^>]{0,200}?encoding\s*=\s*["']([A-Za-z0-9_.:-]{1,40})["']""")
_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.I)


class _Walker(HTMLParser):
    """The text of the page as (text, Location) pieces, collected by `take()` after each `feed`."""

    def __init__(self, name: str, only_main: bool, skip_frame: bool = True) -> None:
        super().__init__(convert_charrefs=True)
        self.name, self.only_main, self.skip_frame = name, only_main, skip_frame
        self.stack: list[str] = []  # open elements, outermost first  [<= MAX_DEPTH]
        self.skip_at: int | None = None  # stack depth where a skipped element opened
        self.main_at: int | None = None  # stack depth where the main text opened
        self.pre = 0
        self.has_main = False
        self.headings = 0
        self.loc = Location("heading", 0)
        self.heading: list[str] | None = None  # the text of the heading being read
        self.buf: list[str] = []
        self.out: list[tuple[str, Location]] = []
        self.at_line_start = True

    # -- the chain of open elements ---------------------------------------------------------------
    def check_for_whole_start_tag(self, i: int) -> int:
        """The parser's own check, after a bound: a start tag that runs on with no '>' in sight has its tokens
        counted first (O(1) memory); past MAX_TAG_TOKENS it is a DocumentError. The parser's regex keeps a frame
        per attribute, so `<a b c=d b c=d ...` for megabytes took some 250 bytes of RAM per byte of the page."""
        raw = self.rawdata
        if len(raw) - i > LONG_TAG and raw.find(">", i, i + LONG_TAG) < 0:
            n = 0
            for m in _TAG_TOKEN.finditer(raw, i + 1):
                if m.group() == ">":
                    break
                n += 1
                if n > MAX_TAG_TOKENS:
                    line = self.getpos()[0]
                    raise DocumentError(f"{self.name}: an HTML tag with more than {MAX_TAG_TOKENS:,} attributes "
                                        f"(line {line}); no page a reader can use has one: save its text as a .txt "
                                        "file")
        return super().check_for_whole_start_tag(i)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in SELF_CLOSING and self.stack and self.stack[-1] in SELF_CLOSING[tag]:
            self._pop_to(len(self.stack) - 1)
        elif tag in BLOCK and self.stack and self.stack[-1] == "p":
            self._pop_to(len(self.stack) - 1)
        if tag in BLOCK:
            self._newline()
        if tag in VOID:
            return
        a = {k: (v or "") for k, v in attrs}
        depth = len(self.stack)
        is_main = tag in MAIN or a.get("role") == "main"
        if is_main:
            self.has_main = True
            if self.main_at is None:
                self.main_at = depth
        if self.skip_at is None and self._skipped(tag, a):
            self.skip_at = depth
        self.stack.append(tag)
        if len(self.stack) > MAX_DEPTH:
            line = self.getpos()[0]
            raise DocumentError(f"{self.name}: HTML nested deeper than {MAX_DEPTH:,} elements (line {line}); "
                                "no page a reader can use is nested so deep: save its text as a .txt file")
        if tag == "pre":
            self.pre += 1
        if tag in HEADINGS and self._reading():
            self._flush()
            self.heading = []

    def _skipped(self, tag: str, a: dict[str, str]) -> bool:
        return (tag in SKIP or "hidden" in a or a.get("aria-hidden", "").lower() == "true"
                or a.get("role", "").lower() in SKIP_ROLES
                or (self.skip_frame and tag in OUTSIDE_MAIN_SKIP and self.main_at is None))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCK:
            self._newline()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] == tag:
                self._pop_to(i)
                break
        if tag in BLOCK:
            self._newline()

    def _pop_to(self, i: int) -> None:
        """Close the open elements from the innermost down to (and with) the one at depth `i`."""
        while len(self.stack) > i:
            tag = self.stack.pop()
            depth = len(self.stack)
            if tag == "pre":
                self.pre -= 1
            if tag in HEADINGS and self.heading is not None:
                self._heading_done()
            if self.skip_at is not None and depth <= self.skip_at:
                self.skip_at = None
            if self.main_at is not None and depth <= self.main_at:
                self.main_at = None

    # -- the text -----------------------------------------------------------------------------------
    def _reading(self) -> bool:
        return self.skip_at is None and (self.main_at is not None or not self.only_main)

    def handle_data(self, data: str) -> None:
        if not self._reading():
            return
        if not self.pre:
            data = _SPACE.sub(" ", data)
            if self.at_line_start:
                data = data.lstrip(" ")
        if not data:
            return
        (self.heading if self.heading is not None else self.buf).append(data)
        self.at_line_start = data.endswith("\n")

    def _newline(self) -> None:
        if self._reading() and not self.at_line_start:
            (self.heading if self.heading is not None else self.buf).append("\n")
            self.at_line_start = True

    def _heading_done(self) -> None:
        title = shorten("".join(self.heading or []))
        self.heading = None
        if not title:
            return
        self.headings += 1
        self.loc = Location("heading", self.headings, title)
        self.buf.append(title + "\n")
        self.at_line_start = True

    def _flush(self) -> None:
        if self.buf:
            text = "".join(self.buf)
            self.buf = []
            if text.strip():
                self.out.append((text, self.loc))

    def take(self, final: bool = False) -> list[tuple[str, Location]]:
        """The pieces read so far (all of them when `final`)."""
        if final or len(self.buf) > 256:
            self._flush()
        out, self.out = self.out, []
        return out


def _feeds(walker: HTMLParser, blocks: Iterable[str]) -> Iterator[None]:
    """Feed `blocks` to `walker`, yielding after each feed. The parser keeps what it could not finish (`rawdata`:
    an unfinished tag, comment or character reference) and rescans it whole at the next feed; text is held back
    until it is at least as long as that, so each rescan is paid for by as much new text and the total is
    linear (feeding block by block was quadratic in a 50 MB attribute)."""
    held: list[str] = []
    size = 0
    for block in blocks:
        held.append(block)
        size += len(block)
        if size < len(walker.rawdata):
            continue
        walker.feed("".join(held))
        held, size = [], 0
        yield
    if held:
        walker.feed("".join(held))
        yield


def html_text_segments(blocks: Iterable[str], name: str, only_main: bool = False,
                       skip_frame: bool = True) -> Iterator[tuple[str, Location]]:
    """The text of HTML given as text blocks, as (text, Location) pieces, heading by heading. only_main: only the
    text inside <main>/<article>; skip_frame: leave out header, footer and aside outside them (a web page's frame;
    an EPUB chapter's <header> holds its title, so chapters keep them)."""
    walker = _Walker(name, only_main, skip_frame)
    for _ in _feeds(walker, blocks):
        yield from walker.take()
    walker.close()
    yield from walker.take(final=True)


def marks_main_text(blocks: Iterable[str], name: str) -> bool:
    """Pass 1: whether the page marks its main text; raises DocumentError for nesting past `MAX_DEPTH`."""
    walker = _Walker(name, only_main=False)
    for _ in _feeds(walker, blocks):
        walker.out, walker.buf = [], []
    walker.close()
    return walker.has_main


def html_segments(path: str | os.PathLike, errors: str = "strict") -> Iterator[tuple[str, Location]]:
    """The main text of the HTML file `path`, heading by heading (see the module's docstring)."""
    path = Path(path)
    encoding = check_html(path)
    only_main = marks_main_text(_text_blocks(path, encoding, errors), str(path))
    return html_text_segments(_text_blocks(path, encoding, errors), str(path), only_main)


def check_html_file(path: str | os.PathLike, errors: str = "strict") -> bool:
    """Pass 1 alone (size, encoding, nesting): whether the page marks its main text; DocumentError else."""
    path = Path(path)
    return marks_main_text(_text_blocks(path, check_html(path), errors), str(path))


def check_html(path: Path) -> str:
    """The file's byte encoding; DocumentError for a file over `MAX_HTML_BYTES` (checked before parsing)."""
    size = path.stat().st_size
    if size > MAX_HTML_BYTES:
        raise DocumentError(f"{path} is {size:,} bytes of HTML, over the limit of {MAX_HTML_BYTES:,} for an HTML "
                            "document; save its text as a .txt file (plain text is read as a stream, of any length)")
    with open(path, "rb") as f:
        return html_encoding(f.read(4096))


# codecs Python counts as text encodings that no page is written in: they fail on ordinary bytes (punycode, idna,
# undefined), turn escapes into lone surrogates (unicode_escape, raw_unicode_escape, utf-7), or cannot be what a
# <meta> readable as ASCII declares (UTF-16/32: the WHATWG rule reads such a page as UTF-8)
NOT_PAGE_ENCODINGS = frozenset({"punycode", "idna", "undefined", "unicode-escape", "raw-unicode-escape", "utf-7",
                                "charmap", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"})


def page_encoding(label: str) -> str | None:
    """The codec name of a `<meta charset>` label when it is a text encoding a page can be written in, else None:
    an unknown label, a codec that is no text encoding (zlib, bz2, base64, hex, uu, quopri, rot13: bytes to bytes
    or text to text) or one of `NOT_PAGE_ENCODINGS`."""
    try:
        info = codecs.lookup(label)
    except LookupError:
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in NOT_PAGE_ENCODINGS:
        return None
    return info.name


def html_encoding(head: bytes) -> str:
    """The encoding of HTML starting with `head`: its byte-order mark's, its XML declaration's or else its
    `<meta charset>`'s when that names a text encoding (`page_encoding`), else UTF-8."""
    for bom, enc in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if head.startswith(bom):
            return enc
    m = _XML_ENCODING.match(head) or _CHARSET.search(head)  # an XHTML file's <?xml ... encoding?> comes first
    if m:
        return page_encoding(m.group(1).decode("ascii")) or "utf-8"
    return "utf-8"


def _text_blocks(path: Path, encoding: str, errors: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder(encoding)(errors=errors)
    offset = 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(BLOCK_BYTES)
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise DocumentError(f"{path} is not valid {encoding} (byte {offset + e.start}: {e.reason}); save it "
                                    "as UTF-8, or pass --errors replace to substitute U+FFFD for bad bytes") from None
            offset += len(raw)
            if text:
                yield text
            if not raw:
                return

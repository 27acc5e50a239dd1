"""Nothing lost and no traceback, round 5 (issue 48): documents (HTML charsets that are not text encodings, a
quadratic HTML attribute, EPUB chapters decoded by memagent) and GGUF headers, full disks and the conversion cache.
Each case: exit code 2, one `error:` line, no traceback, nothing written (or the documented fallback)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import memagent.backends
from documents_fixture import epub_book, replaced_in_member
from memagent.cli import run
from memagent.documents import DocumentError, check_document, document_segments

SMALL = ["--chunk-tokens", "40", "--memory-tokens", "6", "--answer-tokens", "6", "--no-progress"]


def _no_model(*_args, **_kwargs):
    raise AssertionError("a model was loaded")


def _one_error_line(err: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err


# -- class 3: a <meta charset> that is no text encoding ----------------------------------------------------------
NOT_TEXT = ["zlib", "bz2", "base64", "hex", "uu", "quopri", "rot13", "utf-16", "UTF-32", "punycode", "idna",
            "unicode_escape", "raw_unicode_escape", "utf-7", "undefined"]


@pytest.mark.parametrize("charset", NOT_TEXT)
def test_a_charset_that_is_no_text_encoding_is_read_as_utf8(charset, tmp_path):
    """The documented fallback: such a label is ignored and the page read as UTF-8, its text as written (no
    inflated page, no lone surrogate, no traceback); a page that is not UTF-8 then is one DocumentError."""
    page = tmp_path / "p.html"
    body = "<p>caf\u00e9 \\ud800 +2D8- eJzLSM3JyVcozy_KSQEAGgQEXQ==</p>"
    page.write_bytes(f'<html><head><meta charset="{charset}"></head><body>{body}</body></html>'.encode())
    assert check_document(page) == "html"
    text = "".join(t for t, _ in document_segments(page, "html"))
    assert text.strip() == "caf\u00e9 \\ud800 +2D8- eJzLSM3JyVcozy_KSQEAGgQEXQ=="
    text.encode("utf-8")  # no lone surrogate
    page.write_bytes(f'<html><meta charset="{charset}"><p>caf\xe9</p>'.encode("latin-1"))
    with pytest.raises(DocumentError, match=r"is not valid utf-8 \(byte \d+"):
        check_document(page)


def test_a_text_encoding_named_by_meta_is_still_honoured(tmp_path):
    page = tmp_path / "p.html"
    page.write_bytes('<html><meta charset="windows-1252"><p>caf\xe9 \x80</p>'.encode("latin-1"))
    assert "".join(t for t, _ in document_segments(page, "html")).strip() == "caf\u00e9 \u20ac"


@pytest.mark.parametrize("charset", ["zlib", "unicode_escape", "punycode"])
def test_ask_reads_such_a_page_or_refuses_it_in_one_line(charset, tmp_path, monkeypatch, capsys, tiny_model_dir):
    """Through `ask --document` (a page that is not UTF-8 under such a charset: one line, no model loaded) and
    `ask --input` (the same line, the run not aborted by a traceback)."""
    page = tmp_path / "p.html"
    page.write_bytes(f'<html><meta charset="{charset}"><p>caf\xe9 x\\ud800</p>'.encode("latin-1"))
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)
    trace = tmp_path / "t.jsonl"
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(page), "--question", "q",
                "--trace", str(trace), *SMALL])
    err = capsys.readouterr().err
    assert code == 2, err
    _one_error_line(err)
    assert "p.html is not valid utf-8 (byte " in err and not trace.exists()
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "question": "q", "document": "p.html"}\n')
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"),
                *SMALL])
    err = capsys.readouterr().err
    assert code == 2, err
    _one_error_line(err)
    assert "in.jsonl:1" in err and "is not valid utf-8" in err


def test_serve_removes_a_refused_upload_whatever_the_check_raised(tmp_path, monkeypatch):
    """A document the check refuses with an error that is not a DocumentError is removed too: nothing a refused
    upload brought stays in the state folder."""
    import asyncio

    from memagent.serve import documents as store_module

    store = store_module.DocumentStore(tmp_path / "docs", 1 << 20)

    async def body():
        yield b"<meta charset='zlib'><p>text</p>"

    doc_id, _ = asyncio.run(store.save_stream(body()))

    def broken(path, errors="strict"):
        raise LookupError("a codec the check did not expect")

    monkeypatch.setattr(store_module, "check_document", broken)
    with pytest.raises(LookupError):
        store.check(doc_id)
    assert list((tmp_path / "docs").iterdir()) == []


# -- class 4: one huge attribute, linear time -----------------------------------------------------------------------
def _shape_seconds(tmp_path: Path, name: str, make) -> tuple[float, float]:
    """Seconds to read a page of shape `make(n)` at 1 and 8 MB."""
    out = []
    for mb in (1, 8):
        page = tmp_path / f"{name}{mb}.html"
        page.write_bytes(make(mb << 20))
        t0 = time.perf_counter()
        try:
            for _ in document_segments(page, "html"):
                pass
        except DocumentError:
            pass
        out.append(time.perf_counter() - t0)
    return out[0], out[1]


def test_a_long_attribute_is_read_in_linear_time(tmp_path):
    """8 times the attribute costs at most about 8 times the time (quadratic was 64 times: 8 MB took over 10 s)."""
    def attribute(n: int) -> bytes:
        return b'<html><body><p>before</p><img alt="' + b"a" * n + b'"><p>after</p></body></html>'

    one, eight = _shape_seconds(tmp_path, "attr", attribute)
    assert eight < 3.0 and eight < 20 * max(one, 0.02), (one, eight)
    page = tmp_path / "attr1.html"
    assert "".join(t for t, _ in document_segments(page, "html")).split() == ["before", "after"]


# -- class 5: EPUB chapters decoded by memagent ------------------------------------------------------------------
CHAPTERS = [("a.xhtml", "One", "<p>first chapter</p>"), ("b.xhtml", "Two", "<p>second chapter</p>")]


def test_an_epub_chapter_in_a_wrong_encoding_is_an_error_under_strict(tmp_path, monkeypatch, capsys,
                                                                   tiny_model_dir):
    pytest.importorskip("ebooklib")
    book = replaced_in_member(epub_book(tmp_path / "ok.epub", CHAPTERS), tmp_path / "bad.epub", "a.xhtml",
                              b"first chapter", b"first \xff chapter")
    with pytest.raises(DocumentError, match=r"chapter file a.xhtml is not valid UTF-8 \(byte \d+: invalid start"):
        check_document(book)
    pieces = [t for t, _ in document_segments(book, "epub", errors="replace")]  # --errors replace: U+FFFD
    assert "first \ufffd chapter" in pieces[0]
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(book), "--question", "q", *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    _one_error_line(err)
    assert "chapter file a.xhtml is not valid UTF-8" in err


def test_an_epub_chapter_nested_too_deep_or_with_a_codec_charset_is_named(tmp_path):
    pytest.importorskip("ebooklib")
    ok = epub_book(tmp_path / "ok.epub", CHAPTERS)
    deep = replaced_in_member(ok, tmp_path / "deep.epub", "a.xhtml", b"<p>first chapter</p>",
                              b"<div>" * 5000 + b"first chapter" + b"</div>" * 5000)
    with pytest.raises(DocumentError, match=r"a.xhtml: HTML nested deeper than 1,000 elements"):
        check_document(deep)
    zlib = replaced_in_member(ok, tmp_path / "zlib.epub", "a.xhtml", b"<head>",
                              b'<head><meta charset="zlib"/>')
    assert check_document(zlib) == "epub"
    assert "first chapter" in "".join(t for t, _ in document_segments(zlib, "epub"))

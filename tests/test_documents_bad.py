"""Bad documents (issue 37): each is one `error:` line and exit 2 before any model is loaded, with nothing
written (`ask`), or HTTP 400 with the upload removed (`serve`)."""
from __future__ import annotations

import json
import sys
import time
import zipfile
from pathlib import Path

import pytest

import memagent.backends
import memagent.documents.epub as epub_module
from documents_fixture import (epub_book, looping_pdf, pdf_pages, raw_pdf, replaced_in_member, scanned_pdf,
                               text_page_objects, with_member, without_member)
from memagent.cli import run

pytest.importorskip("pypdf")
pytest.importorskip("ebooklib")
pytest.importorskip("fpdf")

SMALL = ["--chunk-tokens", "40", "--memory-tokens", "6", "--answer-tokens", "6", "--no-progress"]
CHAPTERS = [("a.xhtml", "One", "<p>first chapter</p>"), ("b.xhtml", "Two", "<p>second chapter</p>")]


def _no_model(*_args, **_kwargs):
    raise AssertionError("a model was loaded")


def _encrypted(d: Path) -> Path:
    return pdf_pages(d / "locked.pdf", ["secret text"], password="pw")


def _scanned(d: Path) -> Path:
    return scanned_pdf(d / "scan.pdf")


def _truncated(d: Path) -> Path:
    whole = pdf_pages(d / "whole.pdf", ["text of page one " * 20, "page two " * 20]).read_bytes()
    (d / "cut.pdf").write_bytes(whole[: len(whole) * 2 // 3])
    return d / "cut.pdf"


def _corrupt(d: Path) -> Path:
    (d / "corrupt.pdf").write_bytes(b"%PDF-1.7\n" + b"\x00garbage bytes " * 50 + b"\n%%EOF\n")
    return d / "corrupt.pdf"


def _self_loop(d: Path) -> Path:
    return raw_pdf(d / "self.pdf", {1: "<< /Type /Catalog /Pages 2 0 R >>",
                                    2: "<< /Type /Pages /Kids [3 0 R 2 0 R] /Count 2 >>",
                                    **text_page_objects(3, "x", 2)})


def _zip_bomb(d: Path) -> Path:
    book = epub_book(d / "ok.epub", CHAPTERS)
    return with_member(book, d / "bomb.epub", "OEBPS/zeros.xhtml", bytes(2 << 20))  # 2 MiB of zeros: 2 KiB packed


def _missing_chapter(d: Path) -> Path:
    return without_member(epub_book(d / "ok.epub", CHAPTERS), d / "missing.epub", "b.xhtml")


def _spine_names_nothing(d: Path) -> Path:
    book = epub_book(d / "ok.epub", CHAPTERS)
    with zipfile.ZipFile(book) as z:
        opf = next(n for n in z.namelist() if n.endswith(".opf"))
        idref = z.read(opf).split(b'<itemref idref="')[2].split(b'"')[0]
    return replaced_in_member(book, d / "spine.epub", ".opf", b'<itemref idref="' + idref,
                              b'<itemref idref="no-such-item')


def _deep_html(d: Path) -> Path:
    (d / "deep.html").write_bytes(b"<html><body>" + b"<div>" * 1_000_000 + b"text")
    return d / "deep.html"


def _huge_html(d: Path) -> Path:
    with open(d / "huge.html", "wb") as f:  # 1 GiB, sparse: no disk is used
        f.write(b"<html><body><p>")
        f.truncate(1 << 30)
    return d / "huge.html"


def _fake_pdf(d: Path) -> Path:
    (d / "fake.pdf").write_bytes(b"%PDF-1.4\nthis is only text that starts like a PDF\n%%EOF\n")
    return d / "fake.pdf"


def _zip_not_epub(d: Path) -> Path:
    with zipfile.ZipFile(d / "report.epub", "w") as z:
        z.writestr("word/document.xml", "<w:document/>")
    return d / "report.epub"


BAD = [
    (_encrypted, "encrypted PDF that needs a password"),
    (_scanned, "no text layer: run OCR first"),
    (_truncated, "truncated or corrupt PDF"),
    (_corrupt, "starts like a PDF but cannot be read as one"),
    (looping_pdf, "page tree loops"),
    (_self_loop, "page tree loops"),
    (_zip_bomb, "over the limit of 1,048,576"),
    (_missing_chapter, "lists a file its archive does not hold"),
    (_spine_names_nothing, "spine names the item 'no-such-item'"),
    (_deep_html, "HTML nested deeper than 1,000 elements"),
    (_huge_html, "1,073,741,824 bytes of HTML"),
    (_fake_pdf, "starts like a PDF but cannot be read as one"),
    (_zip_not_epub, "not an EPUB book"),
]


def _make(maker, tmp_path: Path) -> Path:
    return maker(tmp_path) if maker is not looping_pdf else maker(tmp_path / "loop.pdf")


@pytest.fixture
def small_bomb_limit(monkeypatch):
    monkeypatch.setattr(epub_module, "MAX_UNPACKED_BYTES", 1 << 20)  # the same check, on a bomb the test can write


@pytest.mark.parametrize("maker, message", BAD, ids=[m.__name__.strip("_") for m, _ in BAD])
def test_ask_document_refuses_it_before_any_model_and_writes_nothing(maker, message, tmp_path, tiny_model_dir,
                                                                    monkeypatch, capsys, small_bomb_limit):
    doc = _make(maker, tmp_path)
    before = doc.read_bytes() if doc.stat().st_size < (64 << 20) else None
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)
    trace = tmp_path / "out" / "trace.jsonl"
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(doc), "--question", "q",
                "--trace", str(trace), *SMALL])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err
    assert not trace.exists() and not trace.parent.exists()
    if before is not None:
        assert doc.read_bytes() == before


def test_ask_input_names_the_line_and_writes_no_output(tmp_path, tiny_model_dir, monkeypatch, capsys):
    _encrypted(tmp_path)
    (tmp_path / "good.txt").write_text("the river is long")
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "question": "q", "document": "good.txt"}) + "\n"
                   + json.dumps({"id": "b", "question": "q", "document": "locked.pdf"}) + "\n")
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)
    out = tmp_path / "out.jsonl"
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(inp), "--output", str(out), *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "in.jsonl:2" in err and "encrypted PDF" in err
    assert not out.exists()


def test_an_owner_password_alone_is_read(tmp_path):
    """A copy-protected PDF (an owner password, no user password) opens with the empty password: it is read."""
    from fpdf import FPDF
    from fpdf.enums import EncryptionMethod

    from memagent.documents import check_document, document_segments

    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    pdf.add_page()
    pdf.multi_cell(0, 5, "readable words")
    pdf.set_encryption(owner_password="owner", encryption_method=EncryptionMethod.RC4)
    pdf.output(str(tmp_path / "protected.pdf"))
    assert check_document(tmp_path / "protected.pdf") == "pdf"
    assert [t.split() for t, _ in document_segments(tmp_path / "protected.pdf", "pdf")] == [["readable", "words"]]


# -- memagent serve ----------------------------------------------------------------------------------------
@pytest.fixture
def server(tiny_backend, tmp_path):
    pytest.importorskip("fastapi")
    sys.path.insert(0, str(Path(__file__).parent / "serve"))
    from serve_helpers import ThreadServer

    with ThreadServer(tiny_backend, tmp_path / "state", max_body_bytes=64_000, max_document_bytes=8_000_000) as s:
        yield s


@pytest.mark.slow
def test_serve_refuses_bad_uploads_with_400_and_reads_a_pdf_by_pages(server, tmp_path, small_bomb_limit):
    import httpx

    docs = tmp_path / "state" / "documents"
    for maker, message in [(_encrypted, "encrypted PDF"), (_scanned, "no text layer"), (_zip_bomb, "over the limit"),
                           (_deep_html, "nested deeper")]:
        data = maker(tmp_path).read_bytes()
        r = httpx.post(server.url + "/v1/documents", content=data)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
        assert str(docs) not in r.json()["error"]["message"]  # the server's folders stay private
        assert not [p for p in docs.iterdir() if p.name.startswith("doc_")]  # removed: no job can take it
    pdf = pdf_pages(tmp_path / "ok.pdf", [" ".join([w] * 30) for w in ("alpha", "bravo", "charlie")])
    up = httpx.post(server.url + "/v1/documents", files={"file": ("x.bin", pdf.read_bytes())})
    assert up.status_code == 201 and up.json()["kind"] == "pdf"
    job = httpx.post(server.url + "/v1/jobs", json={"document_id": up.json()["id"], "questions": ["Which?"]}).json()
    for _ in range(600):
        view = httpx.get(f"{server.url}/v1/jobs/{job['id']}").json()
        if view["state"] in ("done", "failed"):
            break
        time.sleep(0.1)
    assert view["state"] == "done", view
    sources = [s["source"] for s in view["questions"][0]["steps"]]
    assert sources[0] == "page 1" and sources[-1] == "page 3"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"

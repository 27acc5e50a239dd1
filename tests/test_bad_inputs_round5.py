"""Nothing lost and no traceback, round 5 (issue 48): documents (HTML charsets that are not text encodings, a
quadratic HTML attribute, EPUB chapters decoded by memagent) and GGUF headers, full disks and the conversion cache.
Each case: exit code 2, one `error:` line, no traceback, nothing written (or the documented fallback)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from tmpfs import mounted_tmpfs

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


def test_a_tag_of_a_million_attributes_is_refused_in_bounded_time_and_memory(tmp_path, monkeypatch, capsys,
                                                                          tiny_model_dir):
    """`<a b c=d b c=d ...` that never ends: the parser's regex kept a frame per attribute (about 250 bytes of RAM
    per byte of the page, a 64 MB page some 16 GB); refused once its tokens pass 10,000, before the regex runs."""
    import tracemalloc

    page = tmp_path / "tag.html"
    page.write_bytes(b"<html><body><p>text</p>\n<a " + b"b c=d " * 700_000)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(DocumentError, match=r"tag.html: an HTML tag with more than 10,000 attributes \(line 2\)"):
            check_document(page)
        seconds, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 2 and peak < 50 << 20, (seconds, peak)
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(page), "--question", "q", *SMALL])
    err = capsys.readouterr().err
    assert code == 2
    _one_error_line(err)
    assert "an HTML tag with more than 10,000 attributes" in err


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


def test_an_epub_chapter_in_the_encoding_its_xml_declaration_names_is_read(tmp_path):
    """EPUB 2 allows an XHTML chapter in another encoding named by its XML declaration: read in it, as lxml did."""
    pytest.importorskip("ebooklib")
    ok = epub_book(tmp_path / "ok.epub", [("a.xhtml", "One", "<p>caf\u00e9 chapter</p>")])
    latin = tmp_path / "latin.epub"
    import zipfile

    with zipfile.ZipFile(ok) as zin, zipfile.ZipFile(latin, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("a.xhtml"):
                data = data.replace(b"encoding='utf-8'", b"encoding='iso-8859-1'").decode("utf-8").encode("latin-1")
            zout.writestr(info, data)
    assert check_document(latin) == "epub"
    assert "caf\u00e9 chapter" in "".join(t for t, _ in document_segments(latin, "epub"))


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


# -- class 6: GGUF headers, full disks, the conversion cache, a cut safetensors file -----------------------------
def _raw_gguf(path: Path, fields: list[bytes]) -> Path:
    """A GGUF v3 file with no tensors and the given key-value records (already encoded)."""
    import struct

    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + b"".join(fields))
    return path


def _key(name: str) -> bytes:
    import struct

    return struct.pack("<Q", len(name)) + name.encode()


def _arch() -> bytes:
    import struct

    return _key("general.architecture") + struct.pack("<IQ", 8, 5) + b"llama"


def _alignment_field(kind: str) -> bytes:
    import struct

    if kind == "zero":
        return _key("general.alignment") + struct.pack("<II", 4, 0)
    if kind == "half":
        return _key("general.alignment") + struct.pack("<If", 6, 0.5)
    return _key("general.alignment") + struct.pack("<IQ", 8, 3) + b"abc"


def _nested(depth: int) -> bytes:
    import struct

    return _key("deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQ", 0, 0)


GGUF_HEADERS = [
    ("alignment 0", lambda: [_arch(), _alignment_field("zero")], "its general.alignment is 0, not a positive power of two"),
    ("alignment 0.5", lambda: [_arch(), _alignment_field("half")], "its general.alignment is 0.5, not a positive"),
    ("alignment str", lambda: [_arch(), _alignment_field("str")], "its general.alignment is 'abc', not a positive"),
    ("arrays 200,000 deep", lambda: [_arch(), _nested(200_000)], "its header nests arrays more than 8 deep"),
]


@pytest.mark.parametrize("fields, message", [(f, m) for _, f, m in GGUF_HEADERS], ids=[i for i, _, _ in GGUF_HEADERS])
def test_a_damaged_gguf_header_is_one_line(fields, message, tmp_path, run_cli, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
    path = _raw_gguf(tmp_path / "m.gguf", fields())
    (tmp_path / "doc.txt").write_text("some text")
    for args in (("model", "import", path, "--out", tmp_path / "out"),
                 ("ask", "--model", path, "--document", tmp_path / "doc.txt", "--question", "q?")):
        code, _, err = run_cli(*args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (args[0], err)
        assert lines[0].startswith(f"error: {path} is damaged: {message}") and lines[0].endswith("fetch the file "
                                                                                                 "again"), err
    assert not (tmp_path / "out").exists() and not list((tmp_path / "cache").rglob("*.json"))


@pytest.fixture
def gguf_of_the_tiny_model(tmp_path, monkeypatch, tiny_model_dir):
    """A valid GGUF file whose conversion yields the tiny model (transformers' GGUF loading, which needs a whole
    real model file, replaced by loading the tiny model's folder: the writing, the record and the cache are real)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import memagent.backends.gguf as gguf_module

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_context_length(256)
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setattr(gguf_module, "_load_gguf", lambda src: (AutoTokenizer.from_pretrained(tiny_model_dir),
                                                                 AutoModelForCausalLM.from_pretrained(tiny_model_dir)))
    return tmp_path / "m.gguf"


@pytest.fixture
def small_disk(tmp_path):
    """A 100 KiB tmpfs: the tiny model's weights (about 150 KB) do not fit. Root only."""
    yield from mounted_tmpfs(tmp_path, "100k")


def test_a_full_disk_while_converting_is_one_line_and_leaves_nothing(gguf_of_the_tiny_model, small_disk, run_cli,
                                                                     tmp_path, monkeypatch):
    out = small_disk / "model"
    code, _, err = run_cli("model", "import", gguf_of_the_tiny_model, "--out", out)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err, err
    assert errors == [f"error: cannot write the converted model to {out}: no space left on the device; free some "
                      "space or choose another --out (nothing was left there)"], err
    assert list(small_disk.iterdir()) == []
    monkeypatch.setenv("MEMAGENT_CACHE", str(small_disk))
    (tmp_path / "doc.txt").write_text("some text")
    code, _, err = run_cli("ask", "--model", gguf_of_the_tiny_model, "--document", tmp_path / "doc.txt",
                           "--question", "q?")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith(f"error: cannot write the converted model to {small_disk / 'gguf'}/") and \
        "no space left on the device; free some space or set MEMAGENT_CACHE to a folder on a disk with room" in err
    assert [p.name for p in small_disk.rglob("*") if p.is_file()] == []


def test_a_damaged_cache_entry_is_converted_again(gguf_of_the_tiny_model, tmp_path, capsys, monkeypatch):
    """An entry whose weights are cut short, or hold other bytes of the same size, with its import record intact (or
    an older record that lists no files): said on stderr and converted again; it then loads."""
    import json

    from transformers import AutoModelForCausalLM

    from memagent.backends.gguf import IMPORT_RECORD, resolve_model

    monkeypatch.setenv("MEMAGENT_CACHE", str(tmp_path / "cache"))
    entry = Path(resolve_model(str(gguf_of_the_tiny_model)))
    weights = entry / "model.safetensors"
    whole = weights.read_bytes()
    record = json.loads((entry / IMPORT_RECORD).read_text())
    assert record["files"]["model.safetensors"]["bytes"] == len(whole)
    capsys.readouterr()
    for damage in ("cut", "flipped", "cut, an older record"):
        if damage == "flipped":
            weights.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))  # same size, other bytes
        else:
            weights.write_bytes(whole[: len(whole) // 2])
        if damage == "cut, an older record":
            (entry / IMPORT_RECORD).write_text(json.dumps({k: v for k, v in record.items() if k != "files"}))
        assert Path(resolve_model(str(gguf_of_the_tiny_model))) == entry
        said = capsys.readouterr().err
        assert f"the cache entry {entry} of m.gguf is damaged (" in said and "converting the file again" in said
        assert weights.read_bytes() == whole
    assert AutoModelForCausalLM.from_pretrained(entry) is not None
    # once its hashes matched, a load hashes the GGUF file alone until an entry's file is written again
    import memagent.backends.gguf as gguf_module

    assert Path(resolve_model(str(gguf_of_the_tiny_model))) == entry  # hashed, stamped
    hashed = []
    real = gguf_module.file_sha256
    monkeypatch.setattr(gguf_module, "file_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    assert Path(resolve_model(str(gguf_of_the_tiny_model))) == entry and hashed == ["m.gguf"]
    weights.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))
    capsys.readouterr()
    assert Path(resolve_model(str(gguf_of_the_tiny_model))) == entry
    assert "does not hold the bytes recorded (its sha256 differs)" in capsys.readouterr().err
    assert weights.read_bytes() == whole


def test_a_model_folder_whose_weights_are_cut_short_is_one_line(tmp_path, tiny_model_dir, run_cli):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    (tmp_path / "doc.txt").write_text("some text")
    code, _, err = run_cli("ask", "--model", folder, "--document", tmp_path / "doc.txt", "--question", "q?",
                           "--device", "cpu")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: model {folder}: model.safetensors is cut short: its tensors need {size:,} "
                               f"bytes, the file has {size // 2:,} (a partial copy or download?)"), err

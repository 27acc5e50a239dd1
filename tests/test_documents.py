"""PDF, HTML and EPUB documents (memagent.documents): told apart by content, their text in reading order, and
the page, heading or chapter of every chunk and memory update (`source`), on documents the tests write."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from documents_fixture import epub_book, pdf_pages
from memagent.agent.chunking import iter_chunks
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.cli import run
from memagent.config import AgentConfig
from memagent.documents import Location, check_document, detect, document_segments, sniff, span_label
from memagent.serve.page import page_assets
from memagent.timeline.report import render_report, report_data

pytest.importorskip("pypdf")
pytest.importorskip("ebooklib")
pytest.importorskip("fpdf")

WORDS = ["alpha", "bravo", "charlie", "delta", "echo"]
SMALL = ["--chunk-tokens", "40", "--memory-tokens", "6", "--answer-tokens", "6", "--no-progress"]


def _five_pages(tmp_path: Path) -> Path:
    """Page i holds one word of WORDS 30 times: the page of any word in a chunk is known."""
    return pdf_pages(tmp_path / "five.pdf", [" ".join([w] * 30) for w in WORDS])


# -- detection by content -----------------------------------------------------------------------------
@pytest.mark.parametrize("head, kind", [
    (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", "pdf"),
    (b"junk before the header %PDF-1.4\n", "pdf"),
    (b"PK\x03\x04\x14\x00\x00\x00\x00\x00mimetypeapplication/epub+zip", "epub"),
    (b"\xef\xbb\xbf\n  <!DOCTYPE html>\n<html>", "html"),
    (b"<?xml version='1.0' encoding='utf-8'?>\n<html xmlns='http://www.w3.org/1999/xhtml'>", "html"),
    (b"<P>a paragraph", "html"),
    (b"<!-- a comment --><div>x</div>", "html"),
    (b"<price list> is not a tag of HTML's sniffing table", "text"),
    (b"Hello <html> later in the text", "text"),
    (b"plain words", "text"),
])
def test_sniff_reads_the_first_bytes(head, kind):
    assert sniff(head) == kind


def test_the_name_does_not_decide(tmp_path):
    html = tmp_path / "paper.pdf"
    html.write_text("<html><body><h1>Results</h1><p>the river is long</p></body></html>")
    pdf = pdf_pages(tmp_path / "notes.txt", ["words on the only page"])
    assert detect(html) == "html" and check_document(html) == "html"
    assert [loc.label for _, loc in document_segments(html, "html")] == ['heading "Results"']
    assert detect(pdf) == "pdf" and check_document(pdf) == "pdf"
    (tmp_path / "book.epub").write_text("just text in a file named like a book")
    assert check_document(tmp_path / "book.epub") == "text"


# -- text in reading order, with its place --------------------------------------------------------------
def test_pdf_pages_come_in_order_each_with_its_page(tmp_path):
    segments = list(document_segments(_five_pages(tmp_path), "pdf"))
    assert [loc for _, loc in segments] == [Location("page", n) for n in range(1, 6)]
    for (text, _), word in zip(segments, WORDS):
        assert text.split() == [word] * 30


def test_html_main_text_only_heading_by_heading(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("""<!doctype html><html><head><title>T</title><style>p {color: red}</style></head><body>
      <nav><a href="/">home navlink</a></nav><header>site banner</header>
      <main><p>Lead words before any heading.</p>
        <h1>Intro</h1><p>first <b>part</b> of the text</p><script>var secret = 1;</script>
        <div aria-hidden="true">hidden widget</div>
        <h2>Methods &amp; data</h2><ul><li>one<li>two</ul></main>
      <aside>related links</aside><footer>copyright</footer></body></html>""")
    segments = list(document_segments(page, "html"))
    text = "".join(t for t, _ in segments)
    for gone in ("navlink", "banner", "secret", "hidden widget", "related", "copyright", "color"):
        assert gone not in text
    assert [loc.label for _, loc in segments] == ["the text before the first heading", 'heading "Intro"',
                                                  'heading "Methods & data"']
    assert segments[1][0] == "Intro\nfirst part of the text\n"
    assert segments[2][0].split("\n")[:3] == ["Methods & data", "one", "two"]


def test_html_without_main_keeps_the_body_less_its_frame(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<html><body><header>menu</header><p>body text</p><footer>foot</footer></body></html>")
    assert "".join(t for t, _ in document_segments(page, "html")).split() == ["body", "text"]


def test_epub_chapters_in_spine_order_with_toc_titles(tmp_path):
    chapters = [("a.xhtml", "The Start", "<h1>Start</h1><p>first words</p>"),
                ("b.xhtml", "The Middle", "<p>middle words</p>"),
                ("c.xhtml", "The End", "<header><h1>End</h1></header><p>last words</p>")]
    book = epub_book(tmp_path / "book.epub", chapters, spine=[2, 0, 1])
    segments = list(document_segments(book, "epub"))
    assert [loc.label for _, loc in segments] == ['chapter 1 "The End"', 'chapter 2 "The Start"',
                                                  'chapter 3 "The Middle"']
    assert [t.split() for t, _ in segments] == [["End", "last", "words"], ["Start", "first", "words"],
                                                ["middle", "words"]]
    plain = epub_book(tmp_path / "plain.epub", chapters, toc=False)
    assert [loc.title for _, loc in document_segments(plain, "epub")] == ["Start", None, "End"]


def test_span_labels():
    assert span_label(Location("page", 213), Location("page", 214)) == "pages 213-214"
    assert span_label(Location("chapter", 3, "A"), Location("chapter", 4, "B")) == "chapters 3-4"
    assert span_label(Location("heading", 1, "A"), Location("heading", 2, "B")) == 'headings "A" to heading "B"'
    assert span_label(Location("page", 7), Location("page", 7)) == "page 7"


# -- every chunk's place --------------------------------------------------------------------------------
def test_each_chunk_names_the_pages_of_its_tokens(tmp_path, tiny_tokenizer):
    """Hand-worked: each page is tokenised on its own, so page n holds tokens [start_n, start_n + len_n); chunk k
    holds [kC, kC + C): its source is the pages those overlap."""
    pdf = _five_pages(tmp_path)
    lengths = [len(tiny_tokenizer(t, add_special_tokens=False)["input_ids"]) for t, _ in document_segments(pdf, "pdf")]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    C = 25
    chunks = list(iter_chunks(pdf, tiny_tokenizer, C))
    assert sum(len(c.token_ids) for c in chunks) == sum(lengths)
    for c in chunks:
        pages = [n + 1 for n in range(5) if starts[n] < c.start_token + len(c.token_ids) and c.start_token <
                 starts[n] + lengths[n]]
        want = f"page {pages[0]}" if len(pages) == 1 else f"pages {pages[0]}-{pages[-1]}"
        assert c.source == want, (c.index, c.start_token)
        assert {w for w in c.text.split() if w in WORDS} <= {WORDS[p - 1] for p in pages}
    assert any("-" in c.source for c in chunks) and any("-" not in c.source for c in chunks)


def test_plain_text_chunks_have_no_source(tmp_path, tiny_tokenizer):
    doc = tmp_path / "doc.txt"
    doc.write_text("the river is long " * 50)
    assert {c.source for c in iter_chunks(doc, tiny_tokenizer, 20)} == {None}


# -- the trace, the report ---------------------------------------------------------------------------------
OLD_FIELDS = {"doc_id", "step", "chunk_start", "chunk_tokens", "prompt_tokens", "memory_tokens", "memory",
              "truncated", "think_removed", "seconds", "batch_size"}


def test_memory_records_carry_the_page_beside_the_offset(tmp_path, tiny_backend):
    pdf = _five_pages(tmp_path)
    records: list[dict] = []
    cfg = AgentConfig(chunk_tokens=40, memory_tokens=6, answer_tokens=6)
    MemoryAgent(tiny_backend, cfg, on_step=records.append).run([AgentInput("Which word?", pdf, "d")])
    memory = [r for r in records if r.get("kind") != "final"]
    chunks = list(iter_chunks(pdf, tiny_backend.tokenizer, 40))
    assert [r["source"] for r in memory] == [c.source for c in chunks]
    assert [r["chunk_start"] for r in memory] == [c.start_token for c in chunks]
    assert all(set(r) == OLD_FIELDS | {"source", "chunk_text"} for r in memory)
    data = report_data(records)
    doc = data["docs"][0]
    assert [row["source"] for row in doc["rows"]] == [c.source for c in chunks]
    by_step = {row["step"]: row["source"] for row in doc["rows"]}
    assert doc["sources"] == list(dict.fromkeys(by_step[s] for s in doc["evidence"]))
    assert "page 1" in render_report(data, "t", page_assets())


def test_text_records_are_unchanged(tiny_backend):
    records: list[dict] = []
    cfg = AgentConfig(chunk_tokens=40, memory_tokens=6, answer_tokens=6)
    MemoryAgent(tiny_backend, cfg, on_step=records.append).run([AgentInput("q", "the river is long " * 30, "d")])
    assert all(set(r) == OLD_FIELDS | {"chunk_text"} for r in records if r.get("kind") != "final")
    assert report_data(records)["docs"][0]["sources"] == []


@pytest.mark.slow
def test_ask_over_a_pdf_traces_pages_and_reports_them(tmp_path, tiny_model_dir, capsys):
    pdf = _five_pages(tmp_path)
    trace, html = tmp_path / "trace.jsonl", tmp_path / "report.html"
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(pdf), "--question", "Which word comes last?",
                "--trace", str(trace), "--trace-chunks", *SMALL])
    assert code == 0, capsys.readouterr().err
    memory = [r for r in map(json.loads, trace.read_text().splitlines()) if r.get("kind") != "final"]
    assert len(memory) >= 5 and memory[0]["source"] == "page 1" and memory[-1]["source"] == "page 5"
    for r in memory:  # the words of a chunk are the words of the pages its source names
        first, _, last = r["source"].removeprefix("pages ").removeprefix("page ").partition("-")
        pages = range(int(first), int(last or first) + 1)
        assert {w for w in r["chunk_text"].split() if w in WORDS} <= {WORDS[p - 1] for p in pages}
    assert run(["report", str(trace), "--out", str(html)]) == 0
    assert '"source": "page 1"' in html.read_text()


def test_a_missing_reader_names_the_extra(tmp_path, tiny_model_dir, monkeypatch, capsys):
    pdf = pdf_pages(tmp_path / "a.pdf", ["some text"])
    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf -> ImportError
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(pdf), "--question", "q", *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "memagent[documents]" in err and "pypdf" in err


# -- eval and training data: a `document` path ------------------------------------------------------------------
def test_a_data_file_document_path_is_read_by_eval_and_training(tmp_path, tiny_tokenizer):
    from memagent.eval.records import sample_ids
    from memagent.rl.samples import read_training_samples
    from memagent.tasks.schema import read_samples, sample_document

    (tmp_path / "docs").mkdir()
    pdf = pdf_pages(tmp_path / "docs" / "report.pdf", ["first page words", "second page words"])
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "q", "answers": ["x"], "document": "docs/report.pdf"}) + "\n")
    (sample,) = read_samples(data)
    assert sample["document"] == str(pdf.resolve()) and sample_document(sample) == pdf.resolve()
    assert sample_ids(data) == ["a"]
    assert [c.source for c in iter_chunks(sample_document(sample), tiny_tokenizer, 1000)] == ["pages 1-2"]
    (qa,) = read_training_samples(data)
    assert qa.document == pdf.resolve() and qa.agent_input("0").document == pdf.resolve()


def test_a_bad_data_file_document_is_refused_naming_the_sample(tmp_path):
    from memagent.errors import MemAgentError
    from memagent.eval.records import sample_ids

    from documents_fixture import scanned_pdf

    scanned_pdf(tmp_path / "scan.pdf")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "q", "answers": ["x"], "document": "scan.pdf"}) + "\n")
    with pytest.raises(MemAgentError, match=r"sample 1 \(id 'a'\): .*no text layer: run OCR first"):
        sample_ids(data)
    data.write_text(json.dumps({"id": "a", "question": "q", "answers": ["x"], "document": "gone.pdf"}) + "\n")
    with pytest.raises(MemAgentError, match="document .*gone.pdf not found"):
        sample_ids(data)


@pytest.mark.slow
def test_eval_reads_a_pdf_document_with_every_method(run_cli, tiny_model_dir, tiny_tokenizer, tmp_path):
    pdf = pdf_pages(tmp_path / "report.pdf", [" ".join([w] * 30) for w in WORDS])
    total = sum(len(tiny_tokenizer(t, add_special_tokens=False)["input_ids"]) for t, _ in document_segments(pdf, "pdf"))
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "Which word?", "answers": ["echo"], "document": "report.pdf"})
                    + "\n")
    code, _, err = run_cli("eval", "--model", tiny_model_dir, "--data", data, "--methods",
                           "memagent,full-context,rag-bm25", "--window", "160", "--chunk-tokens", "40",
                           "--memory-tokens", "8", "--answer-tokens", "8", "--no-progress", "--out", tmp_path / "o")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in records) == ["full-context", "memagent", "rag-bm25"]
    assert all(r["status"] == "ok" for r in records)
    assert {r["method"]: r["tokens"]["document"] for r in records} == dict.fromkeys(
        ["memagent", "full-context", "rag-bm25"], total)  # every page's tokens, each page tokenised on its own


def test_a_pipe_is_read_as_text_without_losing_its_first_bytes(tmp_path, tiny_tokenizer):
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    text = "%PDF-1.4 is how this text begins, yet it is text"

    def write() -> None:
        with open(fifo, "w") as f:
            f.write(text)

    threading.Thread(target=write, daemon=True).start()
    assert check_document(fifo) == "text"
    ids = [t for c in iter_chunks(fifo, tiny_tokenizer, 100) for t in c.token_ids]
    assert ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("workflow", ["lookup", "skim"])
def test_lookup_and_skim_records_carry_the_page_of_the_chunk_they_read(workflow, tmp_path, tiny_backend):
    from memagent.agent.registry import build_workflow

    pdf = _five_pages(tmp_path)
    pages = {c.start_token: c.source for c in iter_chunks(pdf, tiny_backend.tokenizer, 40)}
    records: list[dict] = []
    cfg = AgentConfig(chunk_tokens=40, memory_tokens=6, answer_tokens=6, query_tokens=32)
    wf = build_workflow(workflow, tiny_backend, cfg, on_step=records.append)
    wf.run([AgentInput("Which word is on the last page?", pdf, "d")])
    memory = [r for r in records if r.get("kind", "memory") == "memory"]
    assert memory and all(r["source"] == pages[r["chunk_start"]] for r in memory)

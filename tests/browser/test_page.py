"""The page at / and the report, in headless Chromium (Debian's `chromium`, driven by Playwright's Python package).

The page runs against `stub_service.StubService` (a stub of the service API with canned events, not the
real server). Without chromium or playwright these tests skip with a message naming the package; under CI
(env CI set) they fail instead. MEMAGENT_SCREENSHOT=PATH also copies the page's screenshot there
(docs/img/page.png is made so).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
SCRIPT = "<script>window.pwned = 1</script>"
LINES = ["The sky is green today.", "Key fact: the vault code is 4711.",
         f"Some noise {SCRIPT} <img src=x onerror=\"window.pwned=2\"> here.", "Nothing else of note."]
MEMORIES = ["sky green", "sky green code 4711", f"sky green code 4711 {SCRIPT}", "code 4711"]


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI is set, so the browser tests must run)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the Python package playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        _missing(f"{CHROMIUM} is missing: install the Debian package chromium (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def stub():
    from stub_service import StubService

    service = StubService(MEMORIES, answer=f"4711 {SCRIPT}", truncated_steps=(2,)).start()
    try:
        yield service
    finally:
        service.stop()


def test_page_upload_ask_watch_timeline(browser, stub, tmp_path):
    from playwright.sync_api import expect

    doc = tmp_path / "doc.txt"
    doc.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(stub.url + "/")
    page.set_input_files("#doc-file", str(doc))
    page.fill("#questions", "What is the vault code?")
    page.click("#start")
    page.wait_for_selector(".answer-text", timeout=10_000)
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)

    assert ("POST", "/v1/documents") in stub.requests and ("POST", "/v1/jobs") in stub.requests
    rows = page.locator(".row")
    assert rows.count() == len(LINES)
    assert page.locator(".progress").inner_text() == "chunk 4 of 4"
    assert page.locator(".answer-text").inner_text() == f"4711 {SCRIPT}"
    # offsets in words of the stub's chunks: 0-5, 5-11, ...; step 2 carries the cut flag
    assert rows.nth(1).locator(".offset").inner_text() == "tokens 5\u201312"
    assert [rows.nth(i).locator(".cut-flag").count() for i in range(4)] == [0, 0, 1, 0]
    # "code 4711" of the final memory was written at step 1: that row alone is evidence
    assert [("evidence" in (rows.nth(i).get_attribute("class") or "")) for i in range(4)] == [False, True, False, False]
    assert rows.nth(1).locator("ins").all_inner_texts() == ["code 4711"]
    assert rows.nth(3).locator("del").all_inner_texts() == ["sky green", SCRIPT]

    chunk = rows.nth(2).locator(".chunk-text")
    assert chunk.is_hidden()
    rows.nth(2).locator(".row-head").click()
    expect(chunk).to_have_text(LINES[2])  # fetched on the click; the <script> and <img> show as text
    assert chunk.is_visible()
    job_id = next(iter(stub.jobs))
    assert ("GET", f"/v1/jobs/{job_id}/chunks/2") in stub.requests
    assert ("GET", f"/v1/jobs/{job_id}/events?chunk_text=0") in stub.requests
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("img").count() == 0 and page.locator("script").count() == 2  # timeline.js, app.js
    assert errors == []

    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("MEMAGENT_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["MEMAGENT_SCREENSHOT"])
    page.close()


def test_page_lists_api_jobs_and_opens_one_by_its_link(browser, stub):
    from playwright.sync_api import expect

    first = stub.make_job(dict(document="\n".join(LINES), questions=[f"Which code? {SCRIPT}"]))
    second = stub.make_job(dict(document="one\ntwo", questions=["Other?"], workflow="skim"))
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(stub.url + "/")
    items = page.locator("#job-list .job-item")
    expect(items).to_have_count(2)
    assert [items.nth(i).get_attribute("data-job") for i in range(2)] == [second["id"], first["id"]]
    assert items.nth(0).locator(".job-workflow").inner_text() == "skim"
    link = items.nth(1).locator("a.job-link")
    assert link.inner_text() == f"Which code? {SCRIPT}" and link.get_attribute("href") == f"/?job={first['id']}"
    link.click()
    page.wait_for_url(f"**/?job={first['id']}")
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)
    assert page.locator(".row").count() == len(LINES)
    assert page.locator(".answer-text").inner_text() == f"4711 {SCRIPT}"
    assert "current" in (page.locator(f"#job-list [data-job='{first['id']}']").get_attribute("class") or "")
    assert f"/?job={first['id']}" in page.locator("#job-meta").inner_text()
    page.locator(".row").nth(2).locator(".row-head").click()
    expect(page.locator(".row").nth(2).locator(".chunk-text")).to_have_text(LINES[2])
    page.goto(stub.url + "/?job=job_ffffffffffff")  # an unknown id: the service's message
    expect(page.locator("#status")).to_have_text("error: no job job_ffffffffffff", timeout=10_000)
    assert page.evaluate("typeof window.pwned") == "undefined" and page.locator("img").count() == 0
    assert errors == []
    page.close()


def test_page_pasted_text_and_bad_request(browser, stub):
    page = browser.new_page()
    page.goto(stub.url + "/")
    page.fill("#doc-text", "one line\nanother line\n")
    page.click("#start")  # no question yet: the page says so and sends nothing
    assert "at least one question" in page.locator("#status").inner_text()
    assert ("POST", "/v1/jobs") not in stub.requests
    page.fill("#questions", "Anything?")
    page.click("#start")
    page.wait_for_selector(".answer-text", timeout=10_000)
    assert page.locator(".row").count() == 2
    assert ("POST", "/v1/documents") not in stub.requests  # pasted text goes in the job's `document` field
    page.close()


def test_report_renders_in_the_browser(browser, tmp_path):
    from memagent.cli import run

    records = [dict(doc_id="d", step=i, chunk_start=10 * i, chunk_tokens=10, memory=m, truncated=False,
                    chunk_text=LINES[i]) for i, m in enumerate(MEMORIES)]
    records.append(dict(doc_id="d", step=4, kind="final", answer=SCRIPT, raw_answer=SCRIPT))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "report.html"
    assert run(["report", str(trace), "--out", str(out)]) == 0
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(out.as_uri())
    rows = page.locator(".row")
    assert rows.count() == 4 and page.locator(".answer-text").inner_text() == SCRIPT
    assert [("evidence" in (rows.nth(i).get_attribute("class") or "")) for i in range(4)] == [False, True, False, False]
    rows.nth(2).locator(".row-head").click()
    assert rows.nth(2).locator(".chunk-text").inner_text() == LINES[2]
    assert page.evaluate("typeof window.pwned") == "undefined" and page.locator("img").count() == 0
    assert errors == []
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    page.close()


def test_report_shows_the_page_each_memory_came_from(browser, tmp_path):
    """A PDF document's trace (records with `source`): each row names its page, the answer the pages its memory came
    from (issue 37)."""
    from memagent.cli import run

    records = [dict(doc_id="d", step=i, chunk_start=10 * i, chunk_tokens=10, memory=m, truncated=False,
                    source=f"page {i + 1}" if i != 1 else "pages 2-3") for i, m in enumerate(MEMORIES)]
    records.append(dict(doc_id="d", step=4, kind="final", answer="4711", raw_answer="4711"))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "report.html"
    assert run(["report", str(trace), "--out", str(out)]) == 0
    page = browser.new_page()
    page.goto(out.as_uri())
    offsets = page.locator(".row .offset").all_inner_texts()
    assert offsets == ["tokens 0\u201310 \u00b7 page 1", "tokens 10\u201320 \u00b7 pages 2-3",
                       "tokens 20\u201330 \u00b7 page 3", "tokens 30\u201340 \u00b7 page 4"]
    assert page.locator(".evidence-list").inner_text() == "Memory came from: pages 2-3 (chunk 2)"
    if os.environ.get("MEMAGENT_SCREENSHOT_SOURCES"):
        page.screenshot(path=os.environ["MEMAGENT_SCREENSHOT_SOURCES"], full_page=True)
    page.close()


PAIRS = [("a b c d e", "a X c d Y Z e"), ("", "one two"), ("one two", ""), ("x x y x", "x x z z x"),
         ("k1 v1 filler", "k1 v1 k2 v2"), ("the cat sat on the mat", "the mat sat on the cat"),
         ("a b a b a b", "b a b a"), ("fact one. fact two.", "fact two. fact three. fact one.")]


def test_timeline_js_diff_matches_python(browser):
    from memagent.serve.page import STATIC
    from memagent.timeline import word_diff

    page = browser.new_page()
    page.set_content("<!doctype html><title>diff</title>")
    page.add_script_tag(content=(STATIC / "timeline.js").read_text(encoding="utf-8"))
    for old, new in PAIRS:
        row = page.evaluate("([o, n]) => MemTimeline.makeRow(o, {step: 0, memory: n})", [old, new])
        assert (row["added"], row["removed"]) == word_diff(old, new), (old, new)
    page.close()


def test_page_cancel_and_server_error(browser, tmp_path):
    from playwright.sync_api import expect
    from stub_service import StubService

    service = StubService(MEMORIES, answer="x", delay=0.4, max_document_bytes=200).start()
    try:
        page = browser.new_page()
        page.goto(service.url + "/")
        page.fill("#doc-text", "\n".join(f"line {i}" for i in range(10)))
        page.fill("#questions", "Which line?")
        page.click("#start")
        page.wait_for_selector(".row")
        page.click("#cancel")
        expect(page.locator("#status")).to_have_text("cancelled", timeout=10_000)
        assert any(m == "DELETE" and p.startswith("/v1/jobs/job_") for m, p in service.requests)
        assert 1 <= page.locator(".row").count() < 10 and page.locator(".answer-text").count() == 0
        assert not page.locator("#start").is_disabled() and page.locator("#cancel").is_disabled()

        service.drop_after, service.delay = 2, 0.0  # the stream ends after two rows, no final state
        page.click("#start")
        expect(page.locator("#status")).to_contain_text("the event stream ended before the job did", timeout=10_000)
        assert page.locator(".row").count() == 2

        big = tmp_path / "big.txt"
        big.write_text("word " * 100, encoding="utf-8")  # 500 bytes: over the stub's limit
        page.fill("#doc-text", "")
        page.set_input_files("#doc-file", str(big))
        page.click("#start")
        expect(page.locator("#status")).to_have_text("error: the document is over 200 bytes", timeout=10_000)
        page.close()
    finally:
        service.stop()


def test_report_of_two_documents_one_unfinished(browser, tmp_path):
    from memagent.cli import run

    records = [dict(doc_id="a", step=0, chunk_start=0, chunk_tokens=5, memory="alpha", truncated=False),
               dict(doc_id="b", step=0, chunk_start=0, chunk_tokens=5, memory="beta", truncated=False),
               dict(doc_id="a", step=1, kind="final", answer="alpha", raw_answer="alpha")]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "report.html"
    assert run(["report", str(trace), "--out", str(out)]) == 0
    page = browser.new_page()
    page.goto(out.as_uri())
    assert page.locator(".timeline-title").all_inner_texts() == ["document a", "document b"]
    answers = page.locator(".answer").all_inner_texts()
    assert "alpha" in answers[0] and "no final answer" in answers[1]
    page.locator(".row-head").first.click()
    assert "ask --trace-chunks" in page.locator(".chunk-text").inner_text()  # this trace holds no chunk text
    page.close()

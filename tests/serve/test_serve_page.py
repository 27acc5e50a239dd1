"""The page at / against the REAL service, in headless Chromium: upload, ask, one timeline row per chunk, a
row's chunk text, and a `<script>` in the document shown as text, never run (tiny model); a job started
through the API listed, opened by its link, a chunk's text fetched on a click, model text with `<script>`
kept as text (a scripted backend).

Skips while the page's files (src/memagent/serve/static/, the page helper's) are absent; without
chromium or playwright it skips naming the package, except under CI (env CI set), where it fails.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

pytest.importorskip("fastapi")

from fakes import ScriptedBackend  # noqa: E402
from serve_helpers import SMALL, ThreadServer, words  # noqa: E402

from memagent.agent.chunking import iter_chunks  # noqa: E402

STATIC = Path(__file__).resolve().parents[2] / "src" / "memagent" / "serve" / "static"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
SCRIPT = "<script>window.pwned = 1</script>"


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI is set, so the browser tests must run)")
    pytest.skip(what)


def _playwright():
    if not (STATIC / "index.html").is_file():
        pytest.skip("the page (src/memagent/serve/static/index.html) is not in this tree")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _missing("the Python package playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        _missing(f"{CHROMIUM} is missing: install the Debian package chromium (apt-get install chromium)")
    return expect, sync_playwright


@contextmanager
def _page(pw: Any) -> Iterator[tuple[Any, list[str]]]:
    """A page in Debian's chromium and the list its script errors are collected into; the browser closed after."""
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield page, errors
    finally:
        browser.close()


def test_page_lists_an_api_job_opens_its_link_and_fetches_a_chunk(tiny_tokenizer, tmp_path):
    expect, sync_playwright = _playwright()
    # the model's memory and answer carry markup: it must stay text
    backend = ScriptedBackend(tiny_tokenizer, lambda prompt, i: f"<b>m</b> \\boxed{{v{i} {SCRIPT}}}")
    doc = words(60) + f" {SCRIPT} " + words(20, seed=2)
    chunks = list(iter_chunks(doc, tiny_tokenizer, SMALL["chunk_tokens"], errors="replace"))
    with ThreadServer(backend, tmp_path / "state") as server, sync_playwright() as pw:
        job = httpx.post(server.url + "/v1/jobs", json={"document": doc, "questions": [f"Which {SCRIPT}?"],
                                                         "workflow": "memagent"}).json()["id"]
        with _page(pw) as (page, errors):
            page.goto(server.url + "/")
            item = page.locator(f"#job-list [data-job='{job}']")
            expect(item).to_have_count(1)
            assert item.locator(".job-link").inner_text() == f"Which {SCRIPT}?"
            assert item.locator(".job-workflow").inner_text() == "memagent"
            item.locator(".job-link").click()
            page.wait_for_url(f"**/?job={job}")
            expect(page.locator("#status")).to_have_text("done", timeout=30_000)
            view = httpx.get(f"{server.url}/v1/jobs/{job}").json()["questions"][0]
            rows = page.locator(".row")
            assert rows.count() == len(chunks) == len(view["steps"])
            assert page.locator(".answer-text").inner_text() == view["answer"] == f"v{len(chunks)} {SCRIPT}"
            assert "<b>m</b>" in view["steps"][0]["memory"]
            assert rows.nth(0).locator(".memory").inner_text().strip() == view["steps"][0]["memory"].strip()
            k = next(i for i, c in enumerate(chunks) if "<" in c.text)  # a piece of the document's <script>
            rows.nth(k).locator(".row-head").click()
            chunk = rows.nth(k).locator(".chunk-text")
            expect(chunk).to_have_text(chunks[k].text)  # fetched from GET /v1/jobs/{id}/chunks/{k}
            assert page.evaluate("typeof window.pwned") == "undefined"
            assert page.locator("b").count() == 0 and page.locator("script").count() == 2
            assert errors == []
            page.screenshot(path=str(tmp_path / "page-jobs.png"), full_page=True)


@pytest.mark.slow
def test_page_over_the_real_service(tiny_backend, tmp_path):
    expect, sync_playwright = _playwright()
    doc = tmp_path / "doc.txt"
    text = " ".join(f"river{i} city{i}" for i in range(40)) + f" {SCRIPT} " + " ".join(f"album{i}" for i in range(20))
    doc.write_text(text, encoding="utf-8")
    with ThreadServer(tiny_backend, tmp_path / "state") as server, sync_playwright() as pw:
        with _page(pw) as (page, errors):
            page.goto(server.url + "/")
            page.set_input_files("#doc-file", str(doc))
            page.fill("#questions", "Which river?")
            page.click("#start")
            expect(page.locator("#status")).to_have_text("done", timeout=60_000)
            job_id = next(iter(server.manager.live))
            view = httpx.get(f"{server.url}/v1/jobs/{job_id}").json()
            q = view["questions"][0]
            assert view["state"] == "done" and q["chunks_total"] >= 10
            rows = page.locator(".row")
            assert rows.count() == q["chunks_total"]
            shown = page.locator(".answer-text").inner_text().strip()
            assert shown == q["answer"] if q["answer"] is not None else "no answer" in shown  # random tiny model
            k = next(i for i, s in enumerate(q["steps"]) if "<" in s["chunk_text"])  # a piece of the <script>
            rows.nth(k).locator(".row-head").click()
            chunk = rows.nth(k).locator(".chunk-text")
            expect(chunk).to_have_text(q["steps"][k]["chunk_text"])  # fetched on the click
            assert chunk.is_visible()
            assert page.evaluate("typeof window.pwned") == "undefined"
            assert errors == []
            page.screenshot(path=str(tmp_path / "page-real-service.png"), full_page=True)
            assert (tmp_path / "page-real-service.png").stat().st_size > 10_000

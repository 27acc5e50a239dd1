"""The page at / against the REAL service (tiny model), in headless Chromium: upload, ask, one timeline row
per chunk, a row's chunk text, and a `<script>` in the document shown as text, never run.

Skips while the page's files (src/memagent/serve/static/, the page helper's) are absent; without
chromium or playwright it skips naming the package, except under CI (env CI set), where it fails.
"""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_helpers import ThreadServer  # noqa: E402

STATIC = Path(__file__).resolve().parents[2] / "src" / "memagent" / "serve" / "static"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
SCRIPT = "<script>window.pwned = 1</script>"


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI is set, so the browser tests must run)")
    pytest.skip(what)


@pytest.mark.slow
def test_page_over_the_real_service(tiny_backend, tmp_path):
    if not (STATIC / "index.html").is_file():
        pytest.skip("the page (src/memagent/serve/static/index.html) is not in this tree")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _missing("the Python package playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        _missing(f"{CHROMIUM} is missing: install the Debian package chromium (apt-get install chromium)")
    doc = tmp_path / "doc.txt"
    text = " ".join(f"river{i} city{i}" for i in range(40)) + f" {SCRIPT} " + " ".join(f"album{i}" for i in range(20))
    doc.write_text(text, encoding="utf-8")
    with ThreadServer(tiny_backend, tmp_path / "state") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
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
            assert chunk.is_visible() and chunk.inner_text() == q["steps"][k]["chunk_text"]
            assert page.evaluate("typeof window.pwned") == "undefined"
            assert errors == []
            page.screenshot(path=str(tmp_path / "page-real-service.png"), full_page=True)
            assert (tmp_path / "page-real-service.png").stat().st_size > 10_000
        finally:
            browser.close()

"""The page at / against the real `memagent serve` with the real pretrained model (SmolLM2-135M-Instruct): a real
essay uploaded, the memory timeline of a real document drawn (a row a chunk, its memory as the service recorded
it, the cut flags of memories stopped at M tokens). MEMAGENT_SCREENSHOT_REAL=PATH copies the screenshot there
(docs/img/page_real.png is made so)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from real_model import essay_document
from test_page import browser  # noqa: F401  (the module's headless Chromium fixture)

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
import serve_helpers  # noqa: E402

pytestmark = pytest.mark.slow
REAL = dict(chunk_tokens=128, memory_tokens=32, answer_tokens=32, query_tokens=64)


@pytest.fixture
def real_service(real_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(serve_helpers, "SMALL", REAL)  # start_subprocess's budget flags
    port = serve_helpers.free_port()
    proc = serve_helpers.start_subprocess(real_model_dir, tmp_path / "state", port)
    url = f"http://127.0.0.1:{port}"
    try:
        serve_helpers.wait_up(url, timeout=240, proc=proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_page_draws_a_real_documents_timeline(browser, real_service, real_model_dir, tmp_path):  # noqa: F811
    from playwright.sync_api import expect
    from transformers import AutoTokenizer

    text = essay_document(300, needle="The secret code of the blue door is 4172.", depth=0.4)
    doc = tmp_path / "essay.txt"
    doc.write_text(text, encoding="utf-8")
    chunks = -(-len(AutoTokenizer.from_pretrained(real_model_dir)(text, add_special_tokens=False)["input_ids"]) // 128)
    page = browser.new_page(viewport={"width": 1100, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(real_service + "/")
    page.set_input_files("#doc-file", str(doc))
    page.fill("#questions", "What is the secret code of the blue door?")
    page.click("#start")
    expect(page.locator("#status")).to_have_text("done", timeout=600_000)
    rows = page.locator(".row:not(.call)")
    assert rows.count() == chunks
    assert page.locator(".progress").inner_text() == f"chunk {chunks} of {chunks}"

    [job] = httpx.get(real_service + "/v1/jobs").json()["data"]
    events = [json.loads(line[5:]) for line in
              httpx.get(f"{real_service}/v1/jobs/{job['id']}/events").text.splitlines() if line.startswith("data:")]
    steps = [e for e in events if "chunk_start" in e]
    assert len(steps) == chunks
    for i, e in enumerate(steps):  # the page shows each memory the service recorded, and its cut flag
        assert " ".join(rows.nth(i).locator(".memory").inner_text().split()) == " ".join(e["memory"].split())
        assert rows.nth(i).locator(".cut-flag").count() == int(bool(e["truncated"]))
    assert page.locator(".answer-text").count() == 1 and errors == []
    shot = tmp_path / "page_real.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("MEMAGENT_SCREENSHOT_REAL"):
        shutil.copyfile(shot, os.environ["MEMAGENT_SCREENSHOT_REAL"])
    page.close()

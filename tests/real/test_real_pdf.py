"""`memagent ask` with the real pretrained model over a generated multi-page PDF (essay text on four pages, a
needle on page 3): it completes, every memory record names the page(s) its chunk came from, and those pages are
the ones holding the chunk's words."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from real_model import essay_document

pytestmark = pytest.mark.slow
pytest.importorskip("fpdf")
pytest.importorskip("pypdf")


def test_ask_over_a_multi_page_pdf_names_the_pages(real_model_dir, tmp_path):
    from documents_fixture import pdf_pages

    # Helvetica (a PDF core font) holds Latin-1 only: the essays' dashes and quotes are left out
    words = essay_document(400).encode("latin-1", "ignore").decode("latin-1").split()
    pages = [" ".join(words[i * 100:(i + 1) * 100]) for i in range(4)]
    pages[2] += " The secret code of the blue door is 4172."
    pdf = pdf_pages(tmp_path / "essay.pdf", pages)
    trace = tmp_path / "trace.jsonl"
    run = subprocess.run([sys.executable, "-m", "memagent.cli", "ask", "--model", str(real_model_dir), "--document",
                          str(pdf), "--question", "What is the secret code of the blue door?", "--chunk-tokens", "128",
                          "--memory-tokens", "32", "--answer-tokens", "32", "--trace", str(trace), "--trace-chunks",
                          "--no-progress"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip()  # the answer, or "(no answer: ...)" with the raw reply
    steps = [json.loads(line) for line in trace.read_text().splitlines() if '"chunk_start"' in line]
    assert len(steps) >= 4
    for r in steps:
        assert r["source"].startswith("page"), r
        numbers = [int(n) for n in r["source"].split()[-1].split("-")]
        first_word = r["chunk_text"].split()[0]
        assert any(first_word in pages[n - 1] for n in numbers), (r["source"], first_word)
    assert steps[0]["source"] == "page 1" and steps[-1]["source"].endswith("4")
    assert any("3" in r["source"] for r in steps if "4172" in r["chunk_text"])

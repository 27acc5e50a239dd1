"""memagent report: a trace as one self-contained HTML file; every model/document text stays text."""
from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from memagent.cli import run
from memagent.timeline.report import json_for_script, report_data

EVIL = 'keep <script>window.pwned = 1</script> & "q" </script><img src=x onerror=alert(1)>'


class _Tags(HTMLParser):
    """Start tags (name, attrs) and the text of each <script> block, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._in: dict | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in, self._buf = dict(attrs), []

    def handle_data(self, data):
        if self._in is not None:
            self._buf.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._in is not None:
            self.scripts.append((self._in, "".join(self._buf)))
            self._in = None


def _trace(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _records(doc="d0"):
    return [
        dict(doc_id=doc, step=0, chunk_start=0, chunk_tokens=50, prompt_tokens=90, memory_tokens=8,
             memory="k1 v1 filler", truncated=False, seconds=0.1, batch_size=1, chunk_text="chunk " + EVIL),
        dict(doc_id=doc, step=1, chunk_start=50, chunk_tokens=50, prompt_tokens=90, memory_tokens=8,
             memory="k1 v1 " + EVIL, truncated=True, seconds=0.1, batch_size=1),
        dict(doc_id=doc, step=2, kind="final", prompt_tokens=40, memory_tokens=8, answer=EVIL,
             raw_answer="\\boxed{x}", seconds=0.1, batch_size=1),
    ]


def test_report_data_rows_answer_and_evidence():
    data = report_data(_records() + _records("d1"), doc="d1")
    [doc] = data["docs"]
    assert doc["doc_id"] == "d1" and [r["step"] for r in doc["rows"]] == [0, 1]
    assert doc["rows"][1]["removed"] == ["filler"] and doc["rows"][1]["truncated"] is True
    assert doc["final"]["answer"] == EVIL
    assert doc["evidence"] == [0, 1]  # k1 v1 from step 0, the EVIL words from step 1


def test_json_for_script_escapes_and_round_trips():
    text = json_for_script({"m": EVIL + "\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"m": EVIL + "\u2028"}


def test_report_file_is_self_contained_and_text_stays_text(tmp_path):
    trace = _trace(tmp_path / "trace.jsonl", _records())
    out = tmp_path / "report.html"
    assert run(["report", str(trace), "--out", str(out)]) == 0
    html_text = out.read_text(encoding="utf-8")
    parser = _Tags()
    parser.feed(html_text)
    # exactly three scripts: the data block, timeline.js and the boot code; none loads anything
    assert [a.get("type") for a, _ in parser.scripts] == ["application/json", None, None]
    assert all("src" not in a for a, _ in parser.scripts)
    assert not [t for t, a in parser.tags if t in ("img", "link", "iframe")]  # EVIL's <img> is not a tag
    data = json.loads(parser.scripts[0][1])
    assert data["docs"][0]["rows"][1]["memory"] == "k1 v1 " + EVIL
    assert data["docs"][0]["rows"][0]["chunk_text"] == "chunk " + EVIL
    assert "window.pwned" not in parser.scripts[1][1] + parser.scripts[2][1]
    assert "Content-Security-Policy" in html_text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "trace.jsonl"]  # no temp file left


def test_report_refuses_its_trace_as_out_and_bad_traces(tmp_path, capsys):
    trace = _trace(tmp_path / "trace.jsonl", _records())
    before = trace.read_bytes()
    assert run(["report", str(trace), "--out", str(trace)]) == 2
    assert trace.read_bytes() == before
    assert "destroy the input" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"doc_id": "a", "step": 0, "memory": "x"}\n{not json\n', encoding="utf-8")
    assert run(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    other = _trace(tmp_path / "other.jsonl", [{"id": 1, "question": "q"}])
    assert run(["report", str(other), "--out", str(tmp_path / "r.html")]) == 2
    assert "other.jsonl:1: not a memagent trace record" in capsys.readouterr().err
    steps = _trace(tmp_path / "steps.jsonl", [{"doc_id": "a", "step": "zero", "memory": "x"}])
    assert run(["report", str(steps), "--out", str(tmp_path / "r.html")]) == 2
    assert "steps.jsonl:1: step must be an integer >= 0, got 'zero'" in capsys.readouterr().err
    nomem = _trace(tmp_path / "nomem.jsonl", [{"doc_id": "a", "step": 0, "memory": None}])
    assert run(["report", str(nomem), "--out", str(tmp_path / "r.html")]) == 2
    assert "nomem.jsonl:1: memory record without a 'memory' text" in capsys.readouterr().err
    assert run(["report", str(trace), "--out", str(tmp_path / "r.html"), "--doc", "nope"]) == 2
    assert "--doc 'nope': no such document" in capsys.readouterr().err
    assert run(["report", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r.html")]) == 2
    assert "no such trace file" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_report_from_a_real_ask_trace(tmp_path, tiny_model_dir):
    doc = tmp_path / "doc.txt"
    doc.write_text("the key is blue. " * 60, encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    assert run(["ask", "--model", str(tiny_model_dir), "--question", "what is the key?", "--document", str(doc),
                "--chunk-tokens", "200", "--memory-tokens", "16", "--answer-tokens", "8", "--trace", str(trace),
                "--no-progress", "--device", "cpu"]) == 0
    out = tmp_path / "r.html"
    assert run(["report", str(trace), "--out", str(out)]) == 0
    memory_lines = [json.loads(x) for x in trace.read_text().splitlines() if '"final"' not in x]
    parser = _Tags()
    parser.feed(out.read_text(encoding="utf-8"))
    data = json.loads(parser.scripts[0][1])
    assert len(data["docs"][0]["rows"]) == len(memory_lines) >= 2
    assert data["docs"][0]["final"] is not None


def test_the_report_is_byte_identical_with_the_assets_passed_in(tmp_path):
    """The page's CSS and JS are read by the app layer (memagent.serve.page) and passed in; the report of a fixed
    trace is the same bytes as when timeline/ read them itself (sha256 of that code's output, 3f10368, with the
    same stand-in assets), and `memagent report` inlines the page's files verbatim."""
    import hashlib

    from memagent.serve.page import STATIC, page_assets
    from memagent.timeline.report import PageAssets, read_trace, render_report

    trace = _trace(tmp_path / "t.jsonl", _records() + _records("d1"))
    html = render_report(report_data(read_trace(trace)), "t.jsonl", PageAssets(style="/* css */", script="// js"))
    assert hashlib.sha256(html.encode()).hexdigest() == \
        "d2d04f24a352574954a3848d34ad416faac5a48f1b3a976fc6d80de67d857b30"
    assert run(["report", str(trace), "--out", str(tmp_path / "r.html")]) == 0
    written = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert written == render_report(report_data(read_trace(trace)), "t.jsonl", page_assets())
    for name in ("style.css", "timeline.js"):
        assert "\n" + (STATIC / name).read_text(encoding="utf-8") + "\n" in written
    with pytest.raises(ValueError, match="would end the inlined block"):
        PageAssets(style="a</style>", script="")

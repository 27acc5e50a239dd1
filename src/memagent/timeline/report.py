"""`memagent report`: a trace (`ask --trace`, or any JSONL of memagent trace records) as one self-contained HTML file.

The file holds its CSS and JS inline (the page's `style.css` and `timeline.js`) and the data as JSON in a
`<script type="application/json">` block, `<`, `>` and `&` written as \\u escapes so no text of the document or
the model can close the block; the JS renders every text with textContent. A Content-Security-Policy keeps
the file from loading anything. Per document: one row per chunk (token offset, the memory after it, the
words added and removed, a cut flag, the chunk's text when the trace holds it, the page, chapter or heading it
came from for a PDF, HTML or EPUB document), the final answer and its evidence steps
(`memagent.timeline.evidence_steps`): "memory came from: page 214" where the records carry their `source`.

The CSS and JS are the service page's own files (`memagent/serve/static/`): the report and the page show a
timeline with the same code and look, from one copy. The app layer reads them (`memagent.serve.page.page_assets`)
and passes their text in (`PageAssets`); this module reads no file but the trace.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent.errors import InputError
from memagent.io import atomic_write_text, check_output_file
from memagent.jsonl import iter_jsonl
from memagent.timeline.rows import evidence_sources, evidence_steps, group_by_doc, is_memory, other_calls, timeline_rows

_CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'")

_BOOT = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("memagent-data").textContent);
  var root = document.getElementById("timelines");
  data.docs.forEach(function (doc) {
    var t = new MemTimeline.Timeline(root, "document " + doc.doc_id);
    doc.rows.forEach(function (row) { t.addRow(row); });
    (doc.calls || []).forEach(function (call) { t.addCall(call); });
    t.setProgress(doc.rows.length, doc.rows.length);
    if (doc.final) t.setAnswer(doc.final, doc.evidence);
    else t.answerBox.textContent = "The trace has no final answer for this document (the run stopped before it).";
  });
})();
"""


class ReportError(InputError):
    """A trace that cannot be made into a report (missing, not JSONL, not trace records, unknown --doc)."""


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL trace; every line must be an object with `doc_id` and `step`."""
    if not path.is_file():
        raise ReportError(f"{path}: no such trace file; write one with `memagent ask ... --trace FILE`")
    records = []
    for lineno, rec in iter_jsonl(path, ReportError):
        if not isinstance(rec, dict) or "step" not in rec or "doc_id" not in rec:
            raise ReportError(f"{path}:{lineno}: not a memagent trace record (an object with doc_id and step "
                              "expected); give the file written by `ask --trace`")
        if isinstance(rec["step"], bool) or not isinstance(rec["step"], int) or rec["step"] < 0:
            raise ReportError(f"{path}:{lineno}: step must be an integer >= 0, got {rec['step']!r}")
        if is_memory(rec) and not isinstance(rec.get("memory"), str):
            raise ReportError(f"{path}:{lineno}: memory record without a 'memory' text; is it a memagent trace?")
        records.append(rec)
    if not records:
        raise ReportError(f"{path}: the trace holds no records")
    return records


def report_data(records: list[dict[str, Any]], doc: str | None = None) -> dict[str, Any]:
    """{docs: [{doc_id, rows, calls, final, evidence, sources}]} for every document of the trace (or only `doc`);
    `sources`: the pages, chapters or headings of the evidence chunks (`evidence_sources`; empty for text); `calls`:
    the calls of kinds other than memory and final (a workflow's own, e.g. "query"), each {kind, step, text}."""
    groups = group_by_doc(records)
    if doc is not None:
        if doc not in groups:
            known = ", ".join(list(groups)[:10])
            raise ReportError(f"--doc {doc!r}: no such document in the trace (documents: {known})")
        groups = {doc: groups[doc]}
    docs = []
    for doc_id, recs in groups.items():
        finals = [r for r in recs if r.get("kind") == "final"]
        final = None
        if finals:
            f = finals[-1]
            final = dict(answer=f.get("answer"), raw_answer=f.get("raw_answer"), step=f.get("step"))
        calls = [dict(kind=str(r["kind"]), step=r.get("step"), text=_call_text(r)) for r in other_calls(recs)]
        docs.append(dict(doc_id=doc_id, rows=timeline_rows(recs), calls=calls, final=final,
                         evidence=evidence_steps(recs), sources=evidence_sources(recs)))
    return dict(docs=docs)


def _call_text(r: dict[str, Any]) -> str:
    """What a call of another kind wrote: its `text` (or `query`, `raw`), as a string."""
    for key in ("text", "query", "raw"):
        if r.get(key) is not None:
            return str(r[key])
    return ""


def json_for_script(data: Any) -> str:
    """JSON safe inside <script type="application/json">: <, > and & as \\u escapes (JSON.parse reads them back)."""
    text = json.dumps(data, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


@dataclass(frozen=True)
class PageAssets:
    """The page's CSS (`style.css`) and timeline JS (`timeline.js`), inlined into each report."""

    style: str
    script: str

    def __post_init__(self) -> None:
        for name, text in (("style", self.style), ("script", self.script)):
            if "</" in text:  # it would end the inlined <style>/<script> block
                raise ValueError(f"the page's {name} holds '</', which would end the inlined block")


def render_report(data: dict[str, Any], title: str, assets: PageAssets) -> str:
    """The self-contained HTML document of `report_data`'s output, with the page's `assets` inlined."""
    return "\n".join([
        "<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>", f"<style>\n{assets.style}\n</style>", "</head>", "<body>",
        f'<header><h1>MemAgent report</h1><p class="lead">{html.escape(title)}: one row per chunk read; '
        "click a row for the chunk's text; highlighted rows are the chunks the final memory came from.</p></header>",
        '<main><div id="timelines"></div></main>',
        f'<script type="application/json" id="memagent-data">{json_for_script(data)}</script>',
        f"<script>\n{assets.script}\n</script>", f"<script>{_BOOT}</script>", "</body>", "</html>", ""])


def write_report(trace: Path, out: Path, doc: str | None = None, *, assets: PageAssets) -> int:
    """Write the report of `trace` to `out` atomically, the page's `assets` inlined; returns the number of
    documents in it."""
    check_output_file(out, "--out", {"TRACE": trace})
    data = report_data(read_trace(trace), doc)
    atomic_write_text(out, render_report(data, trace.name, assets))
    return len(data["docs"])

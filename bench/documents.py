"""Benchmark: RAM stays flat in the number of pages (issue 37). Peak RSS of reading a 2,000-page PDF against a
20-page one, each in a fresh subprocess; target: the ratio at most 1.10.

Two measurements per PDF, each its own process (peak RSS: the process's VmHWM, see `peak_rss_mb`):
- `pipeline`: what `memagent ask --document FILE.pdf` does before the model: `check_document`, then every chunk of
  `iter_chunks` (C = 512 tokens of the project's tiny tokenizer) consumed, none kept; the headline.
- `reader`: pypdf's pages alone (`document_segments`), no tokenizer in the process: the smallest base, so the
  reader's own growth shows (MB per 1,000 pages).
The PDFs are written with fpdf2 (45 lines of 12 words a page, every page different), into bench/results/tmp.

`html_shapes` (issue 48, class 4): seconds per MB of reading hostile HTML pages of 1 to 64 MB (`check_document`,
then every piece of `document_segments`: what `ask --document` does before the tokenizer), each size in a fresh
process; linear time is a flat seconds-per-MB column. Shapes: `long_attribute` (one attribute value of the whole
size on one tag: was quadratic, the parser rescanned the unfinished tag at each 64 KiB block), `unclosed_tags`
(`<p>word ` repeated: a million and more elements never closed), `unfinished_tag` (`<a b` repeated: one tag that
never ends), `headings` (`<h2>Heading n</h2><p>text</p>` repeated: a new place per heading).
Run: .venv/bin/python bench/documents.py   (about a minute on 2 cores, the PDFs written once)
     .venv/bin/python bench/documents.py --html-only --html-sizes 1,4,16,64   (the HTML rows alone, kept beside
     the PDF rows of the last full run)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, WORK, machine, table, write_result

LINES, WORDS = 45, 12  # a page of text: about 3,500 characters


def make_pdf(path: Path, pages: int) -> Path:
    """A PDF of `pages` pages of known text ("p{page} l{line} word..."), written once."""
    if path.exists():
        return path
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=10)
    for i in range(pages):
        pdf.add_page()
        for j in range(LINES):
            words = " ".join(f"word{(i * 31 + j * 7 + k) % 997}" for k in range(WORDS))
            pdf.text(15, 15 + j * 6, f"p{i + 1} l{j} {words}")
    path.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(path))
    return path


HTML_SHAPES = {
    "long_attribute": (b'<html><body><p>before</p><img alt="', b"a", b'"><p>after</p></body></html>'),
    "unclosed_tags": (b"<html><body>", b"<p>word ", b"</body></html>"),
    "unfinished_tag": (b"<html><body><p>text</p><a ", b"b c=d ", b""),
    "headings": (b"<html><body>", b"<h2>Heading n</h2><p>text of it</p>\n", b"</body></html>"),
}


def make_html(path: Path, shape: str, mb: int) -> Path:
    """A page of `shape` (HTML_SHAPES: head, a unit repeated, tail) of `mb` MiB, written once."""
    if path.exists() and path.stat().st_size >= mb << 20:
        return path
    head, unit, tail = HTML_SHAPES[shape]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(head)
        f.write(unit * (((mb << 20) - len(head) - len(tail)) // len(unit)))
        f.write(tail)
    return path


def measure(path: Path, mode: str) -> dict:
    """In this (fresh) process: read `path` as `mode` does; seconds, counts and peak RSS."""
    t0 = time.perf_counter()
    if mode == "html":
        from memagent.documents import DocumentError, check_document, document_segments

        pieces = chars = 0
        try:
            check_document(path)
            for text, _ in document_segments(path, "html"):
                pieces, chars = pieces + 1, chars + len(text)
            refused = None
        except DocumentError as e:
            refused = str(e)[:160]
        mb = path.stat().st_size / (1 << 20)
        seconds = time.perf_counter() - t0
        return dict(mb=round(mb, 2), pieces=pieces, chars=chars, refused=refused, seconds=round(seconds, 3),
                    seconds_per_mb=round(seconds / mb, 4), peak_rss_mb=peak_rss_mb(),
                    load_avg_1min=round(os.getloadavg()[0], 2))  # the machine is shared: what ran beside it
    if mode == "reader":
        from memagent.documents import document_segments

        pages = chars = 0
        for text, _ in document_segments(path, "pdf"):
            pages, chars = pages + 1, chars + len(text)
        out = dict(pages=pages, chars=chars)
    else:
        from memagent.agent.chunking import iter_chunks
        from memagent.backends.tiny import build_tokenizer
        from memagent.documents import check_document

        tok = build_tokenizer()
        check_document(path)
        chunks = tokens = 0
        last = None
        for c in iter_chunks(path, tok, 512):
            chunks, tokens, last = chunks + 1, tokens + len(c.token_ids), c.source
        out = dict(chunks=chunks, tokens=tokens, last_source=last)
    return dict(out, seconds=round(time.perf_counter() - t0, 2), peak_rss_mb=peak_rss_mb())


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: its own address space's high-water mark). getrusage's ru_maxrss
    would not do: Linux carries it across fork and exec, so a child started by a larger parent reports the
    parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # not Linux: the best there is


def in_subprocess(path: Path, mode: str) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--measure", str(path), "--mode", mode]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def html_shapes(sizes: list[int], shapes: list[str] | None = None, earlier: dict | None = None) -> dict:
    """Seconds per MB of every HTML shape (or `shapes`) at every size (each a fresh process), with this machine's
    state; merged into the rows of an `earlier` result (a shape and size measured again replace their row)."""
    t0 = time.perf_counter()
    rows = {shape: {str(mb): in_subprocess(make_html(WORK / f"html_{shape}_{mb}mb.html", shape, mb), "html")
                    for mb in sizes} for shape in (shapes or HTML_SHAPES)}
    if earlier:
        merged = {shape: dict(rs) for shape, rs in earlier.get("rows", {}).items()}
        for shape, rs in rows.items():
            merged.setdefault(shape, {}).update(rs)
        rows = {shape: dict(sorted(rs.items(), key=lambda kv: int(kv[0]))) for shape, rs in merged.items()}
        sizes = sorted({int(mb) for rs in rows.values() for mb in rs})
    table([[shape, mb, r["seconds"], r["seconds_per_mb"], r["peak_rss_mb"], "refused" if r["refused"] else ""]
           for shape, rs in rows.items() for mb, r in rs.items()],
          ["shape", "MiB", "seconds", "s/MB", "peak RSS MB", ""])
    spread = {shape: round(max(r["seconds_per_mb"] for r in rs.values())
                           / max(min(r["seconds_per_mb"] for r in rs.values()), 1e-9), 2) for shape, rs in rows.items()}
    return dict(sizes_mib=sizes, rows=rows, seconds_per_mb_max_over_min=spread, machine=machine(),
                seconds_total=round(time.perf_counter() - t0, 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=20)
    ap.add_argument("--large", type=int, default=2000)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="pipeline", choices=["pipeline", "reader", "html"])
    ap.add_argument("--html-sizes", default="1,4,16,64", help="MiB of each HTML shape (comma-separated)")
    ap.add_argument("--html-only", action="store_true", help="only the HTML shapes; the PDF rows are kept")
    ap.add_argument("--shapes", default=None, help=f"HTML shapes to measure (comma-separated; default all: "
                                                   f"{','.join(HTML_SHAPES)}); rows measured before are kept")
    args = ap.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.mode)))
        return
    sizes = [int(x) for x in args.html_sizes.split(",")]
    shapes = args.shapes.split(",") if args.shapes else None
    path = RESULTS / "documents.json"
    data = json.loads(path.read_text()) if path.exists() else {"benchmark": "documents"}
    html = html_shapes(sizes, shapes, data.get("html_shapes") if shapes else None)
    if args.html_only:
        data["html_shapes"] = html
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path} (html_shapes)")
        return
    t0 = time.perf_counter()
    pdfs = {n: make_pdf(WORK / f"documents_{n}_pages.pdf", n) for n in (args.small, args.large)}
    runs = {mode: {n: in_subprocess(p, mode) for n, p in pdfs.items()} for mode in ("pipeline", "reader")}
    ratio = {mode: round(r[args.large]["peak_rss_mb"] / r[args.small]["peak_rss_mb"], 3) for mode, r in runs.items()}
    growth = {mode: round((r[args.large]["peak_rss_mb"] - r[args.small]["peak_rss_mb"])
                          / (args.large - args.small) * 1000, 2) for mode, r in runs.items()}
    table([[mode, n, r["seconds"], r["peak_rss_mb"]] for mode, rs in runs.items() for n, r in rs.items()],
          ["measure", "pages", "seconds", "peak RSS MB"])
    print(f"peak RSS ratio {args.large} / {args.small} pages: pipeline {ratio['pipeline']}, reader {ratio['reader']}")
    write_result("documents", dict(
        config=dict(small_pages=args.small, large_pages=args.large, chunk_tokens=512, lines_per_page=LINES,
                    pdf_bytes={n: p.stat().st_size for n, p in pdfs.items()}),
        runs=runs, growth_mb_per_1000_pages=growth, seconds_total=round(time.perf_counter() - t0, 1),
        html_shapes=html,
        headline=dict(documents_rss_ratio=ratio["pipeline"], documents_reader_rss_ratio=ratio["reader"]),
        targets=dict(documents_rss_ratio="<= 1.10", documents_reader_rss_ratio="<= 1.10"),
    ))


if __name__ == "__main__":
    main()

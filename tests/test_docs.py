"""The README is the front door: at most 200 lines, and every page of docs/ reachable from it; every relative
link of the README and of docs/ points at a file that exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text(encoding="utf-8")) if "://" not in t and not t.startswith("mailto:")]


def test_readme_is_short_and_links_every_docs_page():
    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 200
    linked = {(ROOT / t).resolve() for t in relative_links(readme)}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages and [p.name for p in pages if p.resolve() not in linked] == []


def test_relative_links_point_at_files():
    broken = [(page.name, t) for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
              for t in relative_links(page) if not (page.parent / t).exists()]
    assert broken == []

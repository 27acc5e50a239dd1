"""The service page's files (`static/`): served at `/` by `memagent serve` and inlined into every `memagent report`
(memagent.timeline.report.PageAssets), so the page and the report show a timeline with one copy of the code."""
from __future__ import annotations

from pathlib import Path

from memagent.timeline.report import PageAssets

STATIC = Path(__file__).parent / "static"


def page_assets() -> PageAssets:
    """The page's CSS and timeline JS as text, for `memagent report`."""
    return PageAssets(style=(STATIC / "style.css").read_text(encoding="utf-8"),
                      script=(STATIC / "timeline.js").read_text(encoding="utf-8"))

"""Where in a document a piece of text came from, in the words a person holding the document uses.

A PDF's text comes page by page ("page 214"), an EPUB's chapter by chapter in spine order ("chapter 3 "The
Storm""), an HTML page's heading by heading ("heading "Methods""). The chunker (memagent.agent.chunking) gives
every chunk the `label` of the places its tokens came from (`span_label`: "pages 213-214" for a chunk that
crosses a page break), and every memory update records it as `source` beside its token offset.

A leaf module: it imports nothing from memagent.
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("page", "chapter", "heading")


@dataclass(frozen=True)
class Location:
    kind: str  # "page" (PDF) | "chapter" (EPUB) | "heading" (HTML)
    number: int  # 1-based: the page, the chapter's place in the spine, the heading's place on the page (0: before any)
    title: str | None = None  # the chapter's or the heading's text (None: a page, or none found)

    @property
    def label(self) -> str:
        """'page 214', 'chapter 3 "The Storm"', 'heading "Methods"', 'the text before the first heading'."""
        if self.kind == "heading":
            return f'heading "{self.title}"' if self.title else "the text before the first heading"
        name = f"{self.kind} {self.number}"
        return f'{name} "{self.title}"' if self.title else name


def span_label(first: Location, last: Location) -> str:
    """The label of a chunk whose tokens run from `first` to `last`: one place's label, or the range
    ('pages 213-214', 'chapters 3-4', 'headings "Methods" to "Results"')."""
    if first == last:
        return first.label
    if first.kind == "heading":
        return f"{first.label} to {last.label}".replace('heading "', 'headings "', 1) \
            if first.title else f"{first.label} to {last.label}"
    return f"{first.kind}s {first.number}-{last.number}"


def shorten(title: str, most: int = 80) -> str:
    """A title on one line, at most `most` characters (an ellipsis marks a cut)."""
    one = " ".join(title.split())
    return one if len(one) <= most else one[: most - 1].rstrip() + "\u2026"

"""The error of a document that cannot be read, and the check that the optional readers are installed.

`DocumentError` is the one error of every document reader (text, PDF, HTML, EPUB); the chunker
(memagent.agent.chunking) re-exports it where it always was. The CLI prints it as one `error:` line with exit
code 2, `memagent serve` answers it with HTTP 400.
"""
from __future__ import annotations

from memagent.errors import MemAgentError

EXTRA = "documents"  # pyproject.toml's optional extra: pypdf (PDF) and ebooklib (EPUB)


class DocumentError(MemAgentError, ValueError):
    """The document cannot be read (missing file, invalid UTF-8, binary data, a PDF/EPUB/HTML it cannot use)."""


def missing_extra(kind: str, package: str, name: str) -> DocumentError:
    """The error for a `kind` document `name` whose reader (the PyPI `package`) is not installed: it names the extra.
    Raise it from the ImportError of the reader's lazy import."""
    article = "an" if kind[:1] in "AEIOH" else "a"  # an EPUB, an HTML, a PDF
    return DocumentError(f"{name} is {article} {kind} document; reading {kind} needs the optional extra '{EXTRA}' (the "
                         f"package {package}): pip install 'memagent[{EXTRA}]'")

"""Documents stored as files under `STATE_DIR/documents/`, named by an id `doc_<32 hex>` that can
never name a path. Uploads are streamed to a temporary file (`.doc_<id>.part`) and renamed when complete,
so a multi-gigabyte document is never held whole in memory and a cut upload leaves nothing behind; the
pieces a killed server left are removed when the store opens (one server per state folder: none is in use).
An upload of no bytes is refused (no job could read it). A document may be plain text, PDF, HTML or EPUB
(memagent.documents, told apart by content); `check` refuses a bad one (an encrypted or scanned PDF, a zip
bomb, ...) with HTTP 400 and removes it, before any job can take it.
"""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import AsyncIterator

from memagent.documents import DocumentError, check_document
from memagent.serve.errors import ApiError

DOC_ID = re.compile(r"doc_[0-9a-f]{32}")
PART = re.compile(r"\.doc_[0-9a-f]{32}\.part")  # an upload in progress (or left by a killed server)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class DocumentStore:
    """Save and find documents by id; `max_bytes` bounds one document."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)
        for left in folder.iterdir():
            if PART.fullmatch(left.name) and left.is_file():
                left.unlink(missing_ok=True)

    def path(self, doc_id: str) -> Path:
        """The file of `doc_id`; 400 for an id that is not `doc_<32 hex>`, 404 for an unknown one."""
        if not isinstance(doc_id, str) or not DOC_ID.fullmatch(doc_id):
            raise ApiError(400, f"document id {str(doc_id)[:80]!r} is not a document id (doc_ then 32 hex "
                                "digits, as POST /v1/documents returns)", "invalid_request_error")
        path = self.folder / f"{doc_id}.txt"
        if not path.is_file():
            raise ApiError(404, f"no document {doc_id}; upload it with POST /v1/documents", "not_found_error")
        return path

    def check(self, doc_id: str) -> str:
        """The kind of a saved document ("text" | "pdf" | "html" | "epub") after memagent.documents' checks (text
        read as jobs read it: bad bytes replaced); a document that fails them is removed: 400, naming why."""
        path = self.path(doc_id)
        try:
            return check_document(path, errors="replace")
        except DocumentError as e:
            path.unlink(missing_ok=True)
            raise ApiError(400, str(e).replace(str(path), "the document"), "invalid_request_error") from None
        except BaseException:  # a bug in a reader (a 500): the refused upload still never stays on disk
            path.unlink(missing_ok=True)
            raise

    def size(self, doc_id: str) -> int:
        return self.path(doc_id).stat().st_size

    async def save_stream(self, blocks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Write the byte blocks to a new document; returns (id, bytes). 413 past `max_bytes`."""
        doc_id = new_id("doc")
        final = self.folder / f"{doc_id}.txt"
        tmp = self.folder / f".{doc_id}.part"
        n = 0
        try:
            with open(tmp, "wb") as f:
                async for block in blocks:
                    n += len(block)
                    if n > self.max_bytes:
                        raise ApiError(413, f"document over the limit of {self.max_bytes} bytes "
                                            "(the server's --max-document-bytes)", "invalid_request_error")
                    f.write(block)
            if n == 0:
                raise ApiError(400, "the document is empty (the body held no bytes); send its text as the body, "
                                    "or as one multipart form field", "invalid_request_error")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return doc_id, n

    def save_text(self, text: str) -> tuple[str, int]:
        data = text.encode("utf-8")
        if len(data) > self.max_bytes:
            raise ApiError(413, f"document over the limit of {self.max_bytes} bytes", "invalid_request_error")
        doc_id = new_id("doc")
        tmp = self.folder / f".{doc_id}.part"
        tmp.write_bytes(data)
        os.replace(tmp, self.folder / f"{doc_id}.txt")
        self.check(doc_id)  # text that is an HTML page is read as one: its bounds hold
        return doc_id, len(data)

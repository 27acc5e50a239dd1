"""Request helpers: bounded JSON bodies, streamed uploads (raw or multipart), error responses.

A body is refused with 413 as soon as its declared Content-Length is over the limit, before a byte of it is
read; one without a length is counted as it comes. A client that goes away mid-body is a 400 (nobody reads
it), not an internal error. A multipart body counts only when its first part and the whole form end.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from memagent.serve.errors import ApiError


def error_response(status: int, message: str, type: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type}}, status_code=status, headers=headers)


def declared_over(request: Request, limit: int) -> bool:
    """Whether the request's Content-Length says more than `limit` bytes."""
    declared = request.headers.get("content-length", "")
    return declared.isdigit() and int(declared) > limit


async def body_blocks(request: Request) -> AsyncIterator[bytes]:
    """The body's blocks as they come; a client that goes away mid-body is a 400."""
    try:
        async for block in request.stream():
            if block:
                yield block
    except ClientDisconnect:
        raise ApiError(400, "the client closed the connection before its body ended; send it again") from None


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past `limit` bytes (declared or counted), 400 when it is not a JSON
    object."""
    too_large = ApiError(413, f"request body over the limit of {limit} bytes (the server's --max-body-bytes); "
                              "upload a long document with POST /v1/documents and pass its id")
    if declared_over(request, limit):
        raise too_large
    buf = bytearray()
    async for block in body_blocks(request):
        buf += block
        if len(buf) > limit:
            raise too_large
    try:
        data = json.loads(bytes(buf))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e}); send a JSON object") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    return data


async def upload_blocks(request: Request) -> AsyncIterator[bytes]:
    """The uploaded document's bytes, block by block: the raw body, or the first part of a multipart form."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        async for block in body_blocks(request):
            yield block
        return
    boundary = _boundary(ctype)
    from python_multipart import MultipartParser  # lazy: python_multipart (the serve extra)

    out: list[bytes] = []
    part = {"n": 0, "first_ended": False, "form_ended": False}

    def on_part_begin() -> None:
        part["n"] += 1

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if part["n"] == 1:
            out.append(bytes(data[start:end]))

    def on_part_end() -> None:
        part["first_ended"] = part["first_ended"] or part["n"] == 1

    def on_end() -> None:
        part["form_ended"] = True

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_part_data": on_part_data,
                                        "on_part_end": on_part_end, "on_end": on_end})
    try:
        async for block in body_blocks(request):
            parser.write(block)
            while out:
                yield out.pop(0)
        parser.finalize()
    except ApiError:
        raise
    except Exception as e:  # noqa: BLE001  (python_multipart's parse errors)
        raise ApiError(400, f"the multipart body cannot be parsed ({e}); send the file as one form field "
                            "or the raw text as the body") from None
    while out:
        yield out.pop(0)
    if part["n"] == 0:
        raise ApiError(400, "the multipart body holds no file; send one form field with the document")
    if not (part["first_ended"] and part["form_ended"]):  # cut short, or garbage after a boundary line
        raise ApiError(400, "the multipart body ends before its form does (no closing boundary); send the whole "
                            "form, or the raw text as the body")


def _boundary(ctype: str) -> bytes:
    for piece in ctype.split(";")[1:]:
        key, _, value = piece.strip().partition("=")
        if key.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise ApiError(400, "multipart/form-data without a boundary; let the client set the Content-Type")

"""Request helpers: bounded JSON bodies, streamed uploads (raw or multipart), error responses.

A JSON body is read with the CLI's bounds (`memagent.bounded.loads_json`: at most 64 levels of nesting,
integers of at most 4,300 digits, valid UTF-8 text without lone surrogates): a body past them is a 400 naming
the field, not a 500 from the route that walks or prints it. A body is refused with 413 as soon as its
declared Content-Length is over the limit, before a byte of it is read; one without a length is counted as it
comes. A client that goes away mid-body is a 400 (nobody reads
it), not an internal error. A multipart body counts only when its first part and the whole form end.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from memagent.bounded import loads_json
from memagent.serve.errors import ApiError


class BadRequest(ApiError):
    """A 400 made from a message alone (the error type `memagent.bounded` raises)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


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
        text = bytes(buf).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e}); send a JSON object") from None
    # the CLI's bounds (memagent.bounded): nesting, integer digits, lone surrogates (a 400 naming the field)
    data = loads_json(text, "the request body", BadRequest, max_chars=len(text),
                      syntax="{where} is not valid JSON ({reason}); send a JSON object")
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

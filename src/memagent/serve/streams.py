"""Streams over HTTP: create, append, list, read (paged) and delete, and ad-hoc questions over a stream as a job.

Each stream is one stream file (memagent.streams) under `STATE_DIR/streams/`, named by an id `str_<32 hex>` that
can never name a path: the server's state, so streams survive a restart, and each file is also what
`memagent stream show STATE_DIR/streams/ID.stream` reads. Appends of concurrent requests wait for each other (the
stream's writer lock, up to `APPEND_WAIT` seconds) and each request's events are one transaction: all or none,
never interleaved with another's.

    POST   /v1/streams                    {name?, max_event_bytes?}            -> 201 {id, name, events, ...}
    GET    /v1/streams                                                         -> {data: [stream, ...]}
    GET    /v1/streams/{id}                                                    -> the stream and its questions
    DELETE /v1/streams/{id}                                                    -> {id, deleted: true}
    POST   /v1/streams/{id}/events        {events: [{text, role?, time?, source?}, ...]}   -> 201 {ids}
    GET    /v1/streams/{id}/events?after=N&limit=K                             -> {data, next_after}
    POST   /v1/streams/{id}/jobs          {questions, workflow?}   -> 201 {id: job id, document_id, events}

Standing questions (kept current by the server, SSE of their memory versions): memagent.serve.stream_questions.

A job over a stream reads the stream's text as it is when the job is made (its events so far, saved as a
document), with any workflow, and is then an ordinary job (GET /v1/jobs/{id}, its SSE events).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from memagent.serve.documents import new_id
from memagent.serve.errors import ApiError
from memagent.serve.http import read_json
from memagent.serve.jobs import JobManager
from memagent.serve.requests import ServeSettings, check_questions, workflow_of
from memagent.streams import Stream, StreamError

STREAM_ID = re.compile(r"str_[0-9a-f]{32}")
SUFFIX = ".stream"
MAX_EVENTS = 1000  # events in one append request
MAX_PAGE = 1000  # events in one page
APPEND_WAIT = 10.0  # seconds an append waits for another request's append to the same stream


class StreamStore:
    """The server's streams, one file each under `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.on_append: Callable[[str], None] | None = None  # called with a stream's id after each append
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, sid: Any) -> Path:
        """The file of stream `sid`: 400 for an id that is not `str_<32 hex>`, 404 for an unknown one."""
        if not isinstance(sid, str) or not STREAM_ID.fullmatch(sid):
            raise ApiError(400, f"stream id {str(sid)[:80]!r} is not a stream id (str_ then 32 hex digits, as "
                                "POST /v1/streams returns)")
        path = self.folder / f"{sid}{SUFFIX}"
        if not path.is_file():
            raise ApiError(404, f"no stream {sid}; create one with POST /v1/streams", "not_found_error")
        return path

    def open(self, sid: Any) -> Stream:
        path = self.path(sid)
        try:
            return Stream.open(path, wait=APPEND_WAIT)
        except StreamError as e:
            raise api_error(e, path) from None

    def create(self, name: Any, max_event_bytes: Any) -> dict[str, Any]:
        if name is not None and (not isinstance(name, str) or len(name) > 200 or not name.isprintable()):
            raise ApiError(400, "name must be at most 200 printable characters")
        if max_event_bytes is not None and (not isinstance(max_event_bytes, int) or isinstance(max_event_bytes, bool)):
            raise ApiError(400, "max_event_bytes must be a whole number")
        sid = new_id("str")
        try:
            Stream.create(self.folder / f"{sid}{SUFFIX}", max_event_bytes, name or "").close()
        except StreamError as e:
            raise ApiError(400, str(e).replace(str(self.folder), "the state folder")) from None
        return self.info(sid)

    def info(self, sid: str) -> dict[str, Any]:
        with self.open(sid) as s:
            return _describe(sid, s)

    def list(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.folder.glob(f"str_*{SUFFIX}")):
            sid = path.name[: -len(SUFFIX)]
            if STREAM_ID.fullmatch(sid):
                try:
                    out.append(self.info(sid))
                except ApiError as e:  # a damaged file is listed as such, not hidden
                    out.append(dict(id=sid, error=e.message))
        return sorted(out, key=lambda d: d.get("created", 0.0))

    def delete(self, sid: str) -> dict[str, Any]:
        path = self.path(sid)
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), path.with_name(f".{path.name}.lock")):
            p.unlink(missing_ok=True)
        return dict(id=sid, deleted=True)

    def append(self, sid: str, events: Any) -> list[int]:
        if not isinstance(events, list) or not events or not all(isinstance(e, dict) for e in events):
            raise ApiError(400, "give \"events\": a non-empty list of {text, role?, time?, source?} objects")
        if len(events) > MAX_EVENTS:
            raise ApiError(400, f"{len(events)} events, over the limit of {MAX_EVENTS} per request; send them in "
                                "several requests")
        for i, e in enumerate(events):
            unknown = sorted(set(e) - {"text", "role", "time", "source"})
            if unknown:
                raise ApiError(400, f"events[{i}] has the field(s) {', '.join(unknown)[:200]}; an event has text, "
                                    "role, time, source")
        with self.open(sid) as s:
            try:
                return s.append_many(events)
            except StreamError as e:
                raise api_error(e, s.path) from None

    def events(self, sid: str, after: int, limit: int) -> dict[str, Any]:
        with self.open(sid) as s:
            rows = s.events(after, limit)
            return dict(data=[e.as_dict() for e in rows], next_after=rows[-1].id if len(rows) == limit else None)

    def text(self, sid: str, max_bytes: int) -> tuple[str, int]:
        """(the stream's text, its events): 413 past `max_bytes`, the server's document limit."""
        with self.open(sid) as s:
            n, parts, size = len(s), [], 0
            for block in s.text_blocks(n):
                size += len(block.encode("utf-8"))
                if size > max_bytes:
                    raise ApiError(413, f"the stream's text is over the document limit of {max_bytes} bytes (the "
                                        "server's --max-document-bytes)")
                parts.append(block)
        if not parts:
            raise ApiError(400, f"stream {sid} holds no event yet; append some first")
        return "".join(parts), n


def _describe(sid: str, s: Stream) -> dict[str, Any]:
    f = s.file
    return dict(id=sid, name=f.meta("name", ""), events=len(s), created=float(f.meta("created")),
                max_event_bytes=f.max_event_bytes,
                questions=[dict(id=q["id"], question=q["question"], model=q["model"], chunks=q["chunks"],
                                events_read=q["events_read"]) for q in s.questions()])


def api_error(e: StreamError, path: Path) -> ApiError:
    """The HTTP error of a stream failure: 409 for a writer that holds the stream, 500 for a full disk or a damaged
    file, 400 for the rest (the file's path left out)."""
    text = str(e).replace(str(path), "the stream")
    if "another process is appending" in text:
        return ApiError(409, "another request is appending to this stream; retry", "conflict_error")
    if "no space left" in text or "damaged" in text or "not a memagent stream" in text or "I/O error" in text:
        return ApiError(500, text, "server_error")
    return ApiError(400, text)


def _page(request: Request) -> tuple[int, int]:
    out = []
    for name, default, low, high in (("after", 0, 0, 1 << 62), ("limit", 100, 1, MAX_PAGE)):
        text = request.query_params.get(name)
        if text is None:
            out.append(default)
            continue
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or not low <= int(text) <= high:
            raise ApiError(400, f"{name} must be a whole number in {low}..{high}, got {text[:40]!r}")
        out.append(int(text))
    return out[0], out[1]


def stream_routes(app: FastAPI, manager: JobManager, settings: ServeSettings) -> StreamStore:
    """The routes of streams, over `STATE_DIR/streams/` (beside the server's SQLite state)."""
    streams = StreamStore(Path(manager.store.path).parent / "streams")

    @app.post("/v1/streams")
    async def create(request: Request) -> JSONResponse:
        body = await read_json(request, settings.max_body_bytes)
        info = await run_in_threadpool(streams.create, body.get("name"), body.get("max_event_bytes"))
        return JSONResponse(info, status_code=201)

    @app.get("/v1/streams")
    async def list_streams() -> dict[str, Any]:
        return dict(data=await run_in_threadpool(streams.list))

    @app.get("/v1/streams/{sid}")
    async def get_stream(sid: str) -> dict[str, Any]:
        return await run_in_threadpool(streams.info, sid)

    @app.delete("/v1/streams/{sid}")
    async def delete_stream(sid: str) -> dict[str, Any]:
        return await run_in_threadpool(streams.delete, sid)

    @app.post("/v1/streams/{sid}/events")
    async def append(sid: str, request: Request) -> JSONResponse:
        streams.path(sid)  # 400/404 before the body is read
        body = await read_json(request, settings.max_body_bytes)
        ids = await run_in_threadpool(streams.append, sid, body.get("events"))
        if streams.on_append is not None:
            streams.on_append(sid)
        return JSONResponse(dict(ids=ids), status_code=201)

    @app.get("/v1/streams/{sid}/events")
    async def read_events(sid: str, request: Request) -> dict[str, Any]:
        after, limit = _page(request)
        return await run_in_threadpool(streams.events, sid, after, limit)

    @app.post("/v1/streams/{sid}/jobs")
    async def ask(sid: str, request: Request) -> JSONResponse:
        streams.path(sid)
        body = await read_json(request, settings.max_body_bytes)
        questions = check_questions(body.get("questions"), manager, settings)
        workflow = workflow_of(body)
        manager.check_room()
        text, n = await run_in_threadpool(streams.text, sid, manager.docs.max_bytes)
        doc_id = (await run_in_threadpool(manager.docs.save_text, text))[0]
        job_id, _ = manager.submit(doc_id, questions, workflow=workflow)
        return JSONResponse(dict(id=job_id, document_id=doc_id, stream_id=sid, events=n), status_code=201)

    return streams

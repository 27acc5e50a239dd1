"""The FastAPI app: documents, jobs (listed newest first, each with an SSE event stream and its chunks' text),
OpenAI-style chat completions, streams (memagent.serve.streams), health, models and Prometheus metrics; the page at
`/` (files of `static/`).

Every error is `{"error": {"message", "type"}}` with a 4xx/5xx status. With an API key, every route
but `/health` and the page's files needs `Authorization: Bearer KEY`. The key check and the request metrics
are a plain ASGI middleware (`Guard`), not Starlette's BaseHTTPMiddleware: under that one a handler never
sees its client disconnect (`request.is_disconnected()` stays False), and a chat client that went away
could not cancel its job.
"""
from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse

from memagent.serve.chat import chat_routes
from memagent.serve.errors import ApiError
from memagent.serve.http import declared_over, error_response, read_json, upload_blocks
from memagent.serve.jobs import MAX_LIST, JobManager
from memagent.serve.page import STATIC
from memagent.serve.requests import ServeSettings, check_questions, document_of, workflow_of
from memagent.serve.stream_questions import question_routes
from memagent.serve.streams import stream_routes

log = logging.getLogger(__name__)
_OPEN = ("/health",)  # routes that need no key (the page's files are outside /v1 and /metrics too)


def _needs_key(path: str) -> bool:
    return (path.startswith("/v1") or path == "/metrics") and path not in _OPEN


def _route(scope: dict[str, Any]) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or ("/static" if not scope["path"].startswith("/v1") else "unknown")


class Guard:
    """ASGI middleware: the API key of the routes that need it (401 otherwise), and each request's metrics."""

    def __init__(self, app: Any, settings: ServeSettings, metrics: Any) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        key = self.settings.api_key
        if key is not None and _needs_key(scope["path"]):
            given = Request(scope).headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                what = "a wrong API key" if given else "no API key"
                response = error_response(401, f"{what}: send the header 'Authorization: Bearer <key>' with the "
                                               "key of the server's --api-key-env variable", "authentication_error")
                await response(scope, receive, send)
                self.metrics.request("unauthorized", 401, time.perf_counter() - t0)
                return
        status = [500]  # what the request counts as when the app raises before answering

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            self.metrics.request(_route(scope), status[0], time.perf_counter() - t0)


def create_app(manager: JobManager, settings: ServeSettings) -> FastAPI:
    """The app over a running JobManager."""
    app = FastAPI(title="memagent serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.manager, app.state.settings = manager, settings
    app.add_middleware(Guard, settings=settings, metrics=manager.metrics)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, e.message, e.type, e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        return error_response(e.status_code, message, "not_found_error" if e.status_code == 404 else "invalid_request_error")

    @app.exception_handler(Exception)
    async def bug(_: Request, e: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_response(500, f"internal error ({type(e).__name__}); see the server log", "server_error")

    _document_routes(app, manager)
    _job_routes(app, manager, settings)
    _info_routes(app, manager, settings)
    chat_routes(app, manager, settings)
    streams = stream_routes(app, manager, settings)  # /v1/streams (memagent.serve.streams)
    streams.on_append = question_routes(app, manager, settings, streams).poke  # standing questions kept current
    if STATIC.is_dir():
        app.mount("/", StaticFiles(directory=STATIC, html=True), name="page")
    return app


def _document_routes(app: FastAPI, manager: JobManager) -> None:
    @app.post("/v1/documents")
    async def upload(request: Request) -> JSONResponse:
        if declared_over(request, manager.docs.max_bytes + (1 << 16)):  # a multipart form's own bytes allowed
            raise ApiError(413, f"document over the limit of {manager.docs.max_bytes} bytes "
                                "(the server's --max-document-bytes)")
        doc_id, n = await manager.docs.save_stream(upload_blocks(request))
        kind = await run_in_threadpool(manager.docs.check, doc_id)  # a PDF's pages are read off the event loop
        return JSONResponse({"id": doc_id, "bytes": n, "kind": kind}, status_code=201)

    @app.get("/v1/documents/{doc_id}")
    async def document(doc_id: str) -> dict[str, Any]:
        return {"id": doc_id, "bytes": manager.docs.size(doc_id)}


def _job_routes(app: FastAPI, manager: JobManager, settings: ServeSettings) -> None:
    @app.post("/v1/jobs")
    async def create_job(request: Request) -> JSONResponse:
        body = await read_json(request, settings.max_body_bytes)
        questions = check_questions(body.get("questions"), manager, settings)
        manager.check_room()  # before a document is saved for nothing
        job_id, _ = manager.submit(document_of(body, manager), questions, workflow=workflow_of(body))
        return JSONResponse({"id": job_id}, status_code=201)

    @app.get("/v1/jobs")
    async def list_jobs(request: Request) -> dict[str, Any]:
        return manager.recent(_count_param(request, "limit", 20, MAX_LIST))

    @app.get("/v1/jobs/{job_id}")
    async def get_job(job_id: str) -> dict[str, Any]:
        return manager.view(job_id)

    @app.delete("/v1/jobs/{job_id}")
    async def cancel_job(job_id: str) -> dict[str, Any]:
        return manager.cancel(job_id)

    @app.get("/v1/jobs/{job_id}/chunks/{chunk_no}")
    async def job_chunk(job_id: str, chunk_no: str) -> dict[str, Any]:
        manager.job_or_404(job_id)
        if not (chunk_no.isascii() and chunk_no.isdigit()) or len(chunk_no) > 12:
            raise ApiError(400, f"chunk number {chunk_no[:40]!r} is not a whole number >= 0 (the `step` of a "
                                "memory record)")
        return manager.chunk(job_id, int(chunk_no))

    @app.get("/v1/jobs/{job_id}/events")
    async def job_events(job_id: str, request: Request) -> StreamingResponse:
        with_text = _flag_param(request, "chunk_text", True)
        live = manager.subscribe(job_id)
        return StreamingResponse(_sse(live, settings.wait_seconds, with_text), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _count_param(request: Request, name: str, default: int, most: int) -> int:
    """The query parameter `name` as a whole number in 1..most (`default` when absent); 400 otherwise."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text[:12]) <= most:
        raise ApiError(400, f"{name} must be a whole number in 1..{most}, got {text[:40]!r}")
    return int(text)


def _flag_param(request: Request, name: str, default: bool) -> bool:
    """The query parameter `name` as a flag (1/true/yes or 0/false/no); 400 otherwise."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise ApiError(400, f"{name} must be 1 or 0 (true or false), got {text[:40]!r}")


async def _sse(live: Any, wait: float, with_text: bool = True) -> AsyncIterator[str]:
    """Every event so far, then the live ones, until the job ends (its last event is `state`); without
    `with_text`, step events leave out `chunk_text` (GET /v1/jobs/{id}/chunks/{k} gives it on demand)."""
    i = 0
    while True:
        events, ended = live.since(i)
        for name, data in events:
            if not with_text and "chunk_text" in data:
                data = {k: v for k, v in data.items() if k != "chunk_text"}
            yield f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
        i += len(events)
        if ended:  # the last event and the end are set together: nothing comes after
            return
        await live.wait(i, wait)


def _info_routes(app: FastAPI, manager: JobManager, settings: ServeSettings) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_name, "jobs_running": manager.count("running"),
                "jobs_queued": manager.count("queued")}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "memagent"}]}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(manager.metrics.render(), media_type="text/plain; version=0.0.4")

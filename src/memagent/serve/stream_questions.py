"""Standing questions of the server's streams (memagent.streams.standing) over HTTP, kept current by the server.

    POST /v1/streams/{id}/questions                {question}  -> 201 {id, question, ...}: registered with the
                                                   server's model and settings, and read up to the stream's end
    GET  /v1/streams/{id}/questions/{qid}          -> {id, question, chunks, events_read, memories, answers}
    POST /v1/streams/{id}/questions/{qid}/answer   -> {answer, raw_answer, memory, events, chunks, calls}
    GET  /v1/streams/{id}/questions/{qid}/events   -> SSE: `memory` (each version, the kept ones first, then each
                                                   as it is made) and `answer` events, until the client leaves

One worker thread advances them: after each append to a stream, and for every stream at start (a restarted server
reads what arrived while it was down; the versions saved before stay as they were). A question registered with
another model (a stream file shared with `memagent stream watch`) is left to its own watcher. The SSE stream reads
SQLite (every `wait_seconds`), so it shows versions whichever process made them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse

from memagent.errors import MemAgentError
from memagent.serve.errors import ApiError
from memagent.serve.http import read_json
from memagent.serve.jobs import JobManager
from memagent.serve.requests import ServeSettings, check_questions
from memagent.serve.streams import StreamStore, api_error
from memagent.streams import StreamError

log = logging.getLogger(__name__)


class Keeper:
    """The worker that keeps the standing questions of the server's streams current."""

    def __init__(self, streams: StreamStore, manager: JobManager, model: str) -> None:
        self.streams, self.manager, self.model = streams, manager, model
        self.todo: "queue.Queue[str]" = queue.Queue()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="memagent-streams")
        self.thread.start()
        for info in streams.list():
            if info.get("questions"):
                self.todo.put(info["id"])

    def poke(self, sid: str) -> None:
        self.todo.put(sid)

    def stop(self) -> None:
        """End the worker after the stream it is advancing (an advance cut short loses only its model call)."""
        self.stopped.set()

    def _loop(self) -> None:
        while not (self.stopped.is_set() or self.manager.stopping):  # the server's shutdown ends it too
            try:
                sid = self.todo.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.advance(sid)
            except ApiError as e:  # the stream was deleted, or is damaged
                log.warning("stream %s: %s", sid, e.message)
            except MemAgentError as e:
                log.warning("stream %s: a standing question could not advance: %s", sid, e)
            except Exception:  # noqa: BLE001 - a bug: logged, the worker goes on with the next stream
                log.exception("stream %s: internal error while advancing its standing questions", sid)

    def advance(self, sid: str) -> None:
        with self.streams.open(sid) as s:
            for q in s.questions():
                if q["model"] == self.model:
                    s.standing(q["question"], self.manager.backend, self.manager.config, self.model).advance()


def _question(s: Any, qid: str) -> dict[str, Any]:
    if not (qid.isascii() and qid.isdigit()) or len(qid) > 12:
        raise ApiError(400, f"question id {qid[:40]!r} is not a whole number")
    q = next((q for q in s.questions() if q["id"] == int(qid)), None)
    if q is None:
        raise ApiError(404, f"this stream has no standing question {qid}", "not_found_error")
    return q


def question_routes(app: FastAPI, manager: JobManager, settings: ServeSettings, streams: StreamStore) -> Keeper:
    keeper = Keeper(streams, manager, settings.model_name)

    def register(sid: str, question: str) -> dict[str, Any]:
        with streams.open(sid) as s:
            try:
                q = s.standing(question, manager.backend, manager.config, settings.model_name)
            except StreamError as e:
                raise api_error(e, s.path) from None
            keeper.poke(sid)
            return view(sid, str(q.id))

    def view(sid: str, qid: str) -> dict[str, Any]:
        with streams.open(sid) as s:
            q = _question(s, qid)
            return dict(id=q["id"], question=q["question"], model=q["model"], chunks=q["chunks"],
                        events_read=q["events_read"], events=len(s),
                        memories=s.memories(q["id"]),
                        answers=s.answers(q["id"]))

    def answer(sid: str, qid: str) -> dict[str, Any]:
        with streams.open(sid) as s:
            q = _question(s, qid)
            if q["model"] != settings.model_name:
                raise ApiError(400, f"standing question {qid} was registered with the model {q['model']!r}, not "
                                    f"this server's ({settings.model_name!r}); ask it where that model runs")
            try:
                a = s.standing(q["question"], manager.backend, manager.config, settings.model_name).answer()
            except StreamError as e:
                raise api_error(e, s.path) from None
            return dict(answer=a.answer, raw_answer=a.raw_answer, memory=a.memory, events=a.events, chunks=a.chunks,
                        calls=a.calls)

    @app.post("/v1/streams/{sid}/questions")
    async def add(sid: str, request: Request) -> JSONResponse:
        streams.path(sid)
        body = await read_json(request, settings.max_body_bytes)
        (question,) = check_questions([body.get("question")], manager, settings)
        return JSONResponse(await run_in_threadpool(register, sid, question), status_code=201)

    @app.get("/v1/streams/{sid}/questions/{qid}")
    async def get(sid: str, qid: str) -> dict[str, Any]:
        return await run_in_threadpool(view, sid, qid)

    @app.post("/v1/streams/{sid}/questions/{qid}/answer")
    async def ask(sid: str, qid: str) -> dict[str, Any]:
        return await run_in_threadpool(answer, sid, qid)

    @app.get("/v1/streams/{sid}/questions/{qid}/events")
    async def events(sid: str, qid: str, request: Request) -> StreamingResponse:
        await run_in_threadpool(view, sid, qid)  # 400/404 before the stream starts
        return StreamingResponse(_sse(request, view, sid, qid, settings.wait_seconds), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return keeper


async def _sse(request: Request, view: Any, sid: str, qid: str, wait: float) -> AsyncIterator[str]:
    """Each memory version and answer of the question as an SSE event, the kept ones first, then as they come."""
    sent_memories = sent_answers = 0
    while not await request.is_disconnected():
        try:
            now = await run_in_threadpool(view, sid, qid)
        except ApiError as e:  # deleted meanwhile
            yield f"event: error\ndata: {json.dumps({'message': e.message})}\n\n"
            return
        for m in now["memories"][sent_memories:]:
            yield f"event: memory\ndata: {json.dumps(m, ensure_ascii=False)}\n\n"
        for a in now["answers"][sent_answers:]:
            yield f"event: answer\ndata: {json.dumps(a, ensure_ascii=False)}\n\n"
        sent_memories, sent_answers = len(now["memories"]), len(now["answers"])
        await asyncio.sleep(wait)

"""`POST /v1/chat/completions`, OpenAI-compatible: the last user message is the question, the messages
before it (or a `document` / `document_id` field of the body) the document. A chat of one user message
(document and question together, as harnesses send it) is split by the prompt rule
(`memagent.split_prompt`: the server's `--prompt-split`, or the body's `prompt_split`). The reply's `usage`
counts every model call of the run (`usage.calls` the number of calls). With `stream: true` the reply
is OpenAI's chunk stream; progress goes as SSE comments (`: progress 3/25`), which clients skip. A `workflow`
field names the reading workflow of this request (default: the server's `--workflow`), as in POST /v1/jobs.
A client that goes away cancels its job.

OpenAI's sampling fields (`temperature`, `top_p`, `max_tokens`, `max_completion_tokens`, `n`, `seed`) are not
applied: the server reads with the sampling and budgets of its profile and flags (one run reads a document in many
calls of set sizes). A value that is not one OpenAI accepts (NaN, an infinity, a string, `max_tokens` past 2**31,
`n` other than 1) is a 400; a sound one is named in the reply's `memagent.ignored` (issue 48, class 7).
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, StreamingResponse

from memagent.split_prompt import RULES, PromptSplitError, SplitRule, parse_rule, split_prompt
from memagent.errors import MemAgentError
from memagent.serve.errors import ApiError
from memagent.serve.http import read_json
from memagent.serve.jobs import JobManager, Live
from memagent.serve.requests import ServeSettings, check_questions, document_of, workflow_of


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts")


def split_messages(body: dict[str, Any], server_rule: SplitRule = SplitRule("auto")) -> tuple[str, str | None, SplitRule]:
    """(question, document text or None when the body names its own document, the rule that split the last
    user message or `messages`) of a chat request; the body's `prompt_split` wins over the server's rule."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "missing messages: give \"messages\": a list with at least one user message (the question)")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a \"role\" and a \"content\"")
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None:
        raise ApiError(400, "missing question: no message has role \"user\" (the last user message is the question)")
    rule = server_rule if body.get("prompt_split") is None else _rule(body["prompt_split"])
    prompt = _text(messages[last].get("content"), f"messages[{last}]")
    named = body.get("document") is not None or body.get("document_id") is not None
    before = [_text(m.get("content"), f"messages[{i}]") for i, m in enumerate(messages[:last])]
    if named or rule.kind == "messages" or (rule.kind == "auto" and any(t.strip() for t in before)):
        return prompt, None if named else "\n\n".join(t for t in before if t), SplitRule("messages")
    try:
        head, question = split_prompt(prompt, rule)
    except PromptSplitError as e:
        raise ApiError(400, f"cannot find the question in the one-message prompt: {e}; send the question as the "
                            "last user message with the document in the messages before it (or in \"document\"), "
                            "or set \"prompt_split\" to a rule that fits the prompt "
                            f"({', '.join(RULES)})") from None
    return question, "\n\n".join(t for t in before + [head] if t), rule


SAMPLING_FIELDS = {  # OpenAI's field -> (lowest, highest, integer only)
    "temperature": (0.0, 2.0, False), "top_p": (0.0, 1.0, False), "max_tokens": (1, 2**31 - 1, True),
    "max_completion_tokens": (1, 2**31 - 1, True), "n": (1, 1, True), "seed": (-2**63, 2**63 - 1, True)}


def ignored_sampling(body: dict[str, Any]) -> list[str]:
    """The OpenAI sampling fields `body` sets (not null), each checked as OpenAI checks it: an ApiError 400 for a
    value that is not a number, not finite, not an integer where one is due, or out of its range."""
    given = []
    for name, (low, high, integer) in SAMPLING_FIELDS.items():
        value = body.get(name)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (isinstance(value, float) and not math.isfinite(value)) \
                or (integer and not isinstance(value, int)) or not low <= value <= high:
            what = "an integer" if integer else "a number"
            raise ApiError(400, f"{name} must be {what} in [{low}, {high}], got {json.dumps(value)[:60]}; memagent "
                                f"does not apply it anyway (the server's profile sets the sampling): leave it out")
        given.append(name)
    return given


def _rule(value: Any) -> SplitRule:
    try:
        return parse_rule(value)
    except MemAgentError as e:
        raise ApiError(400, f"prompt_split: {e}") from None


def chat_routes(app: FastAPI, manager: JobManager, settings: ServeSettings) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await read_json(request, settings.max_body_bytes)
        ignored = ignored_sampling(body)
        question, text, rule = split_messages(body, settings.prompt_split)
        try:
            check_questions([question], manager, settings)
        except ApiError as e:
            if rule.kind == "messages":
                raise
            raise ApiError(e.status, f"{e.message} (the question found by prompt_split {str(rule)!r}: "
                                     f"{rule.describe()}); choose a rule that finds a shorter question") from None
        workflow = workflow_of(body)
        manager.check_room()  # before a document is saved for nothing
        doc_id = document_of(body if text is None else {"document": text}, manager)
        job_id, live = manager.submit(doc_id, [question], chat=True, workflow=workflow)
        model = body.get("model") if isinstance(body.get("model"), str) else settings.model_name
        head = dict(id=f"chatcmpl-{job_id[4:]}", created=int(time.time()), model=model)
        if body.get("stream"):
            return StreamingResponse(_stream(manager, job_id, live, head, settings.wait_seconds, ignored),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        while not live.done.is_set():
            if await request.is_disconnected():
                manager.cancel(job_id)
                return JSONResponse({"error": {"message": "client went away", "type": "cancelled"}}, 499)
            await live.wait(len(live.events), settings.wait_seconds)
        answer, extra = _outcome(manager, job_id)
        extra["ignored"] = ignored
        return dict(head, object="chat.completion",
                    choices=[dict(index=0, message=dict(role="assistant", content=answer), finish_reason="stop")],
                    usage=_usage(manager, job_id), memagent=extra)


def _usage(manager: JobManager, job_id: str) -> dict[str, int]:
    u = manager.store.job(job_id)["usage"]
    return dict(prompt_tokens=u["prompt_tokens"], completion_tokens=u["completion_tokens"],
                total_tokens=u["total_tokens"], calls=u["calls"])


def _outcome(manager: JobManager, job_id: str) -> tuple[str, dict[str, Any]]:
    """(the answer text, memagent's extra fields) of a finished chat job; a failed job is an ApiError."""
    view = manager.view(job_id)
    if view["state"] != "done":
        user = view["error"] is not None and not view["error"].startswith("internal error")
        raise ApiError(400 if user else 500, manager.backend.redact(f"the job {view['state']}: {view['error']}"),
                       "invalid_request_error" if user else "server_error")
    q = view["questions"][0]
    answer = q["answer"] if q["answer"] is not None else (q["raw_answer"] or "").strip()
    return answer, dict(job_id=job_id, chunks=q["chunks_done"], evidence=q["evidence"], raw_answer=q["raw_answer"])


def _chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    data = dict(head, object="chat.completion.chunk",
                choices=[dict(index=0, delta=delta, finish_reason=finish)], **extra)
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(manager: JobManager, job_id: str, live: Live, head: dict[str, Any],
                  wait: float, ignored: list[str] | None = None) -> AsyncIterator[str]:
    """OpenAI chunks: the role, progress comments while reading, the answer, the finish with usage, [DONE]."""
    try:
        yield _chunk(head, dict(role="assistant", content=""))
        i = 0
        while True:
            events, ended = live.since(i)
            i += len(events)
            for name, data in events:
                if name == "step":
                    yield f": progress {data['step'] + 1}/{data['chunks_total']}\n\n"
            if ended:
                break
            await live.wait(i, wait)
        try:
            answer, extra = _outcome(manager, job_id)
        except ApiError as e:
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.type}})}\n\n"
            return
        yield _chunk(head, dict(content=answer))
        extra["ignored"] = ignored or []
        yield _chunk(head, {}, "stop", usage=_usage(manager, job_id), memagent=extra)
        yield "data: [DONE]\n\n"
    finally:
        if not live.done.is_set():  # the client went away: stop its work
            manager.cancel(job_id)

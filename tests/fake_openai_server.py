"""A real HTTP server on 127.0.0.1 that answers in the OpenAI shape, for testing the `openai` backend.

It serves a model through `TransformersBackend` (the tests use the tiny model): GET /v1/models,
POST /v1/chat/completions (the backend applies the chat template) and /v1/completions (raw text).
It speaks the vLLM extensions the client may ask for (`return_token_ids`,
`return_tokens_as_token_ids`) and records what it saw (attempts per path, the most requests in
flight at once, the Authorization headers). Faults are injected in order, one per request:
`fail_next(n, status, retry_after)` answers the next n requests with that status (and Retry-After
header), `slow_next(n, seconds)` sleeps before answering (longer than a client's timeout, it is a
timeout), `hang_next(n)` never answers (until the server stops), `trickle_next(n, interval)` sends
the whole reply one byte per interval, `close_next(n, keep)` sends the headers and the first `keep`
bytes of the body then closes the connection, `raw_next(n, body, status)` answers with that body as
is (malformed JSON, an HTML page), and `corrupt_next(n, edit)` answers with `edit(reply)` (a
JSON-able value: wrong field types). `latency` delays every request. The HTTP plumbing (threading
server, handler, trickle / close replies) is tests/loopback_http.py's, shared with bench/sim_server.py.
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter, deque
from typing import Any, Callable

from loopback_http import LoopbackServer, Reply, error_payload as _error, json_reply

from memagent.backends.base import SamplingParams
from memagent.backends.hf import TransformersBackend


class FakeOpenAIServer(LoopbackServer):
    def __init__(self, backend: TransformersBackend, model_names: tuple[str, ...] = ("tiny",),
                 api_key: str | None = None, max_model_len: int | None = 4096) -> None:
        super().__init__()
        # own wrappers over the shared model: the server toggles want_logprobs per request
        self.chat_backend = TransformersBackend(backend.model, backend.tokenizer)
        self.raw_backend = TransformersBackend(backend.model, backend.tokenizer, use_chat_template=False)
        self.model_names = model_names
        self.api_key = api_key
        self.max_model_len = max_model_len
        self.latency = 0.0
        self.attempts: Counter[str] = Counter()  # path -> requests received
        self.bodies: list[dict[str, Any]] = []  # generation request bodies, in arrival order
        self.auth_headers: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults: deque[tuple[str, Any]] = deque()
        self._lock = threading.Lock()  # guards the counters and the fault queue
        self._model_lock = threading.Lock()  # one generation at a time

    def _add(self, n: int, fault: tuple[str, Any]) -> None:
        with self._lock:
            self._faults.extend([fault] * n)

    def fail_next(self, n: int, status: int = 500, retry_after: float | None = None) -> None:
        self._add(n, ("status", (status, retry_after)))

    def slow_next(self, n: int, seconds: float) -> None:
        self._add(n, ("sleep", seconds))

    def hang_next(self, n: int) -> None:
        self._add(n, ("sleep", 1e9))

    def trickle_next(self, n: int, interval: float) -> None:
        self._add(n, ("trickle", interval))

    def close_next(self, n: int, keep: int = 10) -> None:
        self._add(n, ("close", keep))

    def raw_next(self, n: int, body: bytes, status: int = 200, content_type: str = "application/json") -> None:
        self._add(n, ("raw", (status, body, content_type)))

    def corrupt_next(self, n: int, edit: Callable[[dict[str, Any]], Any]) -> None:
        self._add(n, ("edit", edit))

    # -- request handling (called from handler threads) ------------------------------------
    def handle(self, method: str, path: str, headers: Any, body: bytes) -> Reply:
        status, payload, fault = self._answer(method, path, headers, body)
        if fault is None:
            return json_reply(status, payload)
        kind, arg = fault
        if kind == "status":
            code, retry_after = arg
            extra = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
            return Reply(code, json.dumps(_error(f"injected fault {code}", "server_error")).encode(), extra)
        if kind == "raw":
            return Reply(arg[0], arg[1], content_type=arg[2])
        if kind == "edit":
            return json_reply(status, arg(payload))
        data = json.dumps(payload).encode()
        return Reply(status, data, mode=kind, arg=float(arg)) if kind in ("trickle", "close") else Reply(status, data)

    def _answer(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any, Any]:
        """(status, payload, the fault injected into this request or None)."""
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
        return (*self._route(method, path, headers, body, fault), fault)

    def _route(self, method: str, path: str, headers: Any, body: bytes, fault: Any) -> tuple[int, Any]:
        with self._lock:
            self.attempts[path] += 1
            self.auth_headers.append(headers.get("Authorization"))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency:
                self.wait(self.latency)
            if fault and fault[0] == "status":
                return int(fault[1][0]), {}  # the body is made by handle()
            if fault and fault[0] == "sleep":
                self.wait(fault[1])
            if self.api_key is not None and headers.get("Authorization") != f"Bearer {self.api_key}":
                # echoes what it got, as some servers do: the client must scrub it from its errors
                return 401, _error(f"invalid API key {headers.get('Authorization')}", "authentication_error")
            if method == "GET" and path == "/v1/models":
                return 200, {"object": "list", "data": [
                    {"id": m, "object": "model", "max_model_len": self.max_model_len} for m in self.model_names]}
            if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                try:
                    request = json.loads(body)
                except ValueError:
                    return 400, _error("body is not JSON", "invalid_request_error")
                with self._lock:
                    self.bodies.append(request)
                return self._complete(request, chat=path.endswith("chat/completions"))
            return 404, _error(f"no route {method} {path}", "not_found")
        finally:
            with self._lock:
                self.in_flight -= 1

    def _complete(self, req: dict[str, Any], chat: bool) -> tuple[int, dict[str, Any]]:
        if req.get("model") not in self.model_names:
            return 404, _error(f"The model `{req.get('model')}` does not exist.", "NotFoundError")
        if chat:
            messages = req.get("messages") or []
            if not messages or messages[-1].get("role") != "user":
                return 400, _error("expected a final user message", "invalid_request_error")
            prompt, backend = messages[-1]["content"], self.chat_backend
        else:
            prompt, backend = req.get("prompt", ""), self.raw_backend
        params = SamplingParams(int(req["max_tokens"]), float(req.get("temperature", 1.0)),
                                float(req.get("top_p", 1.0)), req.get("seed"))
        want_lp = bool(req.get("logprobs"))
        with self._model_lock:
            backend.want_logprobs = want_lp
            gen = backend.generate([prompt], params)[0]
        tok = backend.tokenizer
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        spell = (lambda i: f"token_id:{i}") if as_ids else (lambda i: tok.decode([i]))
        choice: dict[str, Any] = {"index": 0, "finish_reason": gen.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": gen.text}
            if want_lp:
                choice["logprobs"] = {"content": [{"token": spell(i), "logprob": lp, "top_logprobs": []}
                                                  for i, lp in zip(gen.token_ids, gen.logprobs)]}
        else:
            choice["text"] = gen.text
            if want_lp:
                choice["logprobs"] = {"tokens": [spell(i) for i in gen.token_ids], "token_logprobs": gen.logprobs}
        reply: dict[str, Any] = {
            "id": "cmpl-fake", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": req["model"], "choices": [choice],
            "usage": {"prompt_tokens": len(gen.prompt_token_ids), "completion_tokens": len(gen.token_ids),
                      "total_tokens": len(gen.prompt_token_ids) + len(gen.token_ids)},
        }
        if req.get("return_token_ids"):  # vLLM >= 0.10.2
            choice["token_ids"] = gen.token_ids
            (reply if chat else choice)["prompt_token_ids"] = gen.prompt_token_ids
        return 200, reply


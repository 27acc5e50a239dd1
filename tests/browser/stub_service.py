"""A STUB of the `memagent serve` API for the browser tests: not the service, no model.

It serves `src/memagent/serve/static/` at / and implements the endpoints the page uses, as the contract
(issue 15) describes them: `POST /v1/documents` (raw body), `POST /v1/jobs`, `GET /v1/jobs` (newest first),
`GET /v1/jobs/{id}`, `GET /v1/jobs/{id}/events` (SSE: `step`, `answer`, `state`, past events replayed; with
`?chunk_text=0` the step events leave out `chunk_text`), `GET /v1/jobs/{id}/chunks/{k}`, `DELETE /v1/jobs/{id}`.
Each non-blank line of the document is one chunk; the memory after chunk i is `memories[i]` (canned, given by
the test); the answer is canned too; evidence comes from `memagent.timeline.evidence_steps`.
"""
from __future__ import annotations

import json
import secrets
import urllib.parse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from memagent.timeline import evidence_steps

STATIC = Path(__file__).resolve().parents[2] / "src" / "memagent" / "serve" / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


class StubService:
    """Start with `.start()`, stop with `.stop()`; `url` is the base address; `requests` logs (method, path)."""

    def __init__(self, memories: list[str], answer: str, truncated_steps: tuple[int, ...] = (), delay: float = 0.05,
                 max_document_bytes: int = 1 << 20, drop_after: int | None = None):
        self.memories, self.answer, self.truncated_steps, self.delay = memories, answer, truncated_steps, delay
        self.max_document_bytes = max_document_bytes
        self.drop_after = drop_after  # end the event stream after this many events, as a killed server would
        self.documents: dict[str, str] = {}
        self.jobs: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "StubService":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def make_job(self, body: dict) -> dict:
        text = self.documents[body["document_id"]] if "document_id" in body else body["document"]
        chunks = [line for line in text.splitlines() if line.strip()]
        events, records, start = [], [], 0
        for step, chunk in enumerate(chunks):
            rec = dict(doc_id="0", step=step, chunk_start=start, chunk_tokens=len(chunk.split()),
                       prompt_tokens=100, memory_tokens=10, memory=self.memories[step % len(self.memories)],
                       truncated=step in self.truncated_steps, seconds=0.01, batch_size=1, chunk_text=chunk)
            start += len(chunk.split())
            records.append(rec)
            events.append(("step", dict(rec, question_index=0, chunks_total=len(chunks))))
        final = dict(doc_id="0", step=len(chunks), kind="final", answer=self.answer,
                     raw_answer=f"\\boxed{{{self.answer}}}", seconds=0.01, batch_size=1)
        events.append(("answer", dict(final, question_index=0, evidence=evidence_steps(records))))
        events.append(("state", dict(state="done", error=None)))
        job = dict(id="job_" + secrets.token_hex(6), state="running", questions=body["questions"], events=events,
                   workflow=body.get("workflow", "memagent"), created=time.time(),
                   chunks={r["step"]: r for r in records})
        self.jobs[job["id"]] = job
        return job


def _handler(stub: StubService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, code: int, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, message: str) -> None:
            self._json(code, {"error": {"message": message, "type": "invalid_request_error"}})

        def do_GET(self) -> None:
            stub.requests.append(("GET", self.path))
            url = urllib.parse.urlsplit(self.path)
            path, query = url.path, urllib.parse.parse_qs(url.query)
            if path == "/v1/jobs":
                jobs = sorted(stub.jobs.values(), key=lambda j: -j["created"])[: int(query.get("limit", ["20"])[0])]
                return self._json(200, dict(object="list", data=[
                    dict(id=j["id"], state=j["state"], workflow=j["workflow"], created=j["created"], chat=False,
                         error=None, questions=len(j["questions"]), question=j["questions"][0][:200]) for j in jobs]))
            if path.startswith("/v1/jobs/"):
                parts = path.split("/")
                job = stub.jobs.get(parts[3])
                if job is None:
                    return self._error(404, f"no job {parts[3]}")
                if len(parts) == 5 and parts[4] == "events":
                    return self._events(job, query.get("chunk_text", ["1"])[0] != "0")
                if len(parts) == 6 and parts[4] == "chunks":
                    rec = job["chunks"].get(int(parts[5]))
                    if rec is None:
                        return self._error(404, f"job {job['id']} has no chunk {parts[5]}")
                    return self._json(200, dict(job_id=job["id"], chunk=rec["step"], text=rec["chunk_text"]))
                return self._json(200, dict(id=job["id"], state=job["state"], error=None, workflow=job["workflow"],
                                            questions=[dict(index=i, question=q) for i, q in enumerate(job["questions"])]))
            name = "index.html" if path == "/" else path.lstrip("/")
            file = STATIC / name
            if "/" in name or not file.is_file():
                return self._error(404, f"no file {path}")
            body = file.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", _TYPES.get(file.suffix, "application/octet-stream"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _events(self, job: dict, with_text: bool = True) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for k, (name, data) in enumerate(job["events"]):
                if k == stub.drop_after:
                    break
                if job["state"] == "cancelled":
                    name, data = "state", dict(state="cancelled", error=None)
                if not with_text:
                    data = {k: v for k, v in data.items() if k != "chunk_text"}
                self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                if name == "state":
                    job["state"] = data["state"]
                    break
                time.sleep(stub.delay)
            self.close_connection = True

        def do_POST(self) -> None:
            stub.requests.append(("POST", self.path))
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path == "/v1/documents":
                if len(body) > stub.max_document_bytes:
                    return self._error(413, f"the document is over {stub.max_document_bytes} bytes")
                doc_id = "doc_" + secrets.token_hex(6)
                stub.documents[doc_id] = body.decode("utf-8")
                return self._json(200, dict(id=doc_id, bytes=len(body)))
            if self.path == "/v1/jobs":
                try:
                    data = json.loads(body)
                except json.JSONDecodeError:
                    return self._error(400, "body is not JSON")
                if not data.get("questions"):
                    return self._error(400, "questions: at least one question is needed")
                return self._json(200, dict(id=stub.make_job(data)["id"]))
            return self._error(404, f"no route {self.path}")

        def do_DELETE(self) -> None:
            stub.requests.append(("DELETE", self.path))
            job = stub.jobs.get(self.path.rsplit("/", 1)[-1])
            if job is None:
                return self._error(404, f"no job {self.path}")
            job["state"] = "cancelled"
            self._json(200, dict(id=job["id"], state="cancelled"))

    return Handler

"""What the service must not leak or leave behind: a non-streamed chat client that goes away cancels its job,
pieces of uploads a killed server left are removed at start, a garbage multipart body or an empty upload is a
400 (no 0-byte document), a huge declared Content-Length is a 413 before any byte is read, and behind
`--backend openai` no piece of the upstream key reaches a client in a job's error or a chat error."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_helpers import ThreadServer, words  # noqa: E402

from loopback_http import LoopbackServer, Reply  # noqa: E402

KEY = "sk-UPSTREAM-7c1eK9-PRIVATE-b2f0"


def _raw(port: int, head: str, body: bytes = b"", wait: float = 5.0) -> bytes:
    """Send a raw HTTP request; the status line of the reply (b"" when none came within `wait` s)."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.settimeout(wait)
        c.sendall(head.encode() + body)
        try:
            return c.recv(4096).split(b"\r\n")[0]
        except socket.timeout:
            return b""


def _wait_state(manager, job_id: str, states: tuple[str, ...], timeout: float = 30.0) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        view = manager.view(job_id)
        if view["state"] in states:
            return view
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} is {manager.view(job_id)['state']} after {timeout} s")


def test_a_non_streamed_chat_client_that_goes_away_cancels_its_job(tiny_backend, tmp_path):
    body = json.dumps({"messages": [{"role": "system", "content": words(3000)},
                                    {"role": "user", "content": "Who?"}]}).encode()
    with ThreadServer(tiny_backend, tmp_path / "state", max_jobs=1) as s:
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        t0 = time.time()
        while not s.manager.live and time.time() - t0 < 10:
            time.sleep(0.02)
        (job_id,) = list(s.manager.live)
        _wait_state(s.manager, job_id, ("running",))
        c.close()  # the client goes away while its job reads the document
        view = _wait_state(s.manager, job_id, ("cancelled", "done", "failed"))
    q = view["questions"][0]
    assert view["state"] == "cancelled" and q["chunks_done"] < q["chunks_total"], (view["state"], q["chunks_done"])


def test_pieces_of_uploads_a_killed_server_left_are_removed_at_start(tiny_backend, tmp_path):
    docs = tmp_path / "state" / "documents"
    docs.mkdir(parents=True)
    left = docs / f".doc_{'1' * 32}.part"
    left.write_bytes(b"half an upload")
    kept = [docs / f"doc_{'2' * 32}.txt", docs / "notes.part"]  # a document, and a file that is not ours
    for p in kept:
        p.write_text("keep me")
    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        assert not left.exists()
        assert all(p.read_text() == "keep me" for p in kept)
        assert httpx.get(f"{s.url}/v1/documents/doc_{'2' * 32}").json()["bytes"] == 7


@pytest.mark.parametrize("body", [
    b"--xyz\r\ngarbage",  # a boundary line, then no part headers
    b'--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\n',  # a part that never ends
    b'--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nsome text',  # cut before the closing line
])
def test_a_garbage_or_cut_multipart_body_is_a_400_and_saves_nothing(body, tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        r = httpx.post(s.url + "/v1/documents", content=body,
                       headers={"content-type": "multipart/form-data; boundary=xyz"})
        assert r.status_code == 400 and "multipart" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert not list(s.manager.docs.folder.iterdir())  # no document, no .part


def test_an_empty_upload_is_a_400(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        r = httpx.post(s.url + "/v1/documents", content=b"")
        assert r.status_code == 400 and "empty" in r.json()["error"]["message"], r.text
        ok = httpx.post(s.url + "/v1/documents", files={"file": ("d.txt", b"a real document")})
        assert ok.status_code == 201 and ok.json()["bytes"] == 15  # a whole form still works
        assert len(list(s.manager.docs.folder.iterdir())) == 1


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/chat/completions"])  # uploads: refused already
def test_a_huge_declared_length_is_a_413_before_the_body_is_read(path, tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state", max_body_bytes=64_000, max_document_bytes=100_000) as s:
        t0 = time.time()
        status = _raw(s.port, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {10 ** 12}\r\n\r\n", b"{")
        assert status.startswith(b"HTTP/1.1 413"), status
        assert time.time() - t0 < 5.0
        assert httpx.get(s.url + "/health").status_code == 200


class EchoingUpstream(LoopbackServer):
    """An upstream that refuses every request and echoes the Authorization header it got, padded so that a
    cut at 300 characters falls inside the key."""

    def handle(self, method, path, headers, body):
        said = "z" * 262 + " you sent " + (headers.get("Authorization") or "")
        return Reply(401, json.dumps({"error": {"message": said}}).encode())


def _pieces(text: str) -> list[str]:
    low = text.lower()
    return [p for p in ("upstream-", "7c1e", "private", "b2f0", "sk-u") if p in low]


def test_no_piece_of_the_upstream_key_reaches_a_client(tmp_path, tiny_model_dir, monkeypatch):
    from memagent.backends.openai import OpenAIBackend

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with EchoingUpstream().start() as up:
        backend = OpenAIBackend("tiny", up.url, tiny_model_dir, max_retries=0, check_server=False)
        try:
            with ThreadServer(backend, tmp_path / "state", serialize=False) as s:
                job = httpx.post(s.url + "/v1/jobs", json={"document": words(20), "questions": ["q?"]}).json()["id"]
                view = _wait_state(s.manager, job, ("failed", "done", "cancelled"))
                assert view["state"] == "failed" and "HTTP 401" in view["error"], view["error"]
                assert not _pieces(view["error"]), view["error"]
                assert not _pieces(httpx.get(f"{s.url}/v1/jobs/{job}").text)
                assert not _pieces(httpx.get(f"{s.url}/v1/jobs/{job}/events").text)
                chat = httpx.post(s.url + "/v1/chat/completions", timeout=30, json={
                    "messages": [{"role": "system", "content": words(20)}, {"role": "user", "content": "q?"}]})
                assert chat.status_code == 400 and "HTTP 401" in chat.text, chat.text
                assert not _pieces(chat.text), chat.text
                stream = httpx.post(s.url + "/v1/chat/completions", timeout=30, json={
                    "messages": [{"role": "system", "content": words(20)}, {"role": "user", "content": "q?"}],
                    "stream": True})
                assert "HTTP 401" in stream.text and not _pieces(stream.text), stream.text
        finally:
            backend.close()

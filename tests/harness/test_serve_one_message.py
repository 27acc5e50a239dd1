"""`memagent serve` with one-message prompts (document and question in one user message, as harnesses send
them): split by the server's rule or the request's `prompt_split`; a prompt no rule splits is a clear 400;
a keep-alive connection survives error replies."""
from __future__ import annotations

import sys
from pathlib import Path

import socket

import httpx
import pytest

pytest.importorskip("fastapi")

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))  # tests/serve/serve_helpers.py (a top-level `serve` can be bench/serve.py)
from serve_helpers import SMALL, ThreadServer, words  # noqa: E402

from memagent.agent.workflow import AgentInput, MemoryAgent  # noqa: E402
from memagent.config import AgentConfig  # noqa: E402


@pytest.fixture
def server(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        yield s


def _answer(backend, doc: str, question: str) -> str:
    r = MemoryAgent(backend, AgentConfig(**SMALL), errors="replace").run([AgentInput(question, doc, "0")])[0]
    return r.answer if r.answer is not None else r.raw_answer.strip()


def _chat(url: str, prompt: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=60,
                      json={"model": "tiny", "messages": [{"role": "user", "content": prompt}], **extra})


def test_one_message_is_split_at_its_last_blank_line(server, tiny_backend):
    doc = words(300)
    r = _chat(server.url, f"{doc}\n\nQuestion: Which river?")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == _answer(tiny_backend, doc, "Question: Which river?")
    assert r.json()["usage"]["calls"] > 2  # the document was read chunk by chunk


def test_the_request_rule_wins_and_a_prompt_that_cannot_be_split_is_a_clear_400(server, tiny_backend):
    doc = words(200)
    prompt = f"{doc}\nWhat is the magic number?"  # no blank line: the paragraph rule cannot split it
    r = _chat(server.url, prompt)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "no blank line" in message and "prompt_split" in message and "last user message" in message
    r = _chat(server.url, prompt, prompt_split="line")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == _answer(tiny_backend, doc, "What is the magic number?")
    bad = _chat(server.url, prompt, prompt_split="lines")
    assert bad.status_code == 400 and "choose one of: auto, messages" in bad.json()["error"]["message"]


def test_a_found_question_over_the_budget_names_the_rule(server):
    r = _chat(server.url, "doc\n\n" + words(200))  # the last paragraph is 200 words: over 64 tokens
    assert r.status_code == 400
    assert "over the question budget" in r.text and "prompt_split 'auto'" in r.text


def test_two_messages_keep_the_old_rule(server, tiny_backend):
    doc = words(100)
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={"messages": [
        {"role": "system", "content": doc}, {"role": "user", "content": "a\n\nb?"}]})
    assert r.json()["choices"][0]["message"]["content"] == _answer(tiny_backend, doc, "a\n\nb?")


def _raw(sock: socket.socket, body: bytes, path: str = "/v1/chat/completions") -> bytes:
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    n = int([h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0])
    while len(rest) < n:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0] + b" " + rest


def test_a_keep_alive_connection_survives_error_replies(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state", max_body_bytes=2000) as s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            assert b" 400 " in _raw(sock, b'{"messages": [{"role": "user", "content": "no break"}]}')
            assert b" 413 " in _raw(sock, b'{"x": "' + b"y" * 5000 + b'"}')  # refused before the body is read
            assert b" 400 " in _raw(sock, b"{not json")
            assert b" 405 " in _raw(sock, b"{}", "/v1/nothing")
            ok = _raw(sock, b'{"messages": [{"role": "user", "content": "doc words\\n\\nq?"}]}')
            assert b" 200 " in ok and b"chat.completion" in ok

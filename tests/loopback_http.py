"""The HTTP plumbing of the loopback fake servers: tests/fake_openai_server.py and bench/sim_server.py.

A `LoopbackServer` subclass implements `handle(method, path, headers, body) -> Reply | None`; this module
runs it on 127.0.0.1 (port 0: a free one) in a thread of its own: a threading HTTP/1.1 (keep-alive) server,
one thread per connection, a quiet log, the request body read whole, the reply's status line, headers and
body sent in one write (no delayed-ACK stall between headers and body on a kept-alive connection). A Reply
may also be sent one byte per `arg` seconds (`trickle`) or cut after the headers and `arg` bytes of body
(`close`); `handle` returning None drops the connection without a reply (a server killed mid-request).

bench/sim_server.py imports this file by path (it appends tests/ to sys.path); src/ never does.
"""
from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the handler sends: a status, a body, extra headers, and how ("normal", "trickle", "close")."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    mode: str = "normal"
    arg: float = 0.0  # trickle: seconds between bytes; close: body bytes sent before the connection drops
    content_type: str = "application/json"


def json_reply(status: int, payload: Any) -> Reply:
    """A normal reply of `payload` as JSON."""
    return Reply(status, json.dumps(payload).encode())


def error_payload(message: str, kind: str = "server_error") -> dict[str, Any]:
    """The OpenAI shape of an error body."""
    return {"error": {"message": message, "type": kind}}


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of clients connect at once
    allow_reuse_address = True


class LoopbackServer:
    """Base of a fake server on 127.0.0.1; `stopping` is set by stop() (sleeping handlers wake on it)."""

    def __init__(self, port: int = 0) -> None:
        self.stopping = threading.Event()
        self._httpd = _ThreadingServer(("127.0.0.1", port), _Handler)
        self._httpd.app = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs=dict(poll_interval=0.05),
                                        daemon=True)

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> Reply | None:
        """The reply to one request (called from handler threads); None drops the connection."""
        raise NotImplementedError

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Any:
        self._thread.start()
        return self

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when the server is stopping (handlers give up then)."""
        return self.stopping.wait(seconds)

    def close_listener(self) -> None:
        """Refuse new connections now (serve_forever ends in the background); open ones are left to their handlers."""
        threading.Thread(target=self._httpd.shutdown, daemon=True).start()
        self._httpd.socket.close()

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        app = self.server.app  # type: ignore[attr-defined]
        reply = app.handle(method, self.path, self.headers, body)
        if reply is None:
            self._drop()
            return
        head = [f"HTTP/1.1 {reply.status} {self.responses.get(reply.status, ('',))[0]}",
                f"Content-Type: {reply.content_type}", f"Content-Length: {len(reply.body)}",
                *(f"{k}: {v}" for k, v in reply.headers.items())]
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + reply.body
        try:
            if reply.mode == "trickle":  # one byte at a time, every one well within a read timeout
                for i in range(len(data)):
                    if app.wait(reply.arg):
                        break
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                self.close_connection = True
            elif reply.mode == "close":  # the headers and part of the body, then the connection drops
                self.wfile.write(data[:len(data) - len(reply.body) + int(reply.arg)])
                self.wfile.flush()
                self.close_connection = True
            else:
                self.wfile.write(data)  # unbuffered (wbufsize 0): one send of the whole reply
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

"""A simulated OpenAI-compatible server on 127.0.0.1 for throughput benchmarks and tests.

It runs no model: every generation request is answered after a sleep, with a reply text that is a
pure function of the prompt (so two runs over the same inputs can be compared). Endpoints:
GET /v1/models, POST /v1/chat/completions and /v1/completions, GET /stats.

Latency distribution (seeded, per request): `latency` seconds, or `latency * straggler_x` with
probability `straggler_p`. Whether a request straggles is drawn from a hash of (seed, prompt), not
from the arrival order, so the same requests straggle in every run whatever the client's timing.

At most `max_concurrent` requests are served at once; the rest queue (they count as in flight,
not as serving). `GET /stats` gives {"in_flight", "max_in_flight", "serving", "max_serving",
"served", "failed", "received"}: in_flight counts every request received and not yet answered,
so a client's concurrency bound is checked by `max_in_flight`.

Faults: every request whose prompt contains `fail_marker` is answered HTTP 500; `kill()` (or
`--die-after N` requests) stops the server mid-run: the listening socket closes and requests in
flight lose their connection without a reply.

In-process: `with SimServer(latency=0.05).start() as s: s.url ...` (port 0 picks a free port). The HTTP
plumbing (threading server, handler, dropped connections) is tests/loopback_http.py's, shared with the
tests' fake OpenAI server.
As a program: `python bench/sim_server.py --port 8000 --latency 0.1 --straggler-p 0.1 --straggler-x 10`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # the shared loopback plumbing
from loopback_http import LoopbackServer, Reply, error_payload, json_reply  # noqa: E402


def reply_text(prompt: str) -> str:
    """The reply to `prompt`: a short note and a boxed answer, both from the prompt's hash."""
    h = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
    return f"note {h[:8]} {h[8:16]} \\boxed{{{h[16:22]}}}"


def straggles(prompt: str, seed: int, p: float) -> bool:
    """True for a fraction `p` of prompts, fixed by (seed, prompt)."""
    if p <= 0:
        return False
    h = hashlib.sha256(f"{seed}\x00{prompt}".encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < p


class SimServer(LoopbackServer):
    """The simulated server. latency: seconds a reply takes (a straggler: latency * straggler_x);
    max_concurrent: requests served at once (None: no cap); die_after: stop after that many requests."""

    def __init__(self, *, port: int = 0, latency: float = 0.1, straggler_p: float = 0.0,
                 straggler_x: float = 10.0, max_concurrent: int | None = None, seed: int = 0,
                 fail_marker: str | None = None, die_after: int | None = None,
                 model: str = "sim", max_model_len: int | None = 32768) -> None:
        super().__init__(port)
        self.latency, self.straggler_p, self.straggler_x = latency, straggler_p, straggler_x
        self.seed, self.fail_marker, self.die_after = seed, fail_marker, die_after
        self.model, self.max_model_len = model, max_model_len
        self._slots = threading.Semaphore(max_concurrent) if max_concurrent else None
        self._lock = threading.Lock()
        self.counts = dict(in_flight=0, max_in_flight=0, serving=0, max_serving=0, served=0, failed=0, received=0)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def reset_stats(self) -> None:
        with self._lock:
            for k in self.counts:
                if k not in ("in_flight", "serving"):
                    self.counts[k] = 0

    def kill(self) -> None:
        """Stop now: no new connections, requests in flight get no reply."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.close_listener()

    def _count(self, key: str, delta: int) -> None:
        with self._lock:
            self.counts[key] += delta
            peak = "max_" + key
            if peak in self.counts:
                self.counts[peak] = max(self.counts[peak], self.counts[key])

    # -- one request (handler threads) ---------------------------------------------------------
    def handle(self, method: str, path: str, headers: Any, body: bytes) -> Reply | None:
        out = self.answer(method, path, body)
        return None if out is None else json_reply(*out)

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, Any] | None:
        """(status, JSON payload), or None when the server was killed meanwhile (drop the connection)."""
        if method == "GET" and path == "/stats":
            return 200, self.stats()
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model",
                                                     "max_model_len": self.max_model_len}]}
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return 404, error_payload(f"no route {method} {path}")
        try:
            req = json.loads(body)
            prompt = req["messages"][-1]["content"] if path.endswith("chat/completions") else req["prompt"]
        except (ValueError, KeyError, IndexError, TypeError):
            return 400, error_payload("expected a JSON body with messages (chat) or prompt (completions)")
        with self._lock:
            self.counts["received"] += 1
            n = self.counts["received"]
        if self.die_after is not None and n > self.die_after:
            self.kill()
        self._count("in_flight", 1)
        try:
            return self._generate(req, str(prompt), chat=path.endswith("chat/completions"))
        finally:
            self._count("in_flight", -1)

    def _generate(self, req: dict[str, Any], prompt: str, chat: bool) -> tuple[int, Any] | None:
        if self._slots is not None:
            self._slots.acquire()
        self._count("serving", 1)
        try:
            wait = self.latency * (self.straggler_x if straggles(prompt, self.seed, self.straggler_p) else 1.0)
            if wait > 0 and self.stopping.wait(wait) or self.stopping.is_set():
                return None
            if self.fail_marker and self.fail_marker in prompt:
                self._count("failed", 1)
                return 500, error_payload("simulated failure (the prompt holds the fail marker)")
            self._count("served", 1)
            return 200, _completion(req, reply_text(prompt), chat)
        finally:
            self._count("serving", -1)
            if self._slots is not None:
                self._slots.release()


def _completion(req: dict[str, Any], text: str, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": "cmpl-sim", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": req.get("model", "sim"), "choices": [choice]}


def launch(*args: str) -> tuple[subprocess.Popen, str]:
    """This server in a process of its own on a free port, with `main`'s flags: (process, base URL), returned once
    it listens (it prints its URL then)."""
    proc = subprocess.Popen([sys.executable, __file__, "--port", "0", *args], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().split()[3]  # "sim server at URL (stats: ...)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.1, help="seconds per reply")
    ap.add_argument("--straggler-p", type=float, default=0.0, help="fraction of replies that straggle")
    ap.add_argument("--straggler-x", type=float, default=10.0, help="a straggler takes latency * this")
    ap.add_argument("--max-concurrent", type=int, default=None, help="requests served at once (the rest queue)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fail-marker", default=None, help="answer HTTP 500 to prompts containing this text")
    ap.add_argument("--die-after", type=int, default=None, help="stop after this many requests")
    ap.add_argument("--model", default="sim")
    a = ap.parse_args(argv)
    server = SimServer(port=a.port, latency=a.latency, straggler_p=a.straggler_p, straggler_x=a.straggler_x,
                       max_concurrent=a.max_concurrent, seed=a.seed, fail_marker=a.fail_marker,
                       die_after=a.die_after, model=a.model).start()
    print(f"sim server at {server.url} (stats: http://127.0.0.1:{server.port}/stats)", flush=True)
    try:
        while not server.stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    server.stop()


if __name__ == "__main__":
    main()

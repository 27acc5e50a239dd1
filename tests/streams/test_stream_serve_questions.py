"""Standing questions over `memagent serve`: kept current as events are appended (and after a restart), their
memory versions streamed as SSE, the answer that of `memagent ask` over the stream's text."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_helpers import SMALL, ThreadServer  # noqa: E402
from stream_helpers import ask_reference  # noqa: E402

from memagent.config import AgentConfig  # noqa: E402
from memagent.streams import Stream  # noqa: E402
from memagent.streams.standing import token_ids  # noqa: E402

QUESTION = "Which value does k3 hold now?"


def _events(start: int, n: int) -> list[dict]:
    return [{"text": f"fact {i}: the key k{i % 5} now holds v{i * 7 % 11}.", "time": "2026-02-01"}
            for i in range(start, start + n)]


def _wait_chunks(url: str, want: int, timeout: float = 60.0) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        view = httpx.get(url).json()
        if view["chunks"] >= want:
            return view
        time.sleep(0.05)
    raise AssertionError(f"the question did not reach {want} chunks: {view['chunks']}")


def test_standing_question_over_serve(tiny_backend, tmp_path):
    state, config = tmp_path / "state", AgentConfig(**SMALL)
    with ThreadServer(tiny_backend, state) as srv:
        url = srv.url + "/v1/streams"
        sid = httpx.post(url, json={}).json()["id"]
        q = httpx.post(f"{url}/{sid}/questions", json={"question": QUESTION})
        assert q.status_code == 201
        qurl = f"{url}/{sid}/questions/{q.json()['id']}"
        for start in (0, 4, 8):
            assert httpx.post(f"{url}/{sid}/events", json={"events": _events(start, 4)}).status_code == 201
        path = state / "streams" / f"{sid}.stream"
        with Stream.open(path) as s:
            full = len(token_ids(tiny_backend.tokenizer, s.text())) // SMALL["chunk_tokens"]
        view = _wait_chunks(qurl, full)
        with httpx.stream("GET", qurl + "/events", timeout=30) as sse:  # the kept versions first
            got = []
            for line in sse.iter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[6:]))
                if len(got) == full:
                    break
        assert [m["memory"] for m in got] == [m["memory"] for m in view["memories"]]
        a = httpx.post(qurl + "/answer", timeout=60).json()
        assert a["calls"] <= 2 and a["events"] == 12
        with Stream.open(path) as s:
            records, ref = ask_reference(tiny_backend, config, s.text(), QUESTION)
        assert [m["memory"] for m in view["memories"]] == [r["memory"] for r in records[:full]]
        kept = view["memories"]
        assert (a["answer"], a["raw_answer"], a["memory"]) == (ref.answer, ref.raw_answer, ref.memory)
        assert httpx.get(f"{url}/{sid}/questions/99").status_code == 404
        assert httpx.post(f"{url}/{sid}/questions", json={"question": ""}).status_code == 400
    with Stream.open(path) as s:  # events arrive while the server is down
        s.append_many(_events(12, 8))
        full = len(token_ids(tiny_backend.tokenizer, s.text())) // SMALL["chunk_tokens"]
    with ThreadServer(tiny_backend, state) as srv:  # it reads them as it starts; the old versions stay
        view = _wait_chunks(f"{srv.url}/v1/streams/{sid}/questions/{q.json()['id']}", full)
        assert view["memories"][:len(kept)] == kept and len(view["memories"]) == full > len(kept)
        assert view["answers"][0]["answer"] == a["answer"]


def test_the_keeper_stops_with_the_server(tiny_backend, tmp_path):
    import threading

    with ThreadServer(tiny_backend, tmp_path / "state"):
        assert any(t.name == "memagent-streams" and t.is_alive() for t in threading.enumerate())
    time.sleep(1.0)  # it looks at its stop flag every 0.5 s
    assert not any(t.name == "memagent-streams" and t.is_alive() for t in threading.enumerate())

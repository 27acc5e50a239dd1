"""`memagent serve`'s streams: create, append, list, read with paging, delete; the API key; a restart keeps them; an
ad-hoc question over a stream as a job with any workflow, whose answer is the Python API's over the same file."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_helpers import SMALL, ThreadServer, wait_done  # noqa: E402

from memagent.config import AgentConfig  # noqa: E402
from memagent.streams import Stream  # noqa: E402

KEY = {"Authorization": "Bearer sekrit"}


def test_streams_rest_restart_and_delete(tiny_backend, tmp_path):
    state = tmp_path / "state"
    with ThreadServer(tiny_backend, state, key="sekrit") as srv:
        url = srv.url + "/v1/streams"
        assert httpx.post(url, json={}).status_code == 401  # the API key as for every /v1 route
        made = httpx.post(url, json={"name": "chat", "max_event_bytes": 64}, headers=KEY)
        assert made.status_code == 201
        sid = made.json()["id"]
        events = [{"text": "I live in Paris.", "time": "2026-01-01"}, {"text": "I moved to Berlin.", "role": "user"},
                  {"text": "Noted.", "role": "assistant", "source": "chat"}]
        r = httpx.post(f"{url}/{sid}/events", json={"events": events}, headers=KEY)
        assert r.status_code == 201 and r.json() == {"ids": [1, 2, 3]}
        bad = [({"events": [{"text": "x" * 65}]}, 400, "over the stream's limit of 64 bytes"),
               ({"events": [{"text": "ok"}, {"text": "x", "time": "noon"}]}, 400, "bad time"),
               ({"events": [{"text": "x", "colour": 1}]}, 400, "colour"), ({"events": []}, 400, "non-empty")]
        for body, status, words in bad:
            r = httpx.post(f"{url}/{sid}/events", json=body, headers=KEY)
            assert r.status_code == status and words in r.json()["error"]["message"], r.text
        page = httpx.get(f"{url}/{sid}/events?limit=2", headers=KEY).json()
        assert [e["text"] for e in page["data"]] == ["I live in Paris.", "I moved to Berlin."]
        assert page["next_after"] == 2 and page["data"][0]["time"] == "2026-01-01T00:00:00Z"
        rest = httpx.get(f"{url}/{sid}/events?after=2&limit=2", headers=KEY).json()
        assert [e["source"] for e in rest["data"]] == ["chat"] and rest["next_after"] is None
        assert httpx.get(f"{url}/{sid}/events?limit=0", headers=KEY).status_code == 400
        assert httpx.get(f"{url}/str_nope", headers=KEY).status_code == 400
        assert httpx.get(f"{url}/str_{'0' * 32}", headers=KEY).status_code == 404
    with ThreadServer(tiny_backend, state, key="sekrit") as srv:  # a restart: the stream and its events stay
        url = srv.url + "/v1/streams"
        listed = httpx.get(url, headers=KEY).json()["data"]
        assert [(s["id"], s["name"], s["events"]) for s in listed] == [(sid, "chat", 3)]
        assert httpx.delete(f"{url}/{sid}", headers=KEY).json() == {"id": sid, "deleted": True}
        assert httpx.get(f"{url}/{sid}", headers=KEY).status_code == 404
        assert httpx.get(url, headers=KEY).json()["data"] == []


def test_ad_hoc_question_over_a_stream_is_a_job_with_any_workflow(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state") as srv:
        url = srv.url + "/v1/streams"
        sid = httpx.post(url, json={}).json()["id"]
        events = [{"text": f"fact {i}: the key k{i} holds the value v{i * 7 % 11}.", "time": "2026-02-01"}
                  for i in range(12)]
        httpx.post(f"{url}/{sid}/events", json={"events": events})
        answers = {}
        for workflow in ("memagent", "skim"):
            r = httpx.post(f"{url}/{sid}/jobs", json={"questions": ["What does k3 hold?"], "workflow": workflow})
            assert r.status_code == 201 and r.json()["events"] == 12
            view = wait_done(srv.url, r.json()["id"])
            assert view["state"] == "done" and view["workflow"] == workflow
            answers[workflow] = view["questions"][0]["raw_answer"]
        path = tmp_path / "state" / "streams" / f"{sid}.stream"
        with Stream.open(path) as s:  # the server's stream is a stream file
            for workflow, raw in answers.items():
                assert s.ask("What does k3 hold?", tiny_backend, AgentConfig(**SMALL), workflow=workflow).raw_answer \
                    == raw
        r = httpx.post(f"{url}/{sid}/jobs", json={"questions": ["q?"], "workflow": "nope"})
        assert r.status_code == 400 and "memagent" in r.json()["error"]["message"]

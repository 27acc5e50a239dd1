"""`memagent serve` over the tiny model: the openai client, jobs and their events, concurrency, limits,
auth and bad input (each a 4xx JSON error, the server still serving)."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import SMALL, ThreadServer, words  # noqa: E402

from memagent.agent.workflow import AgentInput, MemoryAgent  # noqa: E402
from memagent.config import AgentConfig  # noqa: E402


def reference(backend, doc: str, question: str) -> tuple[str, list[dict]]:
    """The answer text and the trace records of an uninterrupted in-process greedy run."""
    records: list[dict] = []
    r = MemoryAgent(backend, AgentConfig(**SMALL), errors="replace", on_step=records.append).run(
        [AgentInput(question, doc, "0")])[0]
    return (r.answer if r.answer is not None else r.raw_answer.strip()), records


@pytest.fixture
def server(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state", max_body_bytes=64_000, max_document_bytes=100_000) as s:
        yield s


def _chat(doc: str, question: str) -> list[dict]:
    return [{"role": "system", "content": doc}, {"role": "user", "content": question}]


def test_openai_client_chat_and_stream_over_20_chunks(server, tiny_backend):
    doc = words(200)
    answer, records = reference(tiny_backend, doc, "Which river?")
    n_chunks = len(records) - 1
    assert n_chunks >= 20
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    r = client.chat.completions.create(model="tiny", messages=_chat(doc, "Which river?"))
    assert r.choices[0].message.content == answer
    assert r.usage.model_extra["calls"] == n_chunks + 1  # every chunk, then the answer
    assert r.usage.prompt_tokens == sum(rec["prompt_tokens"] for rec in records)
    assert r.model_extra["memagent"]["chunks"] == n_chunks
    stream = client.chat.completions.create(model="tiny", messages=_chat(doc, "Which river?"), stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage.model_extra["calls"] == n_chunks + 1
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_sends_progress_as_comments(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={"messages": _chat(words(60), "Who?"), "stream": True}) as resp:
        lines = [line for line in resp.iter_lines() if line]
    progress = [line for line in lines if line.startswith(": progress")]
    total = int(progress[0].split("/")[1])
    assert progress == [f": progress {i}/{total}" for i in range(1, total + 1)]
    assert lines[-1] == "data: [DONE]"


@pytest.mark.slow  # 16 concurrent clients against the real app: ~3-6 s on 2 shared cores
def test_16_clients_at_once_each_get_their_own_answer(server, tiny_backend):
    docs = [words(16 + i, seed=i) for i in range(16)]
    questions = [f"question {i}?" for i in range(16)]
    expected = [reference(tiny_backend, d, q)[0] for d, q in zip(docs, questions)]
    got: list = [None] * 16

    def ask(i: int) -> None:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        got[i] = client.chat.completions.create(model="tiny", messages=_chat(docs[i], questions[i]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [g.choices[0].message.content for g in got] == expected
    assert len(set(expected)) > 1  # the documents give different answers: a mix-up would show
    assert len({g.model_extra["memagent"]["job_id"] for g in got}) == 16


def test_upload_job_view_and_events(server):
    doc = words(80)
    up = httpx.post(server.url + "/v1/documents", files={"file": ("d.txt", doc.encode())}).json()
    assert up["bytes"] == len(doc.encode()) and up["id"].startswith("doc_")
    raw = httpx.post(server.url + "/v1/documents", content=doc.encode()).json()
    assert httpx.get(f"{server.url}/v1/documents/{raw['id']}").json() == {"id": raw["id"], "bytes": up["bytes"]}
    job = httpx.post(server.url + "/v1/jobs", json={"document_id": up["id"], "questions": ["a?", "b?"]}).json()
    events = httpx.get(f"{server.url}/v1/jobs/{job['id']}/events", timeout=60).text  # ends with the job
    view = httpx.get(f"{server.url}/v1/jobs/{job['id']}").json()
    assert view["state"] == "done" and view["document_id"] == up["id"]
    for q in view["questions"]:
        assert q["chunks_done"] == q["chunks_total"] == len(q["steps"]) >= 5
        assert "".join(s["chunk_text"] for s in q["steps"]) == doc
        assert q["memory"] == q["steps"][-1]["memory"] and q["raw_answer"] is not None
    blocks = [b for b in events.split("\n\n") if b.strip()]
    names = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    n = view["questions"][0]["chunks_total"]
    assert names.count("step") == 2 * n and names.count("answer") == 2 and names[-1] == "state"
    assert json.loads(blocks[-1].split("data: ", 1)[1]) == {"state": "done", "error": None}
    steps = [json.loads(b.split("data: ", 1)[1]) for b, name in zip(blocks, names) if name == "step"]
    assert {s["chunks_total"] for s in steps} == {n}
    replay = httpx.get(f"{server.url}/v1/jobs/{job['id']}/events").text  # a late subscriber sees it all
    assert replay == events


def _is_error(resp: httpx.Response, status: int, words_in_message: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert words_in_message in err["message"] and err["type"]


def test_bad_input_is_a_4xx_json_error_and_the_server_goes_on(server):
    u = server.url
    _is_error(httpx.post(u + "/v1/chat/completions", content=b"{not json",
                         headers={"content-type": "application/json"}), 400, "not valid JSON")
    _is_error(httpx.post(u + "/v1/chat/completions", json={"messages": [{"role": "system", "content": "x"}]}),
              400, "missing question")
    _is_error(httpx.post(u + "/v1/jobs", json={"document": "x"}), 400, "missing question")
    _is_error(httpx.post(u + "/v1/jobs", json={"document": "x", "questions": [""]}), 400, "questions[0]")
    _is_error(httpx.post(u + "/v1/jobs", json={"document": "x" * 70_000, "questions": ["q?"]}), 413, "limit")
    _is_error(httpx.get(u + "/v1/jobs/job_0123"), 404, "no job")
    _is_error(httpx.delete(u + "/v1/jobs/nope"), 404, "no job")
    _is_error(httpx.get(u + "/v1/jobs/nope/events"), 404, "no job")
    for bad in ("../../etc/passwd", "/etc/passwd", "doc_" + "0" * 31 + "/", "doc_.." ):
        _is_error(httpx.post(u + "/v1/jobs", json={"document_id": bad, "questions": ["q?"]}), 400, "not a document id")
    _is_error(httpx.get(u + "/v1/documents/..%2F..%2Fetc%2Fpasswd"), 404, "no route")  # a slash: no route
    _is_error(httpx.get(u + "/v1/documents/..%2Fserve.sqlite3"), 404, "no route")
    _is_error(httpx.get(u + "/v1/documents/serve.sqlite3"), 400, "not a document id")
    _is_error(httpx.get(u + "/v1/documents/doc_" + "0" * 32), 404, "no document")
    _is_error(httpx.post(u + "/v1/jobs", json={"document": "x", "questions": ["word " * 200]}), 400, "tokens")
    _is_error(httpx.get(u + "/v1/nothing"), 404, "no route")
    _is_error(httpx.post(u + "/v1/documents", content=b"x " * 60_000), 413, "limit of 100000 bytes")
    _is_error(httpx.post(u + "/v1/documents", content=iter([b"y " * 30_000] * 3)), 413, "limit")  # no length given
    assert not list((server.manager.docs.folder).glob(".*.part"))  # a refused upload leaves nothing behind
    assert httpx.get(u + "/health").json()["status"] == "ok"
    r = httpx.post(u + "/v1/chat/completions", json={"messages": _chat(words(20), "still there?")})
    assert r.status_code == 200 and r.json()["usage"]["calls"] >= 2


def test_api_key_is_required_and_checked(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state", key="s3cret") as s:
        _is_error(httpx.get(s.url + "/v1/models"), 401, "no API key")
        _is_error(httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "wrong API key")
        _is_error(httpx.get(s.url + "/metrics"), 401, "API key")
        ok = httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.json()["data"][0]["id"] == "tiny"
        assert httpx.get(s.url + "/health").status_code == 200  # open: for load balancers
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret")
        assert client.chat.completions.create(model="tiny", messages=_chat(words(20), "q?")).usage.model_extra["calls"] >= 2


def test_full_server_answers_429_and_cancel_stops_a_job(tiny_backend, tmp_path):
    with ThreadServer(tiny_backend, tmp_path / "state", max_jobs=1, max_queue=1) as s:
        long_doc = words(3000)
        first = httpx.post(s.url + "/v1/jobs", json={"document": long_doc, "questions": ["a?"]}).json()["id"]
        second = httpx.post(s.url + "/v1/jobs", json={"document": long_doc, "questions": ["b?"]}).json()["id"]
        full = httpx.post(s.url + "/v1/jobs", json={"document": "x", "questions": ["c?"]})
        _is_error(full, 429, "full")
        assert full.headers["retry-after"] == "1"
        assert httpx.delete(f"{s.url}/v1/jobs/{second}").json()["state"] == "cancelled"  # queued: at once
        httpx.delete(f"{s.url}/v1/jobs/{first}")
        events = httpx.get(f"{s.url}/v1/jobs/{first}/events", timeout=60).text
        assert events.rstrip().endswith('{"state": "cancelled", "error": null}')
        view = httpx.get(f"{s.url}/v1/jobs/{first}").json()
        assert view["state"] == "cancelled" and view["questions"][0]["chunks_done"] < view["questions"][0]["chunks_total"]
        assert httpx.post(s.url + "/v1/jobs", json={"document": "x", "questions": ["c?"]}).status_code == 201


def test_metrics_count_requests_calls_and_tokens(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": _chat(words(30), "q?")}).json()
    text = httpx.get(server.url + "/metrics").text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert int(values["memagent_model_calls_total"]) == r["usage"]["calls"]
    assert int(values["memagent_prompt_tokens_total"]) == r["usage"]["prompt_tokens"]
    assert values['memagent_requests_total{route="/v1/chat/completions",status="200"}'] == "1"
    assert values["memagent_queue_length"] == "0"
    assert int(values["memagent_model_call_seconds_count"]) >= 1


def test_a_client_that_goes_away_cancels_its_job(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={"messages": _chat(words(3000), "Who?"), "stream": True}) as resp:
        first = next(line for line in resp.iter_lines() if line.startswith("data: "))
        job = "job_" + json.loads(first[6:])["id"].removeprefix("chatcmpl-")
    for _ in range(200):
        view = httpx.get(f"{server.url}/v1/jobs/{job}").json()
        if view["state"] != "running":
            break
        threading.Event().wait(0.05)
    assert view["state"] == "cancelled"
    assert view["questions"][0]["chunks_done"] < view["questions"][0]["chunks_total"]


def test_a_large_upload_is_streamed_to_disk_not_held_in_memory(tiny_backend, tmp_path):
    import tracemalloc

    block, n_blocks = b"river city album song " * 2979, 512  # 64 KiB x 512 = 32 MiB, sent without a length
    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        tracemalloc.start()
        try:
            up = httpx.post(s.url + "/v1/documents", content=iter([block] * n_blocks), timeout=120).json()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert up["bytes"] == len(block) * n_blocks
        assert (s.manager.docs.folder / f"{up['id']}.txt").stat().st_size == up["bytes"]
    assert peak < 8 << 20  # Python allocations of client and server together stay far below the 32 MiB


def test_a_restart_resumes_jobs_but_cancels_chat_jobs_whose_client_is_gone(tiny_backend, tmp_path):
    from memagent.serve.documents import DocumentStore
    from memagent.serve.store import Store

    state = tmp_path / "state"
    docs = DocumentStore(state / "documents", 1 << 20)
    doc_id, _ = docs.save_text(words(30))
    store = Store(state / "serve.sqlite3")  # what a dead server left: two jobs marked running
    store.add_job("job_" + "a" * 32, doc_id, ["q?"])
    store.add_job("job_" + "b" * 32, doc_id, ["q?"], chat=True)
    store.set_state("job_" + "a" * 32, "running")
    store.set_state("job_" + "b" * 32, "running")
    store.close()
    with ThreadServer(tiny_backend, state) as s:
        events = httpx.get(f"{s.url}/v1/jobs/job_{'a' * 32}/events", timeout=60).text
        assert events.rstrip().endswith('{"state": "done", "error": null}')
        chat = httpx.get(f"{s.url}/v1/jobs/job_{'b' * 32}").json()
        assert chat["state"] == "cancelled" and "chat client" in chat["error"]
        assert chat["usage"]["calls"] == 0

"""The jobs the page lists and opens: GET /v1/jobs (newest first, jobs started through the API included), a job
opened by its id, GET /v1/jobs/{id}/chunks/{k} (the exact text the job read), clear 404s and 400s, the job's
workflow kept in SQLite across a restart, and a version-1 state database migrated in place."""
from __future__ import annotations

import sqlite3

import httpx
import pytest

pytest.importorskip("fastapi")

from fakes import ScriptedBackend  # noqa: E402
from serve_helpers import SMALL, ThreadServer, wait_done, words  # noqa: E402

from memagent.agent.chunking import iter_chunks  # noqa: E402
from memagent.serve.store import SCHEMA_VERSION, Store  # noqa: E402


def _backend(tok) -> ScriptedBackend:
    return ScriptedBackend(tok, lambda prompt, i: f"m{i % 7} \\boxed{{v{i % 5}}}")


def _submit(url: str, doc: str, question: str, **extra) -> str:
    r = httpx.post(url + "/v1/jobs", json={"document": doc, "questions": [question], **extra})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_api_jobs_are_listed_newest_first_and_open_by_id(tiny_tokenizer, tmp_path):
    with ThreadServer(_backend(tiny_tokenizer), tmp_path / "state") as s:
        a = _submit(s.url, words(40), "first question?")
        wait_done(s.url, a)
        b = _submit(s.url, words(40, seed=1), "second question?", workflow="skim")
        wait_done(s.url, b)
        listed = httpx.get(s.url + "/v1/jobs").json()
        assert listed["object"] == "list" and [j["id"] for j in listed["data"]] == [b, a]
        first = listed["data"][1]
        assert (first["state"], first["workflow"], first["questions"], first["question"], first["chat"]) == \
            ("done", "memagent", 1, "first question?", False)
        assert isinstance(first["created"], float) and listed["data"][0]["created"] >= first["created"]
        assert listed["data"][0]["workflow"] == "skim"
        assert [j["id"] for j in httpx.get(s.url + "/v1/jobs?limit=1").json()["data"]] == [b]
        view = httpx.get(f"{s.url}/v1/jobs/{a}").json()
        assert view["workflow"] == "memagent" and view["questions"][0]["question"] == "first question?"
        for bad in ("0", "-1", "x", "501", "1e3"):
            r = httpx.get(s.url + "/v1/jobs", params={"limit": bad})
            assert r.status_code == 400 and "limit must be a whole number in 1..500" in r.json()["error"]["message"]


def test_a_chat_completion_names_its_own_workflow(tiny_tokenizer, tmp_path):
    """`workflow` in a chat body runs that workflow (skim: k + 1 calls, not one per chunk), is listed with the
    job, and an unknown name is a 400 listing the valid ones, before any document is saved."""
    doc = words(200)
    n_chunks = len(list(iter_chunks(doc, tiny_tokenizer, SMALL["chunk_tokens"], errors="replace")))
    with ThreadServer(_backend(tiny_tokenizer), tmp_path / "state") as s:
        def chat(**extra):
            return httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
                "model": "m", "messages": [{"role": "user", "content": doc}, {"role": "user", "content": "Which?"}],
                **extra})
        plain, skim = chat(), chat(workflow="skim")
        assert plain.status_code == skim.status_code == 200, (plain.text, skim.text)
        assert plain.json()["usage"]["calls"] == n_chunks + 1 > 5
        assert skim.json()["usage"]["calls"] == 4 + 1  # skim's default k = 4, then the answer
        listed = httpx.get(s.url + "/v1/jobs").json()["data"]
        assert [(j["workflow"], j["chat"]) for j in listed] == [("skim", True), ("memagent", True)]
        bad = chat(workflow="overwrite-twice")
        assert bad.status_code == 400 and "memagent" in bad.json()["error"]["message"]
        assert len(httpx.get(s.url + "/v1/jobs").json()["data"]) == 2  # no job was made


def test_chunk_text_is_the_exact_chunk_the_job_read(tiny_tokenizer, tmp_path):
    doc = words(70) + " <script>window.pwned = 1</script> " + words(20, seed=3)
    chunks = list(iter_chunks(doc, tiny_tokenizer, SMALL["chunk_tokens"], errors="replace"))
    with ThreadServer(_backend(tiny_tokenizer), tmp_path / "state") as s:
        job = _submit(s.url, doc, "Which river?")
        steps = wait_done(s.url, job)["questions"][0]["steps"]
        assert len(steps) == len(chunks) >= 5
        for k in (0, 3, len(chunks) - 1):
            got = httpx.get(f"{s.url}/v1/jobs/{job}/chunks/{k}").json()
            assert got == dict(job_id=job, chunk=k, question_index=0, chunk_start=chunks[k].start_token,
                               chunk_tokens=len(chunks[k].token_ids), text=chunks[k].text)
        assert "".join(c.text for c in chunks) == doc
        r = httpx.get(f"{s.url}/v1/jobs/{job}/chunks/{len(chunks)}")
        assert r.status_code == 404
        assert r.json()["error"] == {"message": f"job {job} has no chunk {len(chunks)} (it has read chunks "
                                                f"0-{len(chunks) - 1}); a chunk number is the `step` of a memory "
                                                "record", "type": "not_found_error"}
        r = httpx.get(f"{s.url}/v1/jobs/{job}/chunks/one")
        assert r.status_code == 400 and "is not a whole number" in r.json()["error"]["message"]
        # the event stream without the chunks' text (the page asks for a chunk's text on demand)
        with httpx.stream("GET", f"{s.url}/v1/jobs/{job}/events?chunk_text=0") as resp:
            body = "".join(resp.iter_text())
        assert body.count("event: step") == len(chunks) and "chunk_text" not in body and "chunk_start" in body
        with httpx.stream("GET", f"{s.url}/v1/jobs/{job}/events") as resp:
            assert "chunk_text" in "".join(resp.iter_text())  # the default is as before
        assert httpx.get(f"{s.url}/v1/jobs/{job}/events?chunk_text=maybe").status_code == 400


def test_unknown_job_is_a_404_naming_it(tiny_tokenizer, tmp_path):
    with ThreadServer(_backend(tiny_tokenizer), tmp_path / "state") as s:
        for path in ("/v1/jobs/job_nope", "/v1/jobs/job_nope/chunks/0", "/v1/jobs/job_nope/events"):
            r = httpx.get(s.url + path)
            assert r.status_code == 404, path
            assert r.json()["error"] == {"message": "no job 'job_nope'; POST /v1/jobs returns job ids",
                                         "type": "not_found_error"}
        assert httpx.get(s.url + "/v1/jobs").json() == {"object": "list", "data": []}


def test_the_workflow_survives_a_restart(tiny_tokenizer, tmp_path):
    state = tmp_path / "state"
    with ThreadServer(_backend(tiny_tokenizer), state) as s:
        done = _submit(s.url, words(40), "Which river?", workflow="lookup")
        wait_done(s.url, done)
    # an unfinished job the stopped server left: the next server resumes it with ITS workflow, not the server's
    store = Store(state / "serve.sqlite3")
    doc_id = next((state / "documents").iterdir()).stem
    store.add_job("job_" + "0" * 32, doc_id, ["Which city?"], workflow="lookup")
    store.close()
    with ThreadServer(_backend(tiny_tokenizer), state) as s:  # the server's workflow: memagent
        assert {j["id"]: j["workflow"] for j in httpx.get(s.url + "/v1/jobs").json()["data"]} == \
            {done: "lookup", "job_" + "0" * 32: "lookup"}
        view = wait_done(s.url, "job_" + "0" * 32)
        assert view["state"] == "done" and view["workflow"] == "lookup"
        assert any(r.get("kind") == "query" for r in view["questions"][0]["steps"])  # lookup's own call


OLD_SCHEMA = """
CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, document_id TEXT NOT NULL, error TEXT,
    created REAL NOT NULL, calls INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0, chat INTEGER NOT NULL DEFAULT 0);
CREATE TABLE questions (job_id TEXT NOT NULL, idx INTEGER NOT NULL, question TEXT NOT NULL, chunks_total INTEGER,
    final TEXT, PRIMARY KEY (job_id, idx));
CREATE TABLE steps (job_id TEXT NOT NULL, idx INTEGER NOT NULL, step INTEGER NOT NULL, record TEXT NOT NULL,
    PRIMARY KEY (job_id, idx, step));
INSERT INTO jobs (id, state, document_id, created) VALUES ('job_old', 'done', 'doc_x', 1.0);
INSERT INTO questions (job_id, idx, question) VALUES ('job_old', 0, 'old?');
INSERT INTO steps VALUES ('job_old', 0, 1, '{"step": 1, "memory": "b"}');
INSERT INTO steps VALUES ('job_old', 0, 0, '{"step": 0, "memory": "a"}');
"""


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_version_1_database_opens_and_is_migrated(tmp_path, version):
    path = tmp_path / "serve.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
        db.execute(f"PRAGMA user_version = {version}")
    store = Store(path)
    assert store.job("job_old")["workflow"] is None  # not recorded then
    assert [j["id"] for j in store.recent(5)] == ["job_old"]
    assert [r["memory"] for r in store.questions("job_old")[0]["steps"]] == ["a", "b"]  # kept, in chunk order
    store.add_step("job_old", 0, {"step": 1, "memory": "c"})  # a chunk read again (version 3): a row of its own
    assert [r["memory"] for r in store.questions("job_old")[0]["steps"]] == ["a", "b", "c"]
    store.add_job("job_new", "doc_x", ["x" * 500, "second"], workflow="skim")
    assert store.job("job_new")["workflow"] == "skim"
    new = store.recent(1)[0]
    assert (new["id"], new["questions"], new["question"]) == ("job_new", 2, "x" * 200)  # the first one's preview
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    Store(path).close()  # and opens again as version 3


def test_every_call_of_a_question_is_kept_in_the_order_written(tmp_path):
    """lookup reads chunk 2 again as a hit and makes query calls: before version 3, steps keyed by chunk number
    kept only the last record of each number (the first pass of chunk 2 was replaced by the hit)."""
    store = Store(tmp_path / "serve.sqlite3")
    store.add_job("j", "d", ["q0", "q1"], workflow="lookup")
    written = [{"step": 0, "kind": "memory", "memory": "m0"}, {"step": 1, "kind": "memory", "memory": "m1"},
               {"step": 2, "kind": "memory", "memory": "m2", "chunk_text": "first pass"},
               {"step": 3, "kind": "query", "memory": "m2"}, {"step": 2, "kind": "memory", "memory": "hit"}]
    for r in written:
        store.add_step("j", 0, r)
    store.add_step("j", 1, {"step": 0, "kind": "memory", "memory": "other question"})
    q0, q1 = store.questions("j")
    assert q0["steps"] == written and [r["memory"] for r in q1["steps"]] == ["other question"]
    assert store.chunk("j", 2)["chunk_text"] == "first pass"  # the first record of chunk 2 that holds its text
    assert store.chunks_read("j") == [0, 1, 2, 3]
    store.clear_steps("j", 0)  # a workflow that starts over after a restart
    assert store.questions("j")[0]["steps"] == [] and len(store.questions("j")[1]["steps"]) == 1
    store.close()

"""Kill -9 `memagent serve` in the middle of a job, restart it on the same state folder: the job goes on
from its last finished chunk, with exactly the remaining chunks' calls, to the uninterrupted answer."""
from __future__ import annotations

import signal
import sqlite3
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from serve_helpers import free_port, start_subprocess, wait_done, wait_up, words  # noqa: E402


def _calls(url: str) -> int:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("memagent_model_calls_total "):
            return int(line.split()[1])
    raise AssertionError("no memagent_model_calls_total in /metrics")


@pytest.mark.slow
def test_killed_server_resumes_the_job_at_its_last_finished_chunk(tiny_model_dir, tmp_path):
    state, doc = tmp_path / "state", words(250)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_subprocess(tiny_model_dir, state, port)
    try:
        wait_up(url, proc=proc)
        job = httpx.post(url + "/v1/jobs", json={"document": doc, "questions": ["Which river?"]}).json()["id"]
        while httpx.get(f"{url}/v1/jobs/{job}").json()["questions"][0]["chunks_done"] < 5:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    with sqlite3.connect(state / "serve.sqlite3") as db:  # what survived the kill
        done = db.execute("SELECT COUNT(*) FROM steps WHERE job_id = ?", (job,)).fetchone()[0]
        total = db.execute("SELECT chunks_total FROM questions WHERE job_id = ?", (job,)).fetchone()[0]
    assert 5 <= done < total

    proc = start_subprocess(tiny_model_dir, state, port)
    try:
        wait_up(url, proc=proc)
        resumed = wait_done(url, job, timeout=120, poll=0.05)
        assert resumed["state"] == "done"
        assert _calls(url) == (total - done) + 1  # the remaining chunks, then the answer
        steps = resumed["questions"][0]["steps"]
        assert [s["step"] for s in steps] == list(range(total))
        # the same document and question, uninterrupted, on the same server
        again = httpx.post(url + "/v1/jobs", json={"document": doc, "questions": ["Which river?"]}).json()["id"]
        fresh = wait_done(url, again, timeout=120, poll=0.05)["questions"][0]
        assert fresh["raw_answer"] == resumed["questions"][0]["raw_answer"]
        assert [s["memory"] for s in fresh["steps"]] == [s["memory"] for s in steps]
        assert _calls(url) == (total - done) + 1 + total + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except Exception:  # noqa: BLE001
            proc.kill()

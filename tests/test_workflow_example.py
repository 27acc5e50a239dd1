"""docs/examples/echo_workflow.py, the third-party workflow of docs/workflows.md, as it stands: registered through
a `memagent.workflows` entry point of an installed distribution (a .dist-info on sys.path), then driven through
`ask` (and `memagent report` of its trace), `eval`, `serve` and one training step on the tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugin_dist import write_dist_info

from memagent.agent import registry

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


@pytest.fixture
def echo_installed(tmp_path, monkeypatch):
    """The example as an installed package would be: its module on sys.path and its entry point declared."""
    write_dist_info(tmp_path / "site", "echo-workflow", {"memagent.workflows": {"echo": "echo_workflow:echo"}})
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry.refresh_entry_points()
    assert "echo" in registry.workflow_names()
    yield
    monkeypatch.undo()
    registry.refresh_entry_points()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ask_and_report_show_the_echo_call(echo_installed, run_cli, tiny_model_dir, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("the river runs past the old city and under the stone bridge " * 4)
    trace = tmp_path / "trace.jsonl"
    code, out, err = run_cli("ask", "--model", tiny_model_dir, "--document", doc, "--question", "Which river?",
                             "--workflow", "echo", "--trace", trace, "--no-progress")
    assert code == 0, err
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["echo", "final"]  # two calls: the note, then the answer
    from memagent.timeline.report import read_trace, report_data

    data = report_data(read_trace(trace))
    assert data["docs"][0]["rows"] == [] and [c["kind"] for c in data["docs"][0]["calls"]] == ["echo"]
    assert data["docs"][0]["calls"][0]["text"] == records[0]["text"]
    code, _, err = run_cli("report", trace, "--out", tmp_path / "r.html")
    assert code == 0, err


def test_eval_gives_a_row_per_workflow_with_calls_per_document(echo_installed, run_cli, tiny_model_dir, tmp_path):
    data = _jsonl(tmp_path / "toy.jsonl", [
        {"id": f"t{i}", "task": "toy", "question": "k1", "answers": ["v1"], "metric": "exact_match", "length": 2,
         "length_unit": "chunks", "context": "fact k1 v1 " * 20, "order": "value-first" if i else "pointer-first"}
        for i in range(2)])
    out = tmp_path / "ev"
    code, table, err = run_cli("eval", "--model", tiny_model_dir, "--data", data, "--out", out,
                               "--workflows", "memagent,echo", "--methods", "full-context", "--no-progress",
                               "--chunk-tokens", "16", "--memory-tokens", "8", "--answer-tokens", "8")
    assert code == 0, err
    text = (out / "table.md").read_text()
    assert "| model | method | 2 chunks | calls/doc | s/doc |" in text
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ") and " | " in line}
    assert set(rows) >= {"memagent", "echo", "full-context"}
    assert rows["echo"].split(" | ")[3] == "2.0" and rows["full-context"].split(" | ")[3] == "1.0"
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    fps = {r["method"]: r["fingerprint"] for r in records}
    assert len(set(fps.values())) == 2 and fps["memagent"] == fps["full-context"] != fps["echo"]
    assert {r["tags"]["order"] for r in records} == {"value-first", "pointer-first"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["fingerprints"] == {"echo": fps["echo"]}
    from memagent.eval.report import write_report

    split, _, _ = write_report(out / "results.jsonl", tmp_path, split_by="order")
    assert "echo (order=value-first)" in split and "memagent (order=pointer-first)" in split


def test_serve_runs_a_job_with_its_own_workflow(echo_installed, tiny_backend, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    import httpx

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "serve"))
    from serve_helpers import ThreadServer

    with ThreadServer(tiny_backend, tmp_path / "state") as s:
        bad = httpx.post(s.url + "/v1/jobs", json={"document": "some words", "questions": ["a?"], "workflow": "nope"})
        assert bad.status_code == 400 and "valid workflows: memagent" in bad.json()["error"]["message"]
        job = httpx.post(s.url + "/v1/jobs", json={"document": "the river and the city " * 10,
                                                   "questions": ["Which river?"], "workflow": "echo"}).json()
        events = httpx.get(f"{s.url}/v1/jobs/{job['id']}/events", timeout=60).text
        view = httpx.get(f"{s.url}/v1/jobs/{job['id']}").json()
    blocks = [b for b in events.split("\n\n") if b.strip()]
    steps = [json.loads(b.split("data: ", 1)[1]) for b in blocks if b.startswith("event: step")]
    assert [e["kind"] for e in steps] == ["echo"] and view["state"] == "done"
    q = view["questions"][0]
    assert q["memory"] is None and q["raw_answer"] is not None and [r["kind"] for r in q["steps"]] == ["echo"]


def test_one_training_step_trains_both_conversations(echo_installed, run_cli, tiny_model_dir, tmp_path):
    data = _jsonl(tmp_path / "train.jsonl", [{"id": str(i), "question": "Which river?", "answers": ["Nile"],
                                              "context": "the river Nile runs past the city " * 3} for i in range(2)])
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\ndata: {data}\nout_dir: {tmp_path / 'run'}\nworkflow: echo\n")
    code, _, err = run_cli("train", cfg, "total_steps=1", "save_every=0", "progress=false", "rollout.batch_size=2",
                           "rollout.group_size=2", "update.mini_batch_size=2", "agent.chunk_tokens=12",
                           "agent.answer_tokens=4")
    assert code == 0, err
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["conversations_per_sample"] == 2.0  # the echo call and the final answer, each a row
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model: {tiny_model_dir}\ndata: {data}\nout_dir: {tmp_path / 'run2'}\nworkflow: nope\n")
    code, _, err = run_cli("train", bad)
    assert code == 2 and "unknown workflow 'nope'" in err and "echo" in err


def test_the_docs_show_the_example_file_as_it_stands():
    page = (EXAMPLES.parent / "workflows.md").read_text()
    block = page.split("```python\n")[-1].split("```")[0]
    assert block == (EXAMPLES / "echo_workflow.py").read_text()

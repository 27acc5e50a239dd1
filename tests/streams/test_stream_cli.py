"""`memagent stream create|append|ask|watch|show` on the tiny model: the commands, `tail -f | append`, and a standing
question's answer equal to `memagent ask` over `stream show --text`."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time

from memagent.streams import Stream

SMALL = ["--chunk-tokens", "8", "--memory-tokens", "8", "--answer-tokens", "8", "--query-tokens", "16"]


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_append_lines_jsonl_and_text_then_show(tmp_path, run_cli, monkeypatch):
    s = tmp_path / "s.db"
    assert run_cli("stream", "create", s)[0] == 0
    _stdin(monkeypatch, b"first line\n\n  \nsecond line\n")
    code, _, err = run_cli("stream", "append", s, "--role", "tool", "--time", "2026-03-01T10:00:00+01:00")
    assert code == 0 and "appended 2 event(s) (ids 1-2)" in err and "2 blank line(s) skipped" in err
    (tmp_path / "e.jsonl").write_text(json.dumps({"text": "hi", "role": "assistant", "source": "chat"}) + "\n")
    (tmp_path / "doc.txt").write_text("a whole file\nof two lines\n")
    assert run_cli("stream", "append", s, tmp_path / "e.jsonl", "--format", "jsonl")[0] == 0
    assert run_cli("stream", "append", s, tmp_path / "doc.txt", "--format", "text")[0] == 0
    code, out, _ = run_cli("stream", "show", s, "--events", "--after", "1", "--limit", "2")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["role"], r["text"]) for r in rows] == [(2, "tool", "second line"), (3, "assistant", "hi")]
    assert rows[0]["time"] == "2026-03-01T09:00:00Z" and rows[1]["source"] == "chat"
    code, out, _ = run_cli("stream", "show", s, "--text")
    assert out.endswith("] user:\na whole file\nof two lines\n") and out.startswith(
        "[2026-03-01T09:00:00Z] tool:\nfirst line\n[2026-03-01T09:00:00Z] tool:\nsecond line\n")
    assert "4 events" in run_cli("stream", "show", s)[1]


def test_tail_f_pipe_appends_each_line_as_it_arrives(tmp_path):
    s = tmp_path / "s.db"
    Stream.create(s).close()
    p = subprocess.Popen([sys.executable, "-m", "memagent.cli", "stream", "append", str(s)], stdin=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"one\n")
        p.stdin.flush()
        deadline = time.time() + 60
        while time.time() < deadline:
            with Stream.open(s) as r:
                if len(r):
                    break
            time.sleep(0.2)
        assert p.poll() is None  # still reading its stdin, and the first line is in
        with Stream.open(s) as r:
            assert [e.text for e in r.events()] == ["one"]
        p.stdin.write(b"two\n")
        p.stdin.close()
        assert p.wait(60) == 0
    finally:
        p.kill()
    with Stream.open(s) as r:
        assert [e.text for e in r.events()] == ["one", "two"]


def test_standing_answer_equals_ask_over_show_text(tmp_path, run_cli, monkeypatch, tiny_model_dir):
    s, text = tmp_path / "s.db", tmp_path / "s.txt"
    run_cli("stream", "create", s)
    _stdin(monkeypatch, b"The user lives in Paris.\nThe key k3 holds v7.\nNow the user moved to Berlin.\n")
    run_cli("stream", "append", s, "--time", "2026-01-01")
    q = ["--question", "Where does the user live?", "--model", tiny_model_dir, *SMALL]
    code, out, _ = run_cli("stream", "watch", s, *q)
    versions = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [v["chunk"] for v in versions] == list(range(len(versions))) and len(versions) >= 3
    code, standing, err = run_cli("stream", "ask", s, *q)
    assert code == 0 and "standing question 1:" in err and ("; 2 calls)" in err or "; 1 calls)" in err)
    text.write_text(run_cli("stream", "show", s, "--text")[1])
    code, reference, _ = run_cli("ask", "--document", text, "--no-progress", *q)
    assert code == 0 and standing == reference
    code, adhoc, err = run_cli("stream", "ask", s, *q, "--workflow", "skim", "--workflow-option", "k=2")
    assert code == 0 and "ad hoc, workflow skim" in err and "3 calls" in err
    code, out, _ = run_cli("stream", "show", s, "--trace", "1")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["memory"] for r in lines[:-1]] == [v["memory"] for v in versions] and lines[-1]["kind"] == "final"
    code, out, _ = run_cli("stream", "show", s, "--memories", "1")
    assert [(m["chunk"], m["memory"]) for m in map(json.loads, out.splitlines())] == [
        (v["chunk"], v["memory"]) for v in versions]
    code, _, err = run_cli("stream", "show", s, "--memories", "7")
    assert code == 2 and err.startswith("error: ") and "no standing question 7" in err

"""One run per output: a second `ask --output X`, `eval --out D`, `demo --out D` refuses while the first holds it."""
from __future__ import annotations

import json
import threading

from memagent.cli import run
from memagent.lock import file_lock, run_lock


def _held(ctx):
    """Hold `ctx` in another thread (file locks are per open file, so the same process still conflicts)."""
    ready, release = threading.Event(), threading.Event()

    def hold():
        with ctx:
            ready.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    ready.wait(10)
    return release, t


def test_ask_output_is_refused_while_another_ask_writes_it(tmp_path, tiny_model_dir, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "a", "question": "who?", "context": "Ann wrote it."}) + "\n")
    out = tmp_path / "answers.jsonl"
    release, t = _held(file_lock(out, "ask"))
    try:
        code = run(["ask", "--model", str(tiny_model_dir), "--input", str(questions), "--output", str(out),
                    "--chunk-tokens", "32", "--memory-tokens", "8", "--answer-tokens", "4", "--no-progress"])
    finally:
        release.set()
        t.join()
    err = capsys.readouterr().err
    assert code == 2 and "another ask is writing to" in err and not out.exists()
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(questions), "--output", str(out),
                "--chunk-tokens", "32", "--memory-tokens", "8", "--answer-tokens", "4", "--no-progress"])
    assert code == 0 and json.loads(out.read_text())["id"] == "a"  # free again: it runs


def test_demo_out_is_refused_while_another_demo_runs_there(tmp_path, capsys):
    out = tmp_path / "demo"
    release, t = _held(run_lock(out, "demo"))
    try:
        code = run(["demo", "--quick", "--out", str(out)])
    finally:
        release.set()
        t.join()
    assert code == 2 and "another demo is writing to" in capsys.readouterr().err
    assert not (out / "results.json").exists()

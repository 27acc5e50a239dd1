"""The CLI side: `ask --trace-chunks`, and `serve`'s refusals before it binds anything."""
import json
import sys


def test_ask_trace_chunks_writes_each_chunks_text(run_cli, tmp_path, tiny_model_dir):
    doc = tmp_path / "doc.txt"
    doc.write_text("river city album " * 30)
    trace = tmp_path / "t.jsonl"
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--document", doc, "--question", "q?",
                           "--chunk-tokens", 16, "--memory-tokens", 8, "--answer-tokens", 8, "--trace", trace,
                           "--trace-chunks", "--no-progress")
    assert code == 0, err
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) >= 3 and "".join(r["chunk_text"] for r in records[:-1]) == doc.read_text()


def test_serve_refuses_a_public_host_without_a_key(run_cli, tmp_path, monkeypatch):
    code, _, err = run_cli("serve", "--model", tmp_path, "--host", "0.0.0.0", "--state-dir", tmp_path / "s")
    assert code == 2 and "not a loopback address" in err and "--api-key-env" in err
    monkeypatch.delenv("MEMAGENT_TEST_KEY", raising=False)
    code, _, err = run_cli("serve", "--model", tmp_path, "--api-key-env", "MEMAGENT_TEST_KEY", "--state-dir",
                           tmp_path / "s")
    assert code == 2 and "MEMAGENT_TEST_KEY" in err and "not set" in err
    code, _, err = run_cli("serve", "--model", tmp_path, "--port", 70000, "--state-dir", tmp_path / "s")
    assert code == 2 and "--port" in err


def test_serve_without_its_extra_names_the_extra(run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi now fails
    code, _, err = run_cli("serve", "--model", tmp_path, "--state-dir", tmp_path / "s")
    assert code == 2 and "fastapi" in err and "memagent[serve]" in err


def test_a_second_server_on_one_state_dir_is_refused(run_cli, tmp_path, tiny_model_dir):
    from memagent.lock import run_lock

    with run_lock(tmp_path / "s", "memagent serve"):
        code, _, err = run_cli("serve", "--model", tiny_model_dir, "--state-dir", tmp_path / "s")
    assert code == 2 and "another memagent serve" in err

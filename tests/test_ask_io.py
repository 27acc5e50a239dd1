"""`memagent ask`'s files: outputs never destroy inputs, are checked before any model call, and `--input`
results are written as each finishes, so a failure keeps them and a rerun resumes."""
from __future__ import annotations

import json

import pytest

import memagent.backends
from memagent.agent.workflow import AgentInput, MemoryAgent
from memagent.cli import run
from memagent.config import AgentConfig

SMALL = ["--chunk-tokens", "40", "--memory-tokens", "6", "--answer-tokens", "6", "--no-progress"]


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _no_model(*_args, **_kwargs):
    raise AssertionError("a model was loaded")


def test_trace_equal_to_the_document_is_refused_and_the_document_kept(tmp_path, tiny_model_dir, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text("the river is long and the city is old " * 20)
    before = doc.read_bytes()
    code = run(["ask", "--model", str(tiny_model_dir), "--document", str(doc), "--question", "q",
                "--trace", str(doc), *SMALL])
    assert code == 2 and "--trace" in capsys.readouterr().err
    assert doc.read_bytes() == before  # on main: truncated, then answered from an empty memory (exit 0)


def test_output_equal_to_the_input_is_refused_and_the_input_kept(tmp_path, tiny_model_dir, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "question": "q", "context": "some text"}) + "\n")
    before = inp.read_bytes()
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(inp), "--output", str(inp), *SMALL])
    assert code == 2 and "same path as --input" in capsys.readouterr().err
    assert inp.read_bytes() == before


def test_a_bad_output_path_is_found_before_any_model_call(tmp_path, tiny_model_dir, monkeypatch, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"question": "q", "context": "text"}) + "\n")
    (tmp_path / "file.txt").write_text("x")
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)  # BackendOptions.load calls it
    code = run(["ask", "--model", str(tiny_model_dir), "--input", str(inp),
                "--output", str(tmp_path / "file.txt" / "out.jsonl"), *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and "is a file, not a folder" in err and "Traceback" not in err


def test_one_bad_document_keeps_the_finished_answers_and_a_rerun_resumes(tmp_path, tiny_model_dir, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not text")
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "question": "q1", "context": "city river " * 10},
        {"id": "b", "question": "q2", "document": "bad.txt"},
        {"id": "c", "question": "q3", "context": "key value " * 10}]))
    out = tmp_path / "out.jsonl"
    args = ["ask", "--model", str(tiny_model_dir), "--input", str(inp), "--output", str(out), "--batch-docs", "1", *SMALL]
    assert run(args) == 2  # the other documents go on; the run ends with the count
    err = capsys.readouterr().err
    assert "error: 1 of 3 documents failed (first: id 'b': " in err and "bad.txt is not valid UTF-8" in err
    lines = _lines(out)
    assert [r["id"] for r in lines] == ["a", "b", "c"]
    assert lines[1]["answer"] is None and lines[1]["error"]["kind"] == "DocumentError"
    assert lines[1]["error"]["attempts"] == 1 and "error" not in lines[0] and "error" not in lines[2]
    first = out.read_bytes()
    bad.write_text("the document is fixed now " * 5)
    assert run(args) == 0
    results = _lines(out)
    assert [r["id"] for r in results] == ["a", "b", "c", "b"]  # only the failed one is asked again
    assert out.read_bytes().startswith(first)
    assert all(set(r) == {"id", "question", "answer", "raw_answer", "memory", "num_chunks"} for r in results[3:])


def test_a_rerun_trims_a_torn_last_line_and_skips_the_ids_already_answered(tmp_path, tiny_model_dir, monkeypatch,
                                                                          capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "question": "q", "context": "river " * 8}) + "\n" for i in "abc"))
    out = tmp_path / "out.jsonl"
    done = json.dumps({"id": "a", "question": "q", "answer": None, "raw_answer": "", "memory": "", "num_chunks": 1})
    out.write_text(done + "\n" + '{"id": "b", "quest')  # a run killed mid-line
    args = ["ask", "--model", str(tiny_model_dir), "--input", str(inp), "--output", str(out), *SMALL]
    assert run(args) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == done and sorted(json.loads(x)["id"] for x in lines[1:]) == ["b", "c"]
    monkeypatch.setattr(memagent.backends, "load_backend", _no_model)  # BackendOptions.load calls it
    assert run(args) == 0  # everything answered: no model is loaded
    assert "already answered" in capsys.readouterr().err and out.read_text().splitlines() == lines


def test_on_result_sees_each_result_when_its_document_finishes(tiny_backend):
    agent = MemoryAgent(tiny_backend, AgentConfig(chunk_tokens=20, memory_tokens=4, answer_tokens=4))
    seen = []
    items = [AgentInput("q", "word " * 100, "long"), AgentInput("q", "word " * 10, "short")]
    n_tokens = [len(tiny_backend.tokenizer(it.document, add_special_tokens=False)["input_ids"]) for it in items]
    results = agent.run(items, on_result=lambda r: seen.append((r.doc_id, r.num_chunks)))
    chunks = [-(-n // 20) for n in n_tokens]  # ceil: 20 tokens a chunk
    assert chunks[0] > chunks[1]
    assert seen == [("short", chunks[1]), ("long", chunks[0])]  # the short one is written first
    assert [r.doc_id for r in results] == ["long", "short"]  # the returned list keeps the input order


@pytest.mark.parametrize("line, message", [
    ({"question": 5, "context": "x"}, "field 'question': must be a string"),
    ({"question": "q", "context": {"text": "x"}}, "field 'context': must be the document text"),
    ({"question": "q", "context": ["a", "b"]}, "field 'context': must be the document text"),
    ({"question": "q", "document": 3}, "field 'document': must be a file path"),
    ({"question": "q", "context": "x", "memory": 7}, "'memory'"),
    ({"question": "q", "context": "x", "id": True}, "field 'id': must be a string or an integer"),
])
def test_input_line_fields_are_type_checked(tmp_path, line, message):
    from memagent.ask.io import read_inputs
    from memagent.errors import MemAgentError

    p = tmp_path / "in.jsonl"
    p.write_text(json.dumps(line) + "\n")
    with pytest.raises(MemAgentError, match=message):
        read_inputs(p)


def test_a_document_from_stdin_with_a_trace(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"river city " * 30)))
    trace = tmp_path / "t.jsonl"
    assert run(["ask", "--model", str(tiny_model_dir), "--document", "-", "--question", "q", "--trace", str(trace),
                *SMALL]) == 0
    assert capsys.readouterr().out.strip() and _lines(trace)[-1]["kind"] == "final"

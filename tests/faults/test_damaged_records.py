"""Issue 24, class 7: an eval run's results.jsonl damaged in ways round 2 did not see (an error record without
its error, a score that is a string, deep nesting, ...). Resuming the run and `--rescore` each end in exit code
2 and one error line naming FILE:LINE and the field, with no traceback, no model call and the file unchanged."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from memagent.cli import run

TOY = [{"id": f"t{i}", "task": "toy", "question": "What is k1?", "answers": ["v1"], "metric": "exact_match",
        "length": 2, "length_unit": "chunks", "context": "fact k1 v1"} for i in range(2)]
DEEP = "[" * 5000 + "]" * 5000


def _eval(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--model", str(model), "--data", str(data), "--out", str(out), "--methods", "memagent",
            "--no-progress", *extra]


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """(data file, the out folder of a finished eval run over it)."""
    root = tmp_path_factory.mktemp("damaged")
    data = root / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TOY))
    out = root / "run"
    assert run(_eval(tiny_model_dir, data, out)) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    return data, out


def _set(field: str, value):
    return lambda rec: {**rec, field: value}


def _error_without_error(rec):
    return {**{k: v for k, v in rec.items() if k != "error"}, "status": "error", "score": 0.0}


# (name, how line 1 is damaged: a function of the record or the raw text of the line, what the error says)
DAMAGES = [
    ("error record without error", _error_without_error,
     "results.jsonl:1, field 'error': an error record needs its error {kind, message}"),
    ("error without kind", lambda r: {**r, "status": "error", "error": {"message": "m"}}, "field 'error.kind': must be"),
    ("error a string", lambda r: {**r, "status": "error", "error": "boom"}, "field 'error': an error record needs"),
    ("score a string", _set("score", "0.5"), "results.jsonl:1, field 'score': must be a number or null, got '0.5'"),
    ("score a bool", _set("score", True), "field 'score': must be a number or null"),
    ("scores of strings", _set("scores", {"exact_match": "x"}), "field 'scores': must be an object of numbers"),
    ("length a string", _set("length", "2"), "field 'length': must be null or an integer"),
    ("length 10**30", _set("length", 10**30), "field 'length': must be null or an integer"),
    ("gold a string", _set("gold", "v1"), "field 'gold': must be a list of strings"),
    ("raw a list", _set("raw", ["x"]), "field 'raw': must be a string or null"),
    ("status unknown", _set("status", "done"), "field 'status': must be \"ok\" or \"error\""),
    ("repeat negative", _set("repeat", -1), "field 'repeat': must be an integer >= 0"),
    ("metric a list", _set("metric", ["em"]), "field 'metric': must be a metric name"),
    ("no task", lambda r: {k: v for k, v in r.items() if k != "task"}, "results.jsonl:1: not a result record (no 'task')"),
    ("a list, not a record", lambda r: [r], "results.jsonl:1: not a result record (a JSON object expected, got list)"),
    ("deep nesting", lambda line: line[:-1] + ', "deep": ' + DEEP + "}", "results.jsonl:1: nested more than 64 levels"),
    ("a 10,000-digit integer", lambda line: line[:-1] + ', "n": ' + "9" * 10_000 + "}",
     "results.jsonl:1: an integer of 10,000 digits"),
    ("a lone surrogate", lambda line: line.replace('"raw": "', '"raw": "\\ud800', 1),
     "results.jsonl:1, field 'raw': holds text that is not valid UTF-8 (a lone surrogate U+D800"),
]


def _damage(results: Path, how) -> None:
    lines = results.read_text(encoding="utf-8").splitlines()
    try:
        new = json.dumps(how(json.loads(lines[0])), ensure_ascii=False)
    except (TypeError, KeyError, AttributeError):
        new = how(lines[0])
    if new == lines[0]:
        pytest.fail("the damage changed nothing")
    results.write_text("\n".join([new, *lines[1:]]) + "\n", encoding="utf-8")


@pytest.mark.parametrize("rescore", [False, True], ids=["resume", "rescore"])
@pytest.mark.parametrize("name, how, message", DAMAGES, ids=[d[0] for d in DAMAGES])
def test_a_damaged_record_is_one_error_line(finished, tiny_model_dir, tmp_path, capsys, name, how, message, rescore):
    data, done = finished
    out = tmp_path / "run"
    shutil.copytree(done, out)
    results = out / "results.jsonl"
    _damage(results, how)
    before = hashlib.sha256(results.read_bytes()).hexdigest()
    code = run(_eval(tiny_model_dir, data, out, *(["--rescore"] if rescore else [])))
    out_text, err = capsys.readouterr()
    lines = [line for line in (out_text + err).splitlines() if line.startswith("error:")]
    assert code == 2, err[-3000:]
    assert len(lines) == 1 and message in lines[0] and str(results) in lines[0], err[-3000:]
    assert lines[0].endswith("fix or delete that line, or move the file away to start over") and len(lines[0]) < 600
    assert "Traceback" not in out_text + err
    assert hashlib.sha256(results.read_bytes()).hexdigest() == before  # nothing rewritten, nothing appended


def test_records_that_are_whole_still_resume_and_rescore(finished, tiny_model_dir, tmp_path):
    data, done = finished
    out = tmp_path / "run"
    shutil.copytree(done, out)
    before = (out / "results.jsonl").read_bytes()
    assert run(_eval(tiny_model_dir, data, out)) == 0  # every record done: nothing is run again
    assert (out / "results.jsonl").read_bytes() == before
    assert run(_eval(tiny_model_dir, data, out, "--rescore")) == 0
    assert [json.loads(x)["key"] for x in (out / "results.jsonl").read_text().splitlines()] == \
        [json.loads(x)["key"] for x in before.decode().splitlines()]

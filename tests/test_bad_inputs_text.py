"""Bad inputs of issue 24, classes 1-3 and some of 19: text that is not valid UTF-8 (argv, JSON fields), nesting
and number bombs (JSON and YAML), malformed paragraph-index ("lazy") records, and values accepted without a
check. Each: exit code 2, exactly one `error:` line, no traceback, every input byte-identical (the table style of
tests/test_bad_inputs.py, whose `world` fixture and `_digests` are reused)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_inputs import HOTPOT, _digests, _jsonl, world  # noqa: F401  (world: a fixture)

from memagent.cli import run

DEEP = "[" * 5000 + "]" * 5000  # past the recursion limit of the readers on main; past 64 levels here
BIG = "9" * 10_000  # Python refuses to parse more than 4,300 digits
Q = {"id": "a", "question": "q", "context": "text"}
SAMPLE = {"id": "a", "task": "qa", "question": "q", "answers": ["a"], "context": "text"}
LAZY = {"kind": "paragraphs", "format": "hotpotqa", "source": "{t}/hotpotqa_dev.json", "sha256": "0" * 64,
        "doc_ids": [0, 1]}


def _raw(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _bomb_yaml(levels: int = 6) -> str:
    lines = ["  a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"  {chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def tw(tmp_path_factory, tiny_model_dir, world):  # noqa: F811
    """The text world: inputs of classes 1-3 and 19; `{t}` in the cases."""
    t = tmp_path_factory.mktemp("textworld")
    (t / "hotpotqa_dev.json").write_text(json.dumps(HOTPOT))
    (t / "doc.txt").write_text("a short document about a river " * 5)
    for name, field in (("q_sur", "question"), ("ctx_sur", "context"), ("id_sur", "id")):
        _raw(t / f"{name}.jsonl", [json.dumps({**Q, field: "who \\ud800 is"}).replace("\\\\ud800", "\\ud800")])
    _raw(t / "mem_sur.jsonl", ['{"id": "a", "question": "q", "context": "text", "memory": "m \\udfff"}'])
    _raw(t / "deep.jsonl", ['{"id": "a", "question": "q", "context": "text", "memory": ' + DEEP + "}"])
    _raw(t / "bigint.jsonl", ['{"id": ' + BIG + ', "question": "q", "context": "text"}'])
    _raw(t / "trace_sur.jsonl", ['{"doc_id": "a", "step": 0, "memory": "m \\ud800"}'])
    _raw(t / "trace_deep.jsonl", ['{"doc_id": "a", "step": 0, "memory": "m", "x": ' + DEEP + "}"])
    _raw(t / "eval_sur.jsonl", ['{"id": "a", "question": "q \\udc80", "answers": ["a"], "context": "text"}'])
    _jsonl(t / "empty_array.json", [])
    (t / "empty_array.json").write_text("[]")
    _jsonl(t / "length_huge.jsonl", [{**SAMPLE, "length": 10**30}])
    _jsonl(t / "metric_list.jsonl", [{**SAMPLE, "metric": ["em"]}])
    (t / "notes.txt").write_text("these are notes, not a paragraph file\n")
    (t / "eval_idx.json").write_text(json.dumps([{"input": "q", "answers": ["a"], "num_docs": 2, "index": 0,
                                                  "context": [0, 1]}]))
    (t / "released_deep.json").write_text('[{"input": "q", "answers": ' + DEEP + ', "index": 0, "context": "c"}]')
    (t / "hotpot_deep.json").write_text('[{"_id": "q", "question": "q", "answer": "a", "context": ' + DEEP + "}]")
    (t / "hotpot_bigint.json").write_text('[{"_id": ' + BIG + ', "question": "q", "answer": "a", "context": []}]')
    for name, change in (("lz_nosrc", {"source": None}), ("lz_srcint", {"source": 5}), ("lz_ids_str", {"doc_ids": "01"}),
                         ("lz_ids_dict", {"doc_ids": {"a": 1}}), ("lz_ids_float", {"doc_ids": [0.5]}),
                         ("lz_kind", {"kind": "text"})):
        lazy = {k: (v.replace("{t}", str(t)) if isinstance(v, str) else v) for k, v in {**LAZY, **change}.items()}
        _jsonl(t / f"{name}.jsonl", [{**{k: v for k, v in SAMPLE.items() if k != "context"}, "lazy": lazy}])
    (t / "deep.json").write_text('{"num_hidden_layers": 2, "x": ' + DEEP + "}")
    (t / "bigint.json").write_text('{"num_hidden_layers": ' + BIG + "}")
    train = (world / "train.yaml").read_text()
    for name, extra in (("tag_float", "seed: !!float 3\n"), ("date", "seed: 2024-01-01\n"),
                        ("deep", "agent: " + DEEP + "\n"), ("bigint", "seed: " + BIG + "\n"),
                        ("bomb", "seed:\n" + _bomb_yaml() + "\n"), ("binary", "data: !!binary aGk=\n")):
        (t / f"train_{name}.yaml").write_text(train.replace(f"out_dir: {world / 'runs'}", f"out_dir: {t / 'runs'}")
                                              + extra)
    (t / "profile_deep.yaml").write_text("prompts: " + DEEP + "\n")
    (t / "profile_tag.yaml").write_text("budgets:\n  chunk_tokens: !!float 64\n")
    (t / "profile_bomb.yaml").write_text("prompts:\n" + _bomb_yaml() + "\n")
    shutil.copytree(tiny_model_dir, t / "m_deep")
    (t / "m_deep" / "memagent.json").write_text('{"chunk_tokens": ' + DEEP + "}")
    return t


ASK = ["ask", "--model", "{m}", "--no-progress"]
DOC = [*ASK, "--document", "{t}/doc.txt"]
EVAL = ["eval", "--model", "{m}", "--out", "{e}", "--no-progress", "--data"]
TRAIN = ["train", "{w}/train.yaml", "progress=false"]
TEXT = "holds text that is not valid UTF-8"

CASES = [
    # class 1: text that is not valid UTF-8, on the command line and in JSON fields
    ("argv-question-surrogate", [*DOC, "--question", os.fsdecode(b"who \xed\xa0\x80 is")],
     f"--question {TEXT} (the byte 0xed at character 4"),
    ("argv-question-latin1", [*DOC, "--question", os.fsdecode(b"caf\xe9")], f"--question {TEXT} (the byte 0xe9"),
    ("argv-lone-surrogate", [*DOC, "--question", "who \ud800"], "(a lone surrogate U+D800 at character 4)"),
    ("argv-path-bytes", [*ASK, "--document", os.fsdecode(b"/tmp/\xff.txt"), "--question", "q"], f"--document {TEXT}"),
    ("argv-override", [*TRAIN, os.fsdecode(b"data=\xff")], f"argument 4 {TEXT}"),
    ("ask-question-surrogate", [*ASK, "--input", "{t}/q_sur.jsonl"], f"q_sur.jsonl:1, field 'question': {TEXT}"),
    ("ask-context-surrogate", [*ASK, "--input", "{t}/ctx_sur.jsonl"], f"ctx_sur.jsonl:1, field 'context': {TEXT}"),
    ("ask-id-surrogate", [*ASK, "--input", "{t}/id_sur.jsonl"], f"id_sur.jsonl:1, field 'id': {TEXT}"),
    ("ask-memory-surrogate", [*ASK, "--input", "{t}/mem_sur.jsonl"], f"field 'memory': {TEXT} (a lone surrogate U+DFFF"),
    ("report-trace-surrogate", ["report", "{t}/trace_sur.jsonl", "--out", "{t}/r.html"],
     f"trace_sur.jsonl:1, field 'memory': {TEXT}"),
    ("eval-question-surrogate", [*EVAL, "{t}/eval_sur.jsonl"], f"eval_sur.jsonl:1, field 'question': {TEXT}"),
    # class 2: nesting and number bombs, JSON
    ("ask-input-deep", [*ASK, "--input", "{t}/deep.jsonl"], "deep.jsonl:1: nested more than 64 levels deep"),
    ("ask-input-bigint", [*ASK, "--input", "{t}/bigint.jsonl"], "bigint.jsonl:1: an integer of 10,000 digits"),
    ("ask-settings-deep", ["ask", "--model", "{t}/m_deep", "--document", "{t}/doc.txt", "--question", "q"],
     "memagent.json: nested more than 64 levels"),
    ("report-trace-deep", ["report", "{t}/trace_deep.jsonl", "--out", "{t}/r.html"], "nested more than 64 levels"),
    ("flops-config-deep", ["flops", "--model", "{t}/deep.json"], "deep.json: nested more than 64 levels"),
    ("flops-config-bigint", ["flops", "--model", "{t}/bigint.json"], "an integer of 10,000 digits"),
    ("hqa-source-deep", ["data", "ruler-hqa", "--source", "{t}/hotpot_deep.json", "--num-docs", "4", "--samples", "1",
                         "--out", "{t}/o.jsonl"], "hotpot_deep.json: nested more than 64 levels"),
    ("hqa-source-bigint", ["data", "ruler-hqa", "--source", "{t}/hotpot_bigint.json", "--num-docs", "4",
                           "--samples", "1", "--out", "{t}/o.jsonl"], "an integer of 10,000 digits"),
    ("import-released-deep", ["data", "import", "{t}/released_deep.json", "--out", "{t}/o.jsonl"],
     "released_deep.json: record 0: nested more than 64 levels"),
    # class 2: YAML configs, overrides and profiles
    ("train-yaml-tag-float", ["train", "{t}/train_tag_float.yaml", "progress=false"], "the YAML tag tag:yaml.org,2002:float is not accepted"),
    ("train-yaml-binary", ["train", "{t}/train_binary.yaml", "progress=false"], "the YAML tag tag:yaml.org,2002:binary is not accepted"),
    ("train-yaml-date", ["train", "{t}/train_date.yaml", "progress=false"], "seed must be an integer, got '2024-01-01'"),
    ("train-yaml-deep", ["train", "{t}/train_deep.yaml", "progress=false"], "train_deep.yaml: nested more than 64 levels"),
    ("train-yaml-bigint", ["train", "{t}/train_bigint.yaml", "progress=false"], "a number of 10,000 digits"),
    ("train-yaml-bomb", ["train", "{t}/train_bomb.yaml", "progress=false"], "expands to more than 100,000 values"),
    ("train-override-deep", [*TRAIN, "agent.chunk_tokens=" + DEEP], "nested more than 64 levels"),
    ("train-override-tag", [*TRAIN, "seed=!!float 3"], "the YAML tag tag:yaml.org,2002:float"),
    ("ask-profile-deep", [*DOC, "--question", "q", "--profile", "{t}/profile_deep.yaml"], "nested more than 64 levels"),
    ("ask-profile-tag", [*DOC, "--question", "q", "--profile", "{t}/profile_tag.yaml"], "is not accepted"),
    ("ask-profile-bomb", [*DOC, "--question", "q", "--profile", "{t}/profile_bomb.yaml"], "expands to more than"),
    # class 3: paragraph-index ("lazy") records
    ("ask-lazy-no-source", [*ASK, "--input", "{t}/lz_nosrc.jsonl"], "lz_nosrc.jsonl:1, field 'lazy.source': must be"),
    ("ask-lazy-source-int", [*ASK, "--input", "{t}/lz_srcint.jsonl"], "field 'lazy.source': must be a non-empty string"),
    ("eval-lazy-ids-str", [*EVAL, "{t}/lz_ids_str.jsonl"], "lz_ids_str.jsonl:1, field 'lazy.doc_ids': must be a list"),
    ("eval-lazy-ids-dict", [*EVAL, "{t}/lz_ids_dict.jsonl"], "field 'lazy.doc_ids': must be a list"),
    ("eval-lazy-ids-float", [*EVAL, "{t}/lz_ids_float.jsonl"], "field 'lazy.doc_ids': must be a list"),
    ("eval-lazy-kind", [*EVAL, "{t}/lz_kind.jsonl"], "field 'lazy.kind': must be \"paragraphs\""),
    # class 19: values accepted without a check
    ("import-source-text-file", ["data", "import", "{t}/eval_idx.json", "--source", "{t}/notes.txt", "--out",
                                 "{t}/o.jsonl"], "--source {t}/notes.txt is not a paragraph file"),
    ("eval-data-empty-array", [*EVAL, "{t}/empty_array.json"], "empty_array.json holds no samples"),
    ("eval-length-huge", [*EVAL, "{t}/length_huge.jsonl"], "its length (length, num_docs or num_chunks) must be an integer"),
    ("eval-metric-list", [*EVAL, "{t}/metric_list.jsonl"], "metric_list.jsonl:1, field 'metric': must be a metric name"),
]


@pytest.mark.parametrize("args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_text_input(args, message, world, tw, tiny_model_dir, capsys):  # noqa: F811
    before = _digests(world, tw, Path(tiny_model_dir))

    def fill(a: str) -> str:
        return (a.replace("{w}", str(world)).replace("{t}", str(tw)).replace("{m}", str(tiny_model_dir))
                .replace("{e}", str(tw.parent / "evalrun_text")))

    code = run([fill(a) for a in args])
    out, err = capsys.readouterr()
    assert code == 2, (out[-2000:], err[-2000:])
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and fill(message) in lines[0], (out[-2000:], err[-2000:])
    assert "Traceback" not in out + err and len(lines[0]) < 1000
    assert _digests(world, tw, Path(tiny_model_dir)) == before
    assert not (tw.parent / "evalrun_text" / "results.jsonl").exists()  # refused before any model call


def test_a_bom_before_the_first_record_is_accepted(tw, tmp_path):
    data = tmp_path / "bom.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + json.dumps(SAMPLE).encode() + b"\n")
    out = tmp_path / "o.jsonl"
    assert run(["data", "import", str(data), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["question"] == "q"


@pytest.mark.parametrize("body", [b"[" + b"7" * 10_000 + b"]", b'[{"input": "q", "index": ' + b"7" * 10_000 + b"}]"])
def test_a_long_integer_in_a_released_array_is_one_error_line(tmp_path, body):
    """A subprocess: the C JSON-array reader of main died of a segmentation fault here."""
    path = tmp_path / "big.json"
    path.write_bytes(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-m", "memagent.cli", "data", "import", str(path), "--out",
                        str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [f"error: {path}: record 0: an integer of 10,000 digits, more than the 4,300 "
                                             "allowed; write it as a string if it is an id"]


@pytest.mark.parametrize("body, says", [
    (b'{"choices": ' + DEEP.encode() + b"}", "nested more than 64 levels deep"),
    (b'{"choices": [{"message": {"role": "assistant", "content": "hi \\ud800"}, "finish_reason": "stop"}]}',
     r"field .choices.: holds text that is not valid UTF-8 \(a lone surrogate U\+D800"),
    (b'{"choices": [], "usage": {"prompt_tokens": ' + BIG.encode() + b"}}", "an integer of 10,000 digits"),
], ids=["deep", "surrogate", "bigint"])
def test_a_server_reply_is_read_bounded(openai_server, tiny_model_dir, body, says):
    from memagent.backends.base import BackendError, SamplingParams
    from memagent.backends.openai import OpenAIBackend

    backend = OpenAIBackend(model="tiny", base_url=openai_server.url, tokenizer=tiny_model_dir, timeout=5.0,
                            backoff=0.01, retry_seed=0, check_server=False, max_retries=1)
    openai_server.raw_next(1, body)
    with pytest.raises(BackendError, match=says) as e:
        backend.generate(["hello"], SamplingParams(4))
    assert openai_server.url in str(e.value)
    assert backend.generate(["hello"], SamplingParams(4))[0].token_ids  # the next reply is fine again

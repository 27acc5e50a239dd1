"""Bad inputs across every command: each ends in exit code 2, exactly one `error:` line, no traceback, and
leaves every input file as it was (sha256 before and after). In process, through `memagent.cli.run`."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from memagent.cli import run

HOTPOT = [{"_id": f"q{i}", "question": f"Where is item {i}?", "answer": f"place {i}",
           "supporting_facts": [[f"Title {i}", 0]],
           "context": [[f"Title {i}", [f"Item {i} lies in place {i}.", "It is old."]],
                       [f"Other {i}", ["Nothing here.", "Still nothing."]]]} for i in range(6)]
LATIN1 = "caf\u00e9 cr\u00e8me".encode("latin-1")


def _jsonl(path: Path, records: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    """Input files of every kind, good and bad; `m` the tiny model, `w` the folder of the rest."""
    w = tmp_path_factory.mktemp("world")
    (w / "doc.txt").write_text("a short document about a river and a city " * 5)
    _jsonl(w / "in.jsonl", [{"id": "a", "question": "q", "context": "text"}, {"id": "b", "question": "q",
                                                                             "document": "doc.txt"}])
    _jsonl(w / "q5.jsonl", [{"question": 5, "context": "text"}])
    _jsonl(w / "ctxobj.jsonl", [{"question": "q", "context": {"text": "x"}}])
    _jsonl(w / "nodoc.jsonl", [{"question": "q", "document": "missing.txt"}])
    _jsonl(w / "dupid.jsonl", [{"id": "x", "question": "q", "context": "a"}, {"id": "x", "question": "r", "context": "b"}])
    _jsonl(w / "idlist.jsonl", [{"id": [1], "question": "q", "context": "a"}])
    _jsonl(w / "both.jsonl", [{"question": "q", "context": "a", "document": "doc.txt"}])
    (w / "latin1.jsonl").write_bytes(b'{"question": "q", "context": "' + LATIN1 + b'"}\n')
    (w / "empty.jsonl").write_text("\n")
    (w / "folder").mkdir()
    toy = [{"id": f"t{i}", "task": "toy", "question": "What is k1?", "answers": ["v1"], "metric": "exact_match",
            "length": 2, "length_unit": "chunks", "context": "fact k1 v1"} for i in range(2)]
    _jsonl(w / "toy.jsonl", toy)
    (w / "evalout").mkdir()
    _jsonl(w / "evalout" / "results.jsonl", toy)
    (w / "hotpot.json").write_text(json.dumps(HOTPOT))
    (w / "notjson.json").write_text("{this is not json")
    (w / "list.json").write_text("[1, 2]")
    (w / "strlayers.json").write_text(json.dumps({"num_hidden_layers": "two", "hidden_size": 8, "vocab_size": 9,
                                                  "num_attention_heads": 2, "intermediate_size": 16}))
    (w / "hotpot_latin1.json").write_bytes(b'[{"question": "' + LATIN1 + b'"}]')
    _jsonl(w / "train.jsonl", [{"id": "1", "question": "q", "answers": ["a"], "context": "text"}])
    (w / "train.yaml").write_text(f"model: {tiny_model_dir}\ndata: {w / 'train.jsonl'}\nout_dir: {w / 'runs'}\n")
    (w / "latin1.yaml").write_bytes(b"model: " + LATIN1 + b"\n")
    (w / "list.yaml").write_text("- 1\n- 2\n")
    (w / "intkey.yaml").write_text("1: 2\nseed: 3\n")
    (w / "oldrun").mkdir()
    (w / "oldrun" / "metrics.jsonl").write_text('{"step": 1}\n')
    for name, settings in (("m_list", b"[1, 2]"), ("m_str", b'{"chunk_tokens": "5"}'), ("m_latin1", LATIN1)):
        shutil.copytree(tiny_model_dir, w / name)
        (w / name / "memagent.json").write_bytes(settings)
    return w


def _digests(*roots: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


ASK = ["ask", "--model", "{m}", "--no-progress"]
ONE = [*ASK, "--document", "{w}/doc.txt", "--question", "q"]
MANY = [*ASK, "--input", "{w}/in.jsonl"]
EVAL = ["eval", "--model", "{m}", "--data", "{w}/toy.jsonl", "--out", "{w}/evalrun", "--no-progress"]
TRAIN = ["train", "{w}/train.yaml", "progress=false"]
HQA = ["data", "ruler-hqa", "--source", "{w}/hotpot.json", "--num-docs", "4", "--samples", "1", "--out", "{w}/o.jsonl"]
RULER = ["data", "ruler", "--task", "vt", "--tokens", "300", "--tokenizer", "tiny", "--samples", "1",
         "--out", "{w}/o.jsonl"]
TOY = ["data", "toy", "--chunks", "2", "--samples", "1", "--out", "{w}/o.jsonl"]

CASES = [
    # ask: flags
    ("ask-temp-nan", [*ONE, "--temperature", "nan"], "--temperature must be a finite"),
    ("ask-temp-inf", [*ONE, "--temperature", "inf"], "--temperature must be a finite"),
    ("ask-temp-neg", [*ONE, "--temperature", "-1"], "--temperature must be a finite"),
    ("ask-timeout-0", [*ONE, "--request-timeout", "0"], "--request-timeout must be"),
    ("ask-timeout-nan", [*ONE, "--request-timeout", "nan"], "--request-timeout must be"),
    ("ask-retries-neg", [*ONE, "--max-retries", "-1"], "--max-retries must be >= 0"),
    ("ask-batch-0", [*ONE, "--batch-docs", "0"], "--batch-docs must be a positive"),
    ("ask-concurrency-0", [*ONE, "--max-concurrency", "0"], "--max-concurrency must be a positive"),
    ("ask-chunk-neg", [*ONE, "--chunk-tokens", "-5"], "--chunk-tokens must be a positive"),
    ("ask-memory-0", [*ONE, "--memory-tokens", "0"], "--memory-tokens must be a positive"),
    ("ask-tp-0", [*ONE, "--tensor-parallel", "0"], "--tensor-parallel must be a positive"),
    ("ask-device-gpu99", [*ONE, "--device", "cuda:99"], "--device cuda:99"),
    ("ask-device-tpu", [*ONE, "--device", "tpu"], "--device 'tpu' is unknown"),
    ("ask-dtype", [*ONE, "--dtype", "float8"], "--dtype must be one of auto, float32"),
    ("ask-errors", [*ONE, "--errors", "ignore"], "--errors must be one of strict, replace; got 'ignore'"),
    ("ask-backend", [*ONE, "--backend", "nope"], "--backend must be one of transformers, openai, vllm; got 'nope'"),
    ("ask-int-text", [*ONE, "--batch-docs", "many"], "Invalid value for '--batch-docs'"),
    ("ask-document-folder", [*ASK, "--document", "{w}/folder", "--question", "q"], "is a folder"),
    ("ask-no-question", [*ASK, "--document", "{w}/doc.txt"], "give --question"),
    ("ask-output-one", [*ONE, "--output", "{w}/o.jsonl"], "--output is for --input"),
    # ask: outputs that would destroy inputs or cannot be written
    ("ask-trace-is-document", [*ONE, "--trace", "{w}/doc.txt"], "same path as --document"),
    ("ask-trace-is-document-rel", [*ONE, "--trace", "{w}/folder/../doc.txt"], "same path as --document"),
    ("ask-output-is-input", [*MANY, "--output", "{w}/in.jsonl"], "same path as --input"),
    ("ask-output-is-line-document", [*MANY, "--output", "{w}/doc.txt"], "same path as the document of id 'b'"),
    ("ask-trace-is-input", [*MANY, "--trace", "{w}/in.jsonl"], "same path as --input"),
    ("ask-output-is-trace", [*MANY, "--output", "{w}/t.jsonl", "--trace", "{w}/t.jsonl"], "same path as --trace"),
    ("ask-trace-is-model-config", [*ONE, "--trace", "{m}/config.json"], "same path as model file config.json"),
    ("ask-output-folder", [*MANY, "--output", "{w}/folder"], "is a folder"),
    ("ask-output-under-file", [*MANY, "--output", "{w}/doc.txt/out.jsonl"], "is a file, not a folder"),
    ("ask-trace-under-file", [*ONE, "--trace", "{w}/doc.txt/t/trace.jsonl"], "is a file, not a folder"),
    # ask: --input lines and memagent.json
    ("ask-question-int", [*ASK, "--input", "{w}/q5.jsonl"], "q5.jsonl:1, field 'question': must be a string"),
    ("ask-context-object", [*ASK, "--input", "{w}/ctxobj.jsonl"], "field 'context': must be the document text"),
    ("ask-input-latin1", [*ASK, "--input", "{w}/latin1.jsonl"], "latin1.jsonl:1: not valid UTF-8"),
    ("ask-input-missing-doc", [*ASK, "--input", "{w}/nodoc.jsonl"], "missing.txt not found"),
    ("ask-input-dup-id", [*ASK, "--input", "{w}/dupid.jsonl"], "sample id 'x' of record 1 repeats record 0"),
    ("ask-input-id-list", [*ASK, "--input", "{w}/idlist.jsonl"], "field 'id': must be a string or an integer"),
    ("ask-input-both", [*ASK, "--input", "{w}/both.jsonl"], "not both"),
    ("ask-input-folder", [*ASK, "--input", "{w}/folder"], "is a folder"),
    ("ask-input-empty", [*ASK, "--input", "{w}/empty.jsonl"], "empty.jsonl is empty"),
    ("ask-settings-list", ["ask", "--model", "{w}/m_list", "--document", "{w}/doc.txt", "--question", "q"],
     "must be a JSON object"),
    ("ask-settings-str", ["ask", "--model", "{w}/m_str", "--document", "{w}/doc.txt", "--question", "q"],
     "memagent.json: budgets.chunk_tokens must be an integer, got '5'"),
    ("ask-settings-latin1", ["ask", "--model", "{w}/m_latin1", "--document", "{w}/doc.txt", "--question", "q"],
     "is not valid UTF-8"),
    # eval
    ("eval-limit-neg", [*EVAL, "--limit", "-5"], "--limit must be a positive"),
    ("eval-limit-0", [*EVAL, "--limit", "0"], "--limit must be a positive"),
    ("eval-window-0", [*EVAL, "--window", "0"], "--window must be a positive"),
    ("eval-data-comma", ["eval", "--model", "{m}", "--data", ",", "--out", "{w}/evalrun"], "--data ',' names nothing"),
    ("eval-methods-comma", [*EVAL, "--methods", " , "], "--methods ' , ' names nothing"),
    ("eval-temp-nan", [*EVAL, "--temperature", "nan"], "--temperature must be a finite"),
    ("eval-batch-0", [*EVAL, "--batch-docs", "0"], "--batch-docs must be a positive"),
    ("eval-passage-0", [*EVAL, "--passage-tokens", "0"], "--passage-tokens must be a positive"),
    ("eval-device", [*EVAL, "--device", "cuda:99"], "--device cuda:99"),
    ("eval-out-is-file", ["eval", "--model", "{m}", "--data", "{w}/toy.jsonl", "--out", "{w}/toy.jsonl"],
     "same path as --data"),
    ("eval-out-under-file", ["eval", "--model", "{m}", "--data", "{w}/toy.jsonl", "--out", "{w}/doc.txt/e"],
     "is a file, not a folder"),
    ("eval-data-is-results", ["eval", "--model", "{m}", "--data", "{w}/evalout/results.jsonl", "--out", "{w}/evalout"],
     "--out (its results.jsonl)"),
    ("eval-data-missing", ["eval", "--model", "{m}", "--data", "{w}/nope.jsonl", "--out", "{w}/e"], "does not exist"),
    ("eval-data-folder", ["eval", "--model", "{m}", "--data", "{w}/folder", "--out", "{w}/e"], "is a folder"),
    ("eval-missing-model-flag", ["eval", "--data", "{w}/toy.jsonl", "--out", "{w}/e"], "Missing option '--model'"),
    # train: config file, overrides, out_dir
    ("train-yaml-latin1", ["train", "{w}/latin1.yaml"], "is not valid UTF-8"),
    ("train-yaml-list", ["train", "{w}/list.yaml"], "must be a YAML mapping"),
    ("train-yaml-int-key", ["train", "{w}/intkey.yaml"], "unknown key(s) 1"),
    ("train-yaml-folder", ["train", "{w}/folder"], "is a folder"),
    ("train-yaml-missing", ["train", "{w}/nope.yaml"], "does not exist"),
    ("train-seed-list", [*TRAIN, "seed=[1,2]"], "seed must be an integer"),
    ("train-seed-dict", [*TRAIN, "seed={a: 1}"], "seed must be an integer"),
    ("train-lr-nan", [*TRAIN, "optim.lr=nan"], "optim.lr must be a finite number"),
    ("train-lr-inf", [*TRAIN, "optim.lr=.inf"], "optim.lr must be a finite number"),
    ("train-temp-nan", [*TRAIN, "agent.temperature=.nan"], "agent.temperature must be a finite number"),
    ("train-seed-huge", [*TRAIN, "seed=99999999999999999999"], "seed must be in [0, 2**32)"),
    ("train-steps-neg", [*TRAIN, "total_steps=-1"], "total_steps must be a positive"),
    ("train-batch-text", [*TRAIN, "rollout.batch_size=abc"], "rollout.batch_size must be an integer"),
    ("train-bad-yaml-value", [*TRAIN, "seed=[1,"], "not valid YAML"),
    ("train-empty-key-part", [*TRAIN, "loss..kl_coef=0"], "empty part"),
    ("train-unknown-key", [*TRAIN, "nope=1"], "unknown key(s) nope"),
    ("train-device", [*TRAIN, "device=cuda:99"], "device cuda:99"),
    ("train-device-unknown", [*TRAIN, "device=gpu"], "'gpu' is unknown"),
    ("train-out-is-model", [*TRAIN, "out_dir={m}"], "same path as model"),
    ("train-out-holds-a-model", [*TRAIN, "out_dir={w}/m_list"], "holds a model"),
    ("train-out-is-old-run", [*TRAIN, "out_dir={w}/oldrun"], "holds an earlier run"),
    ("train-out-under-file", [*TRAIN, "out_dir={w}/doc.txt/run"], "is a file, not a folder"),
    ("train-data-missing", [*TRAIN, "data={w}/nope.jsonl"], "does not exist"),
    # data
    ("hqa-samples-neg", [*HQA, "--samples", "-3"], "--samples must be a positive"),
    ("hqa-seed-neg", [*HQA, "--seed", "-1"], "--seed must be >= 0"),
    ("hqa-out-is-source", [*HQA, "--out", "{w}/hotpot.json"], "same path as --source"),
    ("hqa-out-folder", [*HQA, "--out", "{w}/folder"], "is a folder"),
    ("hqa-out-under-file", [*HQA, "--out", "{w}/doc.txt/o.jsonl"], "is a file, not a folder"),
    ("hqa-num-docs-0", [*HQA, "--num-docs", "0"], "expected positive integers"),
    ("hqa-filter-backend", [*HQA, "--filter-backend", "nope"], "--filter-backend must be one of transformers, openai, vllm"),
    ("hqa-source-latin1", [*HQA, "--source", "{w}/hotpot_latin1.json"], "not valid UTF-8"),
    ("ruler-samples-0", [*RULER, "--samples", "0"], "--samples must be a positive"),
    ("ruler-tokens-neg", [*RULER, "--tokens", "-1"], "expected positive integers"),
    ("ruler-out-is-haystack", [*RULER, "--haystack-file", "{w}/doc.txt", "--out", "{w}/doc.txt"],
     "same path as --haystack-file"),
    ("toy-chunks-0", [*TOY, "--chunks", "0"], "expected positive integers"),
    ("toy-samples-neg", [*TOY, "--samples", "-3"], "--samples must be a positive"),
    ("toy-keys-0", [*TOY, "--keys", "0"], "--keys must be a positive"),
    ("toy-out-folder", [*TOY, "--out", "{w}/folder"], "is a folder"),
    # flops
    ("flops-lengths-0", ["flops", "--lengths", "0"], "expected positive integers"),
    ("flops-lengths-comma", ["flops", "--lengths", ","], "expected positive integers"),
    ("flops-plot-is-config", ["flops", "--model", "{m}", "--plot", "{m}/config.json"], "same path as --model"),
    ("flops-config-not-json", ["flops", "--model", "{w}/notjson.json"], "notjson.json is not valid JSON"),
    ("flops-config-list", ["flops", "--model", "{w}/list.json"], "must be a JSON object"),
    ("flops-config-str-field", ["flops", "--model", "{w}/strlayers.json"], "layers must be a positive integer"),
    ("flops-plot-format", ["flops", "--plot", "{w}/f.xyz"], "write a .png, .pdf or .svg"),
    ("flops-plot-under-file", ["flops", "--plot", "{w}/doc.txt/f.png"], "is a file, not a folder"),
    # tiny-model
    ("tiny-over-model", ["tiny-model", "{m}"], "already holds a model"),
    ("tiny-over-run", ["tiny-model", "{w}/oldrun"], "already holds a run"),
    ("tiny-dir-is-file", ["tiny-model", "{w}/doc.txt"], "is a file, not a folder"),
    ("tiny-under-file", ["tiny-model", "{w}/doc.txt/m"], "is a file, not a folder"),
    ("tiny-seed-huge", ["tiny-model", "{w}/new", "--seed", "99999999999999999999"], "--seed 99999999999999999999 is over the limit of 4,294,967,295 (NumPy's seeds are below 2**32)"),
    ("tiny-seed-neg", ["tiny-model", "{w}/new", "--seed", "-1"], "--seed must be >= 0"),
    # demo (all refused before any work starts)
    ("demo-seed-neg", ["demo", "--seed", "-1", "--out", "{w}/demo"], "--seed must be >= 0"),
    ("demo-out-is-file", ["demo", "--out", "{w}/doc.txt"], "is a file, not a folder"),
    ("demo-out-under-file", ["demo", "--out", "{w}/doc.txt/d"], "is a file, not a folder"),
    ("demo-unknown-flag", ["demo", "--fast"], "No such option"),
    # the command line itself
    ("unknown-command", ["nosuch"], "No such command"),
]


@pytest.mark.parametrize("args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(args, message, world, tiny_model_dir, capsys):
    before = _digests(world, Path(tiny_model_dir))
    argv = [a.replace("{w}", str(world)).replace("{m}", str(tiny_model_dir)) for a in args]
    code = run(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], (out, err)
    assert "Traceback" not in out + err
    assert _digests(world, Path(tiny_model_dir)) == before
    assert not [p for p in world.rglob("*.tmp")]


def test_at_least_sixty_cases_over_every_command():
    commands = {c[1][0] if c[1][0] != "data" else c[1][1] for c in CASES}
    assert len(CASES) >= 60
    assert {"ask", "eval", "train", "ruler-hqa", "ruler", "toy", "flops", "tiny-model", "demo"} <= commands


def test_an_os_error_the_user_can_fix_is_one_line(monkeypatch, capsys):
    import errno

    import memagent.cli.ask

    def disk_full(_options):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.jsonl")

    monkeypatch.setattr(memagent.cli.ask, "run_ask", disk_full)
    code = run(["ask", "--model", "m", "--document", "d", "--question", "q"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == ("error: /data/out.jsonl: no space left on the device; free some space "
                                         "or write elsewhere")


def test_a_bug_shows_its_traceback_and_asks_to_report_it(monkeypatch, capsys):
    import memagent.cli.ask

    def broken(_options):
        raise KeyError("internal")

    monkeypatch.setattr(memagent.cli.ask, "run_ask", broken)
    code = run(["ask", "--model", "m", "--document", "d", "--question", "q"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" in err and "KeyError: 'internal'" in err
    assert err.strip().splitlines()[-1].startswith("memagent hit an internal error") and "report" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_a_write_protected_folder_is_refused_before_any_work(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code = run(["data", "toy", "--chunks", "2", "--samples", "1", "--out", str(locked / "o.jsonl")])
    finally:
        locked.chmod(0o755)
    assert code == 2 and "permission denied" in capsys.readouterr().err


def test_one_table_of_bad_inputs_over_every_command_and_the_service():
    """The round-3 classes keep their cases in tests/test_bad_inputs_*.py (one CASES table each, same shape as
    CASES above); together they are one table: unique ids, every command and `serve` covered."""
    import importlib

    tables = {"commands": CASES}
    for name in ("text", "paths", "serve", "models"):
        try:
            tables[name] = importlib.import_module(f"test_bad_inputs_{name}").CASES
        except ModuleNotFoundError:
            continue
    every = [case for table in tables.values() for case in table]
    ids = [case[0] for case in every]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    commands = {c[1][0] if c[1][0] != "data" else c[1][1] for c in every}
    assert {"ask", "eval", "train", "ruler-hqa", "ruler", "toy", "flops", "tiny-model", "demo", "serve", "report"} <= commands
    assert len(every) >= 150

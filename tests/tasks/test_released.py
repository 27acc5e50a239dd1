"""Released data formats: read into the same samples as our JSONL, expanded to the same text, errors named."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from typer.testing import CliRunner

from memagent.cli import app
from memagent.tasks.schema import DataError, file_sha256, read_samples, sample_document, write_samples

runner = CliRunner()
QUESTIONS = (3, 7, 11)


def _table(hotpot_file) -> list[str]:
    """The official paragraph set, built here apart from our loader: sorted distinct "title\\ntext"."""
    data = json.loads(hotpot_file.read_text())
    return sorted({f"{t}\n{''.join(s)}" for d in data for t, s in d["context"]})


def _doc_ids(q: int, n: int) -> list[int]:
    return [(q * 37 + 11 * k) % 600 for k in range(n)]  # any fixed paragraph choice


def _text(table: list[str], ids: list[int]) -> str:
    return "\n\n".join(f"Document {i + 1}:\n{table[d]}" for i, d in enumerate(ids))


def _eval_records(hotpot_file, num_docs: int, as_index: bool) -> list[dict]:
    data, table = json.loads(hotpot_file.read_text()), _table(hotpot_file)
    recs = []
    for q in QUESTIONS:
        ids = _doc_ids(q, num_docs)
        recs.append({"context": ids if as_index else _text(table, ids), "input": data[q]["question"],
                     "answers": [data[q]["answer"]], "num_docs": num_docs, "index": q})
    return recs


def _our_samples(hotpot_file, num_docs: int, as_index: bool) -> list[dict]:
    data, table = json.loads(hotpot_file.read_text()), _table(hotpot_file)
    out = []
    for q in QUESTIONS:
        ids = _doc_ids(q, num_docs)
        s = {"id": f"ruler_hqa-docs{num_docs}-{q}", "task": "ruler_hqa", "question": data[q]["question"],
             "answers": [data[q]["answer"]], "metric": "sub_em", "length": num_docs, "length_unit": "docs",
             "num_docs": num_docs, "num_tokens": None, "tokenizer": None, "source_id": str(q)}
        if as_index:
            s["lazy"] = {"kind": "paragraphs", "format": "hotpotqa", "source": str(hotpot_file.resolve()),
                         "sha256": file_sha256(hotpot_file), "doc_ids": ids}
        else:
            s["context"] = _text(table, ids)
        out.append(s)
    return out


def _same(released: list[dict], ours_path, hotpot_file) -> None:
    ours = list(read_samples(ours_path))
    assert len(released) == len(ours) == len(QUESTIONS)
    table = _table(hotpot_file)
    for r, o in zip(released, ours):
        assert r == o  # field by field
        doc = sample_document(r)
        text = doc if isinstance(doc, str) else "".join(doc)
        q = int(r["source_id"])
        assert text == _text(table, _doc_ids(q, r["num_docs"]))  # the documents the official scripts build


@pytest.mark.parametrize("as_index", [False, True])
def test_hotpotqa_eval_file_reads_as_our_samples(hotpot_file, tmp_path, as_index):
    eval_file = tmp_path / "eval_20.json"
    eval_file.write_text(json.dumps(_eval_records(hotpot_file, 20, as_index), indent=4))
    ours = tmp_path / "ours.jsonl"
    write_samples(_our_samples(hotpot_file, 20, as_index), ours)
    released = list(read_samples(eval_file, source=hotpot_file if as_index else None))
    _same(released, ours, hotpot_file)
    if as_index:
        assert "context" not in released[0] and len(released[0]["lazy"]["doc_ids"]) == 20


def test_index_file_needs_its_source(hotpot_file, tmp_path):
    eval_file = tmp_path / "eval_12800.json"
    eval_file.write_text(json.dumps(_eval_records(hotpot_file, 30, True)))
    with pytest.raises(DataError, match=r"record 0, field 'context'.*--source HOTPOT_DEV.json"):
        list(read_samples(eval_file))
    shutil.copy(hotpot_file, tmp_path / "hotpotqa_dev.json")  # the official layout: the dev file beside it
    sample = next(read_samples(eval_file))
    assert sample["lazy"]["source"] == str((tmp_path / "hotpotqa_dev.json").resolve())


def test_data_import_writes_lazy_jsonl(hotpot_file, tmp_path):
    eval_file = tmp_path / "eval_12800.json"
    eval_file.write_text(json.dumps(_eval_records(hotpot_file, 40, True)))
    out = tmp_path / "imported.jsonl"
    result = runner.invoke(app, ["data", "import", str(eval_file), "--source", str(hotpot_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "as hotpotqa-eval, json-array; wrote 3 samples" in result.output
    ours = tmp_path / "ours.jsonl"
    write_samples(_our_samples(hotpot_file, 40, True), ours)
    _same(list(read_samples(out)), ours, hotpot_file)
    bad = runner.invoke(app, ["data", "import", str(eval_file), "--out", str(eval_file)])
    assert isinstance(bad.exception, DataError) and "is the file being imported" in str(bad.exception)
    bad = runner.invoke(app, ["data", "import", str(tmp_path / "nope.json"), "--out", str(out)])
    assert isinstance(bad.exception, DataError) and "nope.json does not exist" in str(bad.exception)


def _verl_rows(hotpot_file) -> list[dict]:
    return [{"data_source": "hotpotqa", "prompt": [{"role": "user", "content": r["input"]}],
             "context": r["context"], "ability": "memory",
             "reward_model": {"style": "rule", "ground_truth": r["answers"]},
             "extra_info": {"index": r["index"], "question": r["input"], "num_docs": r["num_docs"]}}
            for r in _eval_records(hotpot_file, 20, False)]


def _write_parquet(rows: list[dict], path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)  # several row groups


def test_training_parquet_reads_as_our_samples(hotpot_file, tmp_path):
    pq_file = tmp_path / "hotpotqa_dev.parquet"
    _write_parquet(_verl_rows(hotpot_file), pq_file)
    ours = tmp_path / "ours.jsonl"
    write_samples(_our_samples(hotpot_file, 20, False), ours)
    _same(list(read_samples(pq_file)), ours, hotpot_file)


def test_ruler_files(tmp_path, hotpot_file):
    # the official MemAgent RULER file: a JSON array named eval_{task}_{length}.json, context apart from input
    memagent_style = tmp_path / "eval_niah_single_1_4096.json"
    memagent_style.write_text(json.dumps([
        {"index": 0, "input": "What is the number for blue?", "context": "hay. blue is 42. hay.",
         "outputs": ["42"], "answer_prefix": ""},
        {"index": 1, "input": "What is the number for red?", "context": "hay. red is 7.", "outputs": ["7"],
         "answer_prefix": ""}]))
    a, b = read_samples(memagent_style)
    assert (a["id"], a["task"], a["length"], a["length_unit"], a["metric"]) == (
        "niah_single_1-4096-0", "niah_single_1", 4096, "tokens", "string_match_all")
    assert a["question"] == "What is the number for blue?" and a["context"] == "hay. blue is 42. hay."
    assert b["answers"] == ["7"]
    # RULER's own JSONL: the prompt holds the document, `query` is the question
    own = tmp_path / "qa_2" / "validation.jsonl"
    own.parent.mkdir()
    own.write_text(json.dumps({"index": 5, "input": "Doc: Paris is in France.\nQ: Where is Paris?",
                               "query": "Where is Paris?", "outputs": ["France"], "length": 900}) + "\n")
    (s,) = read_samples(own)
    assert (s["task"], s["metric"], s["question"], s["length"]) == ("qa_2", "sub_em", "Where is Paris?", 900)
    assert s["context"].startswith("Doc: Paris")


def test_longbench_metric_per_dataset(tmp_path):
    path = tmp_path / "longbench.jsonl"
    recs = [{"input": "Summarise.", "context": "a long report", "answers": ["short summary"], "length": 3,
             "dataset": "gov_report", "language": "en", "all_classes": None, "_id": "g1"},
            {"input": "Which?", "context": "paper text", "answers": ["this one"], "length": 2,
             "dataset": "qasper", "language": "en", "all_classes": None, "_id": "q1"},
            {"input": "Summarise the chat.", "context": "A: hi", "answers": ["greeting"], "length": 2,
             "dataset": "samsum_e", "language": "en", "all_classes": None, "_id": "s1"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    g, q, s = read_samples(path)
    assert (g["task"], g["metric"], g["id"]) == ("longbench_gov_report", "rouge_l_longbench", "g1")
    assert (q["task"], q["metric"]) == ("longbench_qasper", "qa_f1")
    assert (s["task"], s["metric"]) == ("longbench_samsum", "rouge_l_longbench_first_line")
    path.write_text(json.dumps({**recs[0], "dataset": "lcc"}) + "\n")
    with pytest.raises(DataError, match=r"longbench.jsonl:1, field 'dataset'.*no scorer"):
        list(read_samples(path))


# ---------------------------------------------------------------- malformed records name file, index, field
def _eval_bad(tmp_path, hotpot_file, field, value):
    recs = _eval_records(hotpot_file, 20, False)
    recs[1][field] = value
    path = tmp_path / "eval_20.json"
    path.write_text(json.dumps(recs))
    return path


@pytest.mark.parametrize("field, value, says", [
    ("answers", "Paris", "must be a non-empty list"),
    ("answers", [], "must be a non-empty list"),
    ("answers", ["ok", 3], "answers must be strings"),
    ("input", 17, "must be a string"),
    ("context", [1, -2], "document text or a list of paragraph indices"),
    ("num_docs", "20", "must be an integer"),
])
def test_malformed_eval_record(tmp_path, hotpot_file, field, value, says):
    path = _eval_bad(tmp_path, hotpot_file, field, value)
    with pytest.raises(DataError) as err:
        list(read_samples(path))
    assert f"{path}: record 1, field {field!r}" in str(err.value) and says in str(err.value)


def test_malformed_parquet_row(tmp_path, hotpot_file):
    rows = _verl_rows(hotpot_file)
    rows[2]["reward_model"]["ground_truth"] = []
    path = tmp_path / "bad.parquet"
    _write_parquet(rows, path)
    with pytest.raises(DataError, match=r"bad.parquet: row 2, field 'reward_model.ground_truth': must be a non-empty"):
        list(read_samples(path))
    rows = _verl_rows(hotpot_file)
    rows[1]["prompt"] = []
    _write_parquet(rows, path)
    with pytest.raises(DataError, match=r"row 1, field 'prompt\[0\].content': missing"):
        list(read_samples(path))


def test_malformed_ruler_and_jsonl_records(tmp_path):
    path = tmp_path / "eval_vt_4096.json"
    path.write_text(json.dumps([{"index": 0, "input": "q", "context": "c", "outputs": ["x"]},
                                {"index": 1, "input": "q", "context": "c"}]))
    with pytest.raises(DataError, match=r"eval_vt_4096.json: record 1, field 'outputs': missing"):
        list(read_samples(path))
    own = tmp_path / "validation.jsonl"
    own.write_text(json.dumps({"index": 0, "input": "prompt", "outputs": ["x"]}) + "\n")
    with pytest.raises(DataError, match=r"validation.jsonl:1, field 'query': missing"):
        list(read_samples(own))
    ours = tmp_path / "ours.jsonl"
    good = {"id": "a", "task": "t", "question": "q?", "answers": ["x"], "context": "c"}
    for change, says in [({"question": 5}, r"ours.jsonl:2, field 'question': must be a string"),
                         ({"answers": ["x", None]}, r"ours.jsonl:2, field 'answers': answers must be strings"),
                         ({"context": ["c"]}, r"ours.jsonl:2, field 'context'"),
                         ({"metric": "bleu"}, r"ours.jsonl:2, field 'metric': unknown metric 'bleu'"),
                         ({"id": "a"}, r"sample id 'a' of record 1 repeats record 0")]:
        ours.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", **change}) + "\n")
        with pytest.raises(DataError, match=says):
            list(read_samples(ours))


def test_truncated_json_array_and_unknown_format(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[{"context": "c", "input": "q", "answers": ["a"], "num_docs": 1, "index": 0}, {"context": ')
    with pytest.raises(DataError, match=r"cut.json: not valid JSON at or after record 1"):
        list(read_samples(path))
    path.write_text(json.dumps([{"text": "x"}]))
    with pytest.raises(DataError, match=r"record 0: record with fields \['text'\] is in none of the known formats"):
        list(read_samples(path))


# ---------------------------------------------------------------- memory: flat in the number of documents
_RSS_SCRIPT = r"""
import json, sys
from memagent.tasks.schema import ParagraphCache, file_sha256, read_samples, sample_document

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
data, source, join = sys.argv[1], sys.argv[2], sys.argv[3] == "join"
cache = ParagraphCache()
cache("hotpotqa", source, file_sha256(source))  # the paragraph table is loaded once, the same for any file
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # reset the peak: from here on only reading and expanding the samples counts
base = status("VmRSS")
chars = docs = 0
for s in read_samples(data, source):
    doc = sample_document(s, cache)
    if join:  # the negative control: hold a whole document
        doc = ["".join(doc)]
    for block in doc:
        chars += len(block)
    docs += s["num_docs"]
print(json.dumps({"peak": status("VmHWM"), "growth": status("VmHWM") - base, "chars": chars, "docs": docs}))
"""


def _rss(data, source, join=False) -> dict:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(data), str(source), "join" if join else "stream"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_25600_document_index_file_reads_with_flat_memory(tmp_path):
    from qa_fixtures import make_hotpot

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak RSS")
    source = tmp_path / "hotpotqa_dev.json"
    source.write_text(json.dumps(make_hotpot(2600, seed=2, sentences=8)))  # 26,000 paragraphs of ~400 chars
    files = {}
    for n in (2560, 25600):
        files[n] = tmp_path / f"eval_{n}.json"
        files[n].write_text(json.dumps([{"context": [(q * 7919 + 13 * k) % 26000 for k in range(n)],
                                         "input": f"question {q}?", "answers": ["x"], "num_docs": n, "index": q}
                                        for q in range(3)]))
    small, large = _rss(files[2560], source), _rss(files[25600], source)
    assert large["docs"] == 3 * 25600 and large["chars"] > 9 * small["chars"] > 9 * 2560 * 300
    assert large["peak"] <= 1.1 * small["peak"], (small, large)
    assert large["growth"] <= 8 * 2**20, large  # the sample's 25,600 indices, never its ~11 MB of text
    held = _rss(files[25600], source, join=True)  # the same check fails for a reader that holds a document
    assert held["growth"] > 8 * 2**20, held


class _KeyReader:
    """A scripted model that answers \\boxed{X} when the prompt shows "The key of item N is X." for
    the asked item N (the hotpot fixtures' gold fact), else \\boxed{unknown}."""

    max_window = 1_000_000

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def prompt_length(self, prompt):
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):
        from memagent.backends.base import Generation

        out = []
        for p in prompts:
            item = re.search(r"What is the key of item (\d+) named", p).group(1)
            fact = re.search(rf"The key of item {item} is (\w+)\.", p)
            text = f"\\boxed{{{fact.group(1) if fact else 'unknown'}}}"
            out.append(Generation(text=text, token_ids=self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        return out


def test_eval_reads_released_files_directly(hotpot_file, tokenizer, tmp_path):
    from memagent.config import AgentConfig
    from memagent.eval.sweep import SweepConfig, run_sweep

    data, table = json.loads(hotpot_file.read_text()), _table(hotpot_file)
    folder = tmp_path / "released"
    folder.mkdir()
    shutil.copy(hotpot_file, folder / "hotpotqa_dev.json")  # index contexts find their source beside them
    recs = []
    for q in QUESTIONS:  # 30 documents; the gold fact's paragraph is in them for questions 3 and 7 only
        gold = table.index(f"Topic {q}-1\n{''.join(data[q]['context'][1][1])}")
        ids = [d for d in _doc_ids(q, 30) if d != gold][:29]
        ids.insert(q % 29, gold if q != 11 else ids[0] + 1)
        recs.append({"context": ids, "input": data[q]["question"], "answers": [data[q]["answer"]],
                     "num_docs": 30, "index": q})
    (folder / "eval_12800.json").write_text(json.dumps(recs))
    rows = [{"data_source": "hotpotqa", "prompt": [{"role": "user", "content": r["input"]}],
             "context": _text(table, r["context"]), "reward_model": {"ground_truth": r["answers"]},
             "extra_info": {"index": r["index"], "num_docs": 30}} for r in recs]  # the same documents as text
    _write_parquet(rows, folder / "hotpotqa_dev.parquet")
    cfg = SweepConfig("reader", methods=["full-context"], agent=AgentConfig(answer_tokens=16, max_batch_docs=2))
    results = run_sweep(_KeyReader(tokenizer), [folder / "eval_12800.json", folder / "hotpotqa_dev.parquet"],
                        tmp_path / "run", cfg)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    for name in ("eval_12800.json", "hotpotqa_dev.parquet"):
        scores = {r["sample_id"]: r["score"] for r in records if r["data"] == name}
        assert scores == {"ruler_hqa-docs30-3": 1.0, "ruler_hqa-docs30-7": 1.0, "ruler_hqa-docs30-11": 0.0}
    assert {r["task"] for r in records} == {"ruler_hqa"} and {r["metric"] for r in records} == {"sub_em"}


def test_ruler_index_contexts_into_squad(squad_file, tmp_path):
    squad = json.loads(squad_file.read_text())
    table = sorted({p["context"] for art in squad["data"] for p in art["paragraphs"]})  # the official set
    path = tmp_path / "eval_qa_1_4000000.json"
    path.write_text(json.dumps([{"index": 0, "input": "What is the code of place 2-1?", "context": [5, 0, 17],
                                 "outputs": ["x"], "answer_prefix": ""}]))
    (s,) = read_samples(path, source=squad_file)
    assert (s["task"], s["metric"], s["length"], s["lazy"]["format"]) == ("qa_1", "sub_em", 4000000, "squad")
    expected = "\n\n".join(f"Document {i + 1}:\n{table[d]}" for i, d in enumerate([5, 0, 17]))
    assert "".join(sample_document(s)) == expected


def test_index_expansion_needs_only_the_paragraphs(hotpot_file, tmp_path):
    data = json.loads(hotpot_file.read_text())
    data[0]["supporting_facts"] = [["Nowhere", 0]]  # our synthesis refuses this entry; the official reader does not
    data[1].pop("answer")
    source = tmp_path / "hotpotqa_dev.json"
    source.write_text(json.dumps(data))
    eval_file = tmp_path / "eval_12800.json"
    eval_file.write_text(json.dumps(_eval_records(hotpot_file, 25, True)))
    table = _table(hotpot_file)
    for s in read_samples(eval_file):
        assert "".join(sample_document(s)) == _text(table, _doc_ids(int(s["source_id"]), 25))


def test_a_record_without_task_reads_as_qa_through_every_reader(tmp_path):
    from memagent.tasks.schema import read_samples

    path = tmp_path / "train.jsonl"
    path.write_text('{"id": 1, "question": "q?", "answers": ["a"], "context": "text"}\n'
                    '{"id": 2, "question": "q?", "answers": ["a"], "context": "text", "task": "niah_single_1"}\n')
    assert [s["task"] for s in read_samples(path)] == ["qa", "niah_single_1"]

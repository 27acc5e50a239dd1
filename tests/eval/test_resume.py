"""The eval bookkeeping on a scripted backend: keys and fingerprints (resume that cannot mix settings),
failures isolated, --retry-failed, --max-failures, --rescore, repeats with mean ± stderr, one run per --out,
summary.json, toy files, escaped names."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from memagent.backends.base import BackendError, Generation
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig
from memagent.errors import MemAgentError
from memagent.eval.baselines import EvalError
from memagent.eval.records import load_records
from memagent.eval.report import write_report
from memagent.eval.scoring import ScoreOptions
from memagent.cli.eval_command import EvalOptions, run_eval, sweep_config
from memagent.eval.sweep import SweepConfig, plan, run_sweep
from memagent.flags import BudgetOptions
from memagent.lock import RunLockedError
from memagent.tasks.schema import file_sha256, write_samples

ITEMS = {3: "zebra", 5: "otter", 8: "heron"}  # sample i asks for item k, whose key is the value


def _samples(ids=(3, 5, 8), task="kv"):
    return [dict(id=f"s{k}", task=task, question=f"What is the key of item {k}?", answers=[ITEMS[k]],
                 context=f"Some words here. The key of item {k} is {ITEMS[k]}. More words there.",
                 length=2, length_unit="docs", metric="sub_em") for k in ids]


class Scripted:
    """Copies "The key of item N is X." into its memory and boxes X at the end; counts its calls.

    fail_on: a reply to a prompt holding this text raises BackendError (a server that gave up).
    wrong_seeds: a final answer whose repeat seed (params.seed // 1_000_003) is in it is boxed wrong.
    """

    max_window = 100_000

    def __init__(self, tokenizer, fail_on=None, wrong_seeds=()):
        self.tokenizer, self.fail_on, self.wrong_seeds, self.calls = tokenizer, fail_on, set(wrong_seeds), 0

    def prompt_length(self, prompt):
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):
        self.calls += len(prompts)
        if self.fail_on and any(self.fail_on in p for p in prompts):
            raise BackendError("the server gave up after 5 tries: HTTP 500")
        out = []
        for p in prompts:
            item = re.search(r"key of item (\d+)", p).group(1)
            fact = re.search(rf"The key of item {item} is (\w+)\.", p)
            if "Updated memory:" in p:
                text = f"The key of item {item} is {fact.group(1)}." if fact else "nothing yet"
            elif (params.seed or 0) // 1_000_003 in self.wrong_seeds:
                text = "\\boxed{wrong}"
            else:
                text = f"\\boxed{{{fact.group(1)}}}" if fact else "\\boxed{unknown}"
            out.append(Generation(text=text, token_ids=[1, 2], prompt_token_ids=None))
        return out


def _cfg(**kw) -> SweepConfig:
    agent = AgentConfig(chunk_tokens=80, memory_tokens=32, answer_tokens=16, query_tokens=64, max_batch_docs=3)
    return dataclasses.replace(SweepConfig("scripted", methods=["memagent"], agent=agent), **kw)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data" / "kv.jsonl"
    write_samples(_samples(), path)
    return path


def _records(out):
    return load_records(out / "results.jsonl")


def test_changed_setting_computes_anew_and_an_identical_rerun_makes_no_call(tokenizer, data, tmp_path):
    backend = Scripted(tokenizer)
    run_sweep(backend, [data], tmp_path / "out", _cfg())
    first = backend.calls
    assert first == 6 and len(_records(tmp_path / "out")) == 3  # 3 samples x (1 chunk + final)
    run_sweep(backend, [data], tmp_path / "out", _cfg())
    assert backend.calls == first  # identical rerun: nothing asked
    batch = _cfg(agent=dataclasses.replace(_cfg().agent, max_batch_docs=1))
    run_sweep(backend, [data], tmp_path / "out", dataclasses.replace(batch, limit=5, scoring=ScoreOptions("first")))
    assert backend.calls == first  # batch size, limit and scoring do not change a reply
    more_memory = _cfg(agent=dataclasses.replace(_cfg().agent, memory_tokens=33))
    run_sweep(backend, [data], tmp_path / "out", more_memory)
    assert backend.calls == 2 * first and len(_records(tmp_path / "out")) == 6  # --memory-tokens: anew
    assert len({r["fingerprint"] for r in _records(tmp_path / "out")}) == 2
    data.write_text(data.read_text() + "\n")  # the same file regenerated with other bytes
    run_sweep(backend, [data], tmp_path / "out", more_memory)
    assert backend.calls == 3 * first
    _, keys = plan(more_memory, [data])  # the table shows this run's records only
    text, _, _ = write_report(tmp_path / "out" / "results.jsonl", tmp_path / "out", keys=keys)
    assert "| scripted | memagent | 100.00 ± 0.00 (n=3) |" in text
    text, _, _ = write_report(tmp_path / "out" / "results.jsonl", tmp_path / "out")  # all: one row per setting
    rows = re.findall(r"\| scripted \| memagent @([0-9a-f]{8}) \| 100.00 ± 0.00 \(n=(\d)\) \|", text)
    assert sorted(n for _, n in rows) == ["3", "6"] and len({fp for fp, _ in rows}) == 2


def test_same_name_files_in_two_folders_are_both_evaluated(tokenizer, data, tmp_path):
    other = tmp_path / "other" / "kv.jsonl"
    other.parent.mkdir()
    other.write_bytes(data.read_bytes())  # same name, same bytes, another folder
    backend = Scripted(tokenizer)
    run_sweep(backend, [data, other, data], tmp_path / "out", _cfg())  # a file given twice runs once
    recs = _records(tmp_path / "out")
    assert len(recs) == 6 and len({r["key"] for r in recs}) == 6 and backend.calls == 12
    assert {r["data_path"] for r in recs} == {str(data.resolve()), str(other.resolve())}
    assert {r["data_sha256"] for r in recs} == {file_sha256(data)}


def test_duplicate_ids_are_refused_before_any_model_call(tokenizer, tmp_path):
    path = tmp_path / "dup.jsonl"
    write_samples(_samples((3, 5)) + _samples((3,)), path)
    backend = Scripted(tokenizer)
    # the sample reader refuses it first (tasks/schema.py), naming the file, the id and both records
    with pytest.raises(MemAgentError, match=r"dup.jsonl: sample id 's3' of record 2 repeats record 0"):
        run_sweep(backend, [path], tmp_path / "out", _cfg())
    assert backend.calls == 0


def test_a_failing_sample_is_recorded_while_the_others_finish(tokenizer, data, tmp_path):
    out = tmp_path / "out"
    broken = Scripted(tokenizer, fail_on="item 5")
    run_sweep(broken, [data], out, _cfg())  # the group of 3 fails, then each sample alone
    recs = {r["sample_id"]: r for r in _records(out)}
    assert [recs[s]["status"] for s in ("s3", "s5", "s8")] == ["ok", "error", "ok"]
    assert recs["s5"]["error"] == dict(kind="BackendError", message="the server gave up after 5 tries: HTTP 500",
                                       attempts=1)
    assert recs["s5"]["score"] == 0.0 and recs["s3"]["score"] == recs["s8"]["score"] == 1.0
    text, _, _ = write_report(out / "results.jsonl", out)
    assert "| scripted | memagent | 66.67 ± 33.33 (n=3) |" in text  # [1, 0, 1] counted wrong
    assert "failed samples (counted as wrong): memagent 1" in text
    calls = broken.calls
    run_sweep(broken, [data], out, _cfg())  # a plain rerun leaves the error record alone
    assert broken.calls == calls
    run_sweep(broken, [data], out, _cfg(), retry_failed=True)  # still broken: a second attempt recorded
    assert _records(out)[-1]["error"]["attempts"] == 2
    skip = _cfg(scoring=ScoreOptions(failed="skip"))
    run_sweep(broken, [data], out, skip)  # only rescored: the failure leaves the mean
    text, _, _ = write_report(out / "results.jsonl", out)
    assert "| scripted | memagent | 100.00 ± 0.00 (n=2) |" in text and "left out of the means" in text
    healed = Scripted(tokenizer)
    run_sweep(healed, [data], out, skip, retry_failed=True)
    assert healed.calls == 2  # only s5 again
    text, _, _ = write_report(out / "results.jsonl", out)
    assert "| scripted | memagent | 100.00 ± 0.00 (n=3) |" in text and "failed" not in text


def test_max_failures_stops_with_a_summary(tokenizer, tmp_path):
    path = tmp_path / "kv.jsonl"
    write_samples(_samples(), path)
    broken = Scripted(tokenizer, fail_on="key of item")  # every sample fails
    cfg = _cfg(agent=dataclasses.replace(_cfg().agent, max_batch_docs=1))
    with pytest.raises(EvalError, match=r"stopped after 2 failed sample\(s\) \(--max-failures 2\).*"
                                        r"sample 's5'.*results.jsonl; fix the cause and rerun with --retry-failed"):
        run_sweep(broken, [path], tmp_path / "out", cfg, max_failures=2)
    assert [r["sample_id"] for r in _records(tmp_path / "out")] == ["s3", "s5"]


def _options(data, out, **kw) -> EvalOptions:
    return EvalOptions(model="scripted", data=[str(data)], out=str(out), methods=["memagent"],
                       budgets=BudgetOptions(chunk_tokens=80, memory_tokens=32, answer_tokens=16, query_tokens=64),
                       batch_docs=3, progress=False, **kw)


def test_rescore_equals_the_first_scores_without_a_model(tokenizer, tmp_path):
    data = tmp_path / "kv.jsonl"
    samples = _samples()
    samples[1]["answers"] = ["badger", "otter"]  # s5: right against all golds, wrong against the first
    write_samples(samples, data)
    o = _options(data, tmp_path / "out")
    backend = Scripted(tokenizer)
    run_sweep(backend, [data], o.out, sweep_config(o))
    before = _records(tmp_path / "out")
    # "scripted" is no model: loading it would fail, so a rescore that works loaded nothing
    table = run_eval(dataclasses.replace(o, rescore=True))
    after = _records(tmp_path / "out")
    assert [(r["score"], r["scores"], r["prediction"]) for r in after] == \
           [(r["score"], r["scores"], r["prediction"]) for r in before]
    assert "| scripted | memagent | 100.00 ± 0.00 (n=3) |" in table
    table = run_eval(dataclasses.replace(o, rescore=True, golds="first",
                                         backend=BackendOptions(base_url="http://me:secret@h:8000/v1?k=s")))
    assert [r["score"] for r in _records(tmp_path / "out")] == [1.0, 0.0, 1.0]
    assert "| scripted | memagent | 66.67 ± 33.33 (n=3) |" in table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["model"] == "scripted" and summary["data"][0]["sha256"] == file_sha256(data)
    assert summary["records"] == dict(planned=3, finished=3, failed=0, missing=0)
    assert set(summary["versions"]) == {"memagent", "torch", "transformers", "python"}
    assert summary["settings"]["options"]["golds"] == "first" and summary["settings"]["sweep"]["repeats"] == 1
    assert summary["settings"]["options"]["backend"]["base_url"] == "http://h:8000/v1" and "secret" not in json.dumps(summary)
    assert summary["git_revision"] is None or re.fullmatch(r"[0-9a-f]{40}", summary["git_revision"])
    assert backend.calls == 6


def test_repeats_give_mean_and_stderr_the_same_for_the_same_seeds(tokenizer, data, tmp_path):
    tables = []
    for run in ("a", "b"):
        backend = Scripted(tokenizer, wrong_seeds={1, 3})  # repeat 1 (seed 0 + 1) answers wrong
        results = run_sweep(backend, [data], tmp_path / run, _cfg(repeats=3))
        tables.append(write_report(results, tmp_path / run)[0])
        assert backend.calls == 3 * 6
    recs = _records(tmp_path / "a")
    assert sorted({(r["repeat"], r["seed"]) for r in recs}) == [(0, 0), (1, 1), (2, 2)]
    # per sample [1, 0, 1]; 9 values, 6 ones: mean 2/3, variance (6 (1/3)^2 + 3 (2/3)^2) / 8 = 1/4, se 1/6
    assert "| scripted | memagent | 66.67 ± 16.67 (n=9) |" in tables[0]
    assert tables[0] == tables[1]
    backend = Scripted(tokenizer, wrong_seeds={1, 3})
    run_sweep(backend, [data], tmp_path / "a", _cfg(repeats=4))  # one more repeat: only it runs
    assert backend.calls == 6
    shifted = _cfg(repeats=3, agent=dataclasses.replace(_cfg().agent, seed=1))  # seeds 1, 2, 3: [0, 1, 0]
    results = run_sweep(Scripted(tokenizer, wrong_seeds={1, 3}), [data], tmp_path / "c", shifted)
    assert "| scripted | memagent | 33.33 ± 16.67 (n=9) |" in write_report(results, tmp_path / "c")[0]


def test_a_second_eval_on_one_out_is_refused(tokenizer, data, tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from memagent.lock import run_lock\n"
         f"with run_lock({str(out)!r}, 'eval'):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        backend = Scripted(tokenizer)
        with pytest.raises(RunLockedError, match="another eval is writing to"):
            run_sweep(backend, [data], out, _cfg())
        cli = subprocess.run([sys.executable, "-m", "memagent.cli", "eval", "--model", "none", "--data", str(data),
                              "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 2 and "Traceback" not in cli.stderr
        assert cli.stderr.strip().splitlines() == [cli.stderr.strip()] and "another eval" in cli.stderr
        assert backend.calls == 0 and not (out / "results.jsonl").exists()
    finally:
        holder.communicate("", timeout=30)
    run_sweep(backend, [data], out, _cfg())  # the lock is gone with its holder
    assert len(_records(out)) == 3


def test_toy_files_evaluate_and_plot(tokenizer, tmp_path):
    from memagent.tasks.toy import ToySpec, iter_samples

    path = tmp_path / "toy.jsonl"
    write_samples(iter_samples(ToySpec(), [1, 2], 2, 0), path)  # what `memagent data toy --chunks 1,2` writes

    class Boxer(Scripted):
        def generate(self, prompts, params):
            self.calls += len(prompts)
            return [Generation(text="noted" if "Updated memory:" in p else "\\boxed{v1}") for p in prompts]

    cfg = _cfg(methods=["memagent", "full-context"], window=4000)
    results = run_sweep(Boxer(tokenizer), [path], tmp_path / "out", cfg)
    recs = _records(tmp_path / "out")
    assert len(recs) == 8 and {(r["length"], r["length_unit"], r["metric"]) for r in recs} == \
           {(1, "chunks", "exact_match"), (2, "chunks", "exact_match")}
    text, _, plots = write_report(results, tmp_path / "out")
    assert "| model | method | 1 chunks | 2 chunks |" in text
    assert [p.name for p in plots] == ["scores_toy.png"] and plots[0].read_bytes()[:4] == b"\x89PNG"


def test_markdown_and_html_in_names_are_escaped(tokenizer, tmp_path):
    path = tmp_path / "evil.jsonl"
    samples = _samples((3,), task="<img src=x>|**$x$**")
    del samples[0]["length"]  # no length at all: one column, "all"
    write_samples(samples, path)
    results = run_sweep(Scripted(tokenizer), [path], tmp_path / "out", _cfg(model_name="m_<b>|"))
    text, _, plots = write_report(results, tmp_path / "out")
    assert "### &lt;img src=x&gt;\\|\\*\\*$x$\\*\\* (sub\\_em, %)" in text
    assert "| m\\_&lt;b&gt;\\| | memagent | 100.00 (n=1) |" in text
    assert "<img" not in text and "<b>" not in text and "| model | method | all |" in text
    assert plots == []  # nothing to plot against length


def test_a_sample_whose_document_cannot_be_read_is_an_error_record(tokenizer, tmp_path):
    samples = _samples()
    del samples[0]["context"]  # s3: a lazy sample whose source file is gone
    samples[0]["lazy"] = dict(kind="paragraphs", format="hotpotqa", source=str(tmp_path / "gone.json"),
                              sha256="0" * 64, doc_ids=[0])
    path = tmp_path / "kv.jsonl"
    write_samples(samples, path)
    backend = Scripted(tokenizer)
    run_sweep(backend, [path], tmp_path / "out", _cfg(methods=["memagent", "full-context"], window=4000))
    recs = _records(tmp_path / "out")
    assert [(r["method"], r["sample_id"], r["status"]) for r in recs if r["status"] == "error"] == \
           [("memagent", "s3", "error"), ("full-context", "s3", "error")]
    err = recs[0]["error"] if recs[0]["status"] == "error" else next(r["error"] for r in recs if r["status"] == "error")
    assert err["kind"] == "DataError" and "gone.json is missing" in err["message"] and err["attempts"] == 1
    assert sum(r["status"] == "ok" and r["score"] == 1.0 for r in recs) == 4


@pytest.mark.parametrize("change, message", [
    (dict(limit=-5), "limit must be a positive integer, got -5"),
    (dict(window=0), "window must be a positive integer, got 0"),
    (dict(passage_tokens=0), "passage_tokens must be a positive integer"),
    (dict(repeats=0), "repeats must be a positive integer, got 0"),
    (dict(methods=[]), "unknown method"),
])
def test_nonsense_settings_are_refused(change, message):
    with pytest.raises(EvalError, match=re.escape(message)):
        _cfg(**change)


def test_no_data_file_and_a_missing_data_file_are_refused(tokenizer, tmp_path):
    with pytest.raises(EvalError, match="no data file given"):
        run_sweep(Scripted(tokenizer), [], tmp_path / "out", _cfg())
    with pytest.raises(EvalError, match=r"data file .*nope.jsonl does not exist"):
        run_sweep(Scripted(tokenizer), [tmp_path / "nope.jsonl"], tmp_path / "out", _cfg())


def test_a_window_no_sample_fits_stops_the_run_before_any_call(tokenizer, data, tmp_path):
    from memagent.agent.workflow import BudgetError

    backend = Scripted(tokenizer)
    with pytest.raises(EvalError, match="leaves no room for the document"):
        run_sweep(backend, [data], tmp_path / "a", _cfg(methods=["full-context"], window=20))
    backend.max_window = 100  # MemAgent's chunk 80 + memory 2 x 32 + query 64 + template: over 100
    with pytest.raises(BudgetError, match="the model's window is 100"):
        run_sweep(backend, [data], tmp_path / "b", _cfg())
    assert backend.calls == 0 and not (tmp_path / "a" / "results.jsonl").exists()


def test_samples_with_fields_of_the_wrong_type_are_refused_before_any_call(tokenizer, tmp_path):
    bad_length, bad_metric, bad_question, bad_answers = _samples((3,)), _samples((5,)), _samples((8,)), _samples()
    bad_length[0]["length"] = "2"
    bad_metric[0]["metric"] = "accuracy"
    bad_question[0]["question"] = 5
    bad_answers[2]["answers"] = [7]
    # the reader (tasks/schema.py) checks each field's type; the sweep adds what it needs (a numeric length)
    for name, samples, message in (("len.jsonl", bad_length, r"len.jsonl: sample 1 \(id 's3'\): its length"),
                                   ("met.jsonl", bad_metric, r"met.jsonl:1, field 'metric': unknown metric 'accuracy'"),
                                   ("q.jsonl", bad_question, r"q.jsonl:1, field 'question': must be a string"),
                                   ("a.jsonl", bad_answers, r"a.jsonl:3, field 'answers': answers must be strings")):
        write_samples(samples, tmp_path / name)
        backend = Scripted(tokenizer)
        with pytest.raises(MemAgentError, match=message):
            run_sweep(backend, [tmp_path / name], tmp_path / "out", _cfg())
        assert backend.calls == 0


def test_a_failed_rewrite_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    from memagent.eval.records import atomic_write_lines

    path = tmp_path / "results.jsonl"
    path.write_text("old\n")

    def lines():
        yield "new\n"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write_lines(path, lines())
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]
    atomic_write_lines(path, ["a\n", "b\n"])
    assert path.read_text() == "a\nb\n"


def test_a_task_name_matplotlib_would_parse_plots(tmp_path):
    from memagent.eval.report import plot_scores

    agg = {"$\\frac{a$|<b>": dict(metric="sub_em", unit="docs", lengths=[10, 20], failed={}, skipped=False,
                                  rows={("m$", "memagent"): {10: (0.5, 0.1, 4), 20: (0.6, None, 1)}})}
    (png,) = plot_scores(agg, tmp_path)
    assert png.name == "scores___frac_a___b_.png" and png.read_bytes()[:4] == b"\x89PNG"


def test_eval_writes_its_report_then_fails_with_the_count_of_failed_samples(tokenizer, data, tmp_path, monkeypatch):
    broken = Scripted(tokenizer, fail_on="item 5")
    monkeypatch.setattr("memagent.cli.eval_command.open_backend", lambda *a, **k: broken)
    o = _options(data, tmp_path / "out")
    with pytest.raises(EvalError, match=r"^1 of 3 samples failed; see the records with status \"error\" in .*"
                                        r"results.jsonl .*rerun with --retry-failed$"):
        run_eval(o)
    assert [r["status"] for r in _records(tmp_path / "out")] == ["ok", "error", "ok"]  # one batch: s5 alone failed
    assert broken.calls == 3 + 3 + 2  # the memory batch of 3 fails, then each alone, then the two finals
    assert (tmp_path / "out" / "table.md").is_file()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["records"]["failed"] == 1
    monkeypatch.setattr("memagent.cli.eval_command.open_backend", lambda *a, **k: Scripted(tokenizer))
    assert "(n=3)" in run_eval(dataclasses.replace(o, retry_failed=True))  # healed: exit 0

"""`memagent eval`: the sweep on the tiny model (files, resume) and on a scripted reader (scores)."""
from __future__ import annotations

import json
import re

import pytest

from memagent.backends.base import Generation
from memagent.config import AgentConfig
from memagent.eval.baselines import EvalError, bm25_context, middle_truncate
from memagent.eval.report import write_report
from memagent.eval.sweep import SweepConfig, load_done, run_sweep
from memagent.tasks.corpora import load_hotpotqa
from memagent.tasks.ruler_hqa import synthesize_ruler_hqa
from memagent.agent.chunking import iter_chunks
from memagent.tasks.schema import read_samples, sample_document, write_samples

LENGTHS = [3, 6, 12]


@pytest.fixture(scope="module")
def data_file(hotpot_file, tmp_path_factory):
    path = tmp_path_factory.mktemp("evaldata") / "hqa.jsonl"
    corpus = load_hotpotqa(hotpot_file)  # the 12-document samples are stored lazily (paragraph indices)
    write_samples(synthesize_ruler_hqa(corpus, samples=2, seed=0, num_docs=LENGTHS, lazy_threshold=12), path)
    return path


def _tiny_cfg(batch: int = 2) -> SweepConfig:
    agent = AgentConfig(chunk_tokens=96, memory_tokens=8, answer_tokens=8, query_tokens=64, max_batch_docs=batch)
    return SweepConfig(model_name="tiny", agent=agent, window=160, passage_tokens=32)


def test_tiny_model_sweep_writes_jsonl_table_and_plot(tiny_backend, data_file, tmp_path):
    results = run_sweep(tiny_backend, [data_file], tmp_path, _tiny_cfg())
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 3 * 3 * 2 and len({r["key"] for r in records}) == 18
    for r in records:
        assert set(r) >= {"prediction", "gold", "scores", "tokens", "seconds", "score", "length"}
        assert r["tokens"]["prompt"] > 0 and r["tokens"]["calls"] >= 1 and r["seconds"] > 0
        assert r["scores"].keys() == {"em", "f1", "sub_em"}
    mem = [r for r in records if r["method"] == "memagent"]
    assert min(r["tokens"]["calls"] for r in mem if r["length"] == 12) >= 4  # >= 3 chunks + final
    full = [r for r in records if r["method"] == "full-context" and r["length"] == 12]
    assert all(r["note"] == "cut" and r["tokens"]["kept"] < r["tokens"]["document"] for r in full)
    text, table, plots = write_report(results, tmp_path)
    assert table.read_text() == text
    assert "| model | method | 3 docs | 6 docs | 12 docs |" in text
    for method in ("memagent", "full-context", "rag-bm25"):
        assert re.search(rf"\| tiny \| {method} \|( [\d.]+ ± [\d.]+ \(n=2\) \|){{3}}", text)
    assert plots[0].name == "scores_ruler_hqa.png" and plots[0].read_bytes()[:4] == b"\x89PNG"


class Boom(RuntimeError):
    pass


def test_interrupted_sweep_resumes_without_redoing(tiny_backend, data_file, tmp_path):
    fresh = tmp_path / "fresh"
    run_sweep(tiny_backend, [data_file], fresh, _tiny_cfg(batch=1))
    fresh_text, _, _ = write_report(fresh / "results.jsonl", fresh)

    resumed = tmp_path / "resumed"
    seen = []

    def crash_after_seven(rec):
        seen.append(rec["key"])
        if len(seen) == 7:
            raise Boom("killed")

    with pytest.raises(Boom):
        run_sweep(tiny_backend, [data_file], resumed, _tiny_cfg(batch=1), on_record=crash_after_seven)
    with open(resumed / "results.jsonl", "a") as fh:
        fh.write('{"key": "half a line')  # a crash in the middle of a write
    assert len(load_done(resumed / "results.jsonl")) == 7  # the partial line is dropped

    class Counting:  # the same backend, counting which questions it is asked
        def __init__(self, inner):
            self.inner, self.tokenizer, self.max_window, self.prompts = inner, inner.tokenizer, inner.max_window, []

        def generate(self, prompts, params):
            self.prompts.extend(prompts)
            return self.inner.generate(prompts, params)

        def prompt_length(self, prompt):
            return self.inner.prompt_length(prompt)

    counting = Counting(tiny_backend)
    redone = []
    run_sweep(counting, [data_file], resumed, _tiny_cfg(batch=1), on_record=lambda r: redone.append(r["key"]))
    assert len(redone) == 18 - 7 and not set(redone) & set(seen)
    records = [json.loads(line) for line in (resumed / "results.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in records) == sorted(json.loads(line)["key"] for line in
                                                       (fresh / "results.jsonl").read_text().splitlines())
    first_done = next(r for r in records if r["key"] == seen[0])  # a memagent sample finished before the crash
    assert not any(f"<problem>\n{first_done['gold'][0]}" in p for p in counting.prompts)
    assert write_report(resumed / "results.jsonl", resumed)[0] == fresh_text
    n_prompts = len(counting.prompts)
    run_sweep(counting, [data_file], resumed, _tiny_cfg(batch=1))  # all done: a third run asks nothing
    assert len(counting.prompts) == n_prompts


class KeyReader:
    """A scripted model that really reads: it copies "The key of item N is X" from what it is
    shown into its memory, and answers \\boxed{X} when it sees the fact for the asked item."""

    max_window = 100_000

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def prompt_length(self, prompt):
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            item = re.search(r"key of item (\d+)", p).group(1)
            fact = re.search(rf"The key of item {item} is (\w+)\.", p)
            if "Updated memory:" in p:
                text = f"The key of item {item} is {fact.group(1)}." if fact else "nothing yet"
            else:
                text = f"\\boxed{{{fact.group(1)}}}" if fact else "\\boxed{unknown}"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text=text, token_ids=ids, prompt_token_ids=None))
        return out


def test_scores_of_a_reading_model(tokenizer, data_file, tmp_path):
    agent = AgentConfig(chunk_tokens=80, memory_tokens=32, answer_tokens=16, query_tokens=64, max_batch_docs=4)
    big = run_sweep(KeyReader(tokenizer), [data_file], tmp_path / "big", SweepConfig("reader", agent=agent, window=5000))
    text, _, _ = write_report(big, tmp_path / "big")
    for method in ("full-context", "rag-bm25"):  # everything fits in the window: all right
        assert f"| reader | {method} | {' | '.join(['100.00 ± 0.00 (n=2)'] * 3)} |" in text
    # MemAgent gets a sample right exactly when the fact is not cut by a chunk boundary
    expected = []
    samples = list(read_samples(data_file))
    for n in LENGTHS:
        whole = [any(re.search(r"The key of item \d+ is \w+\.", c.text)
                     for c in iter_chunks(sample_document(s), tokenizer, 80)) for s in samples if s["length"] == n]
        mean = sum(whole) / len(whole)
        se = (sum((w - mean) ** 2 for w in whole) / (len(whole) - 1) / len(whole)) ** 0.5
        expected.append(f"{100 * mean:.2f} ± {100 * se:.2f} (n={len(whole)})")
    assert f"| reader | memagent | {' | '.join(expected)} |" in text
    small = run_sweep(KeyReader(tokenizer), [data_file], tmp_path / "small",
                      SweepConfig("reader", agent=agent, window=230, passage_tokens=24))
    records = [json.loads(line) for line in small.read_text().splitlines()]
    full12 = [r for r in records if r["method"] == "full-context" and r["length"] == 12]
    rag12 = [r for r in records if r["method"] == "rag-bm25" and r["length"] == 12]
    assert all(r["note"] == "cut" for r in full12) and all(r["note"].startswith("retrieved") for r in rag12)
    by_id = {s["id"]: s for s in samples}
    for r in rag12:  # BM25 finds the passage holding "The key of item N is X." whenever one holds it whole
        passages = iter_chunks(sample_document(by_id[r["sample_id"]]), tokenizer, 24)
        assert r["score"] == float(any(re.search(r"The key of item \d+ is \w+\.", p.text) for p in passages))
    assert sum(r["score"] for r in rag12) >= 1
    text, _, _ = write_report(small, tmp_path / "small")
    row = re.search(r"\| reader \| full-context \| ([\d.]+) \S+ [\d.]+ \(n=2\) \| ([\d.]+) \S+ [\d.]+ \(n=2\) \| "
                    r"([\d.]+) ± [\d.]+ \(n=2\) \|", text)
    expected = 100 * sum(r["score"] for r in full12) / 2
    assert float(row.group(3)) == pytest.approx(expected)


def test_baseline_helpers(tokenizer):
    text = " ".join(f"w{i}" for i in range(200))
    whole = middle_truncate(text, tokenizer, 10_000)
    assert whole.context == text and whole.note == ""
    cut = middle_truncate(iter([text[:300], text[300:]]), tokenizer, 40)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert cut.context == tokenizer.decode(ids[:20]) + tokenizer.decode(ids[-20:]) and cut.kept_tokens == 40
    doc = "Alpha beta gamma. " * 40 + "The key of item 7 is zebra. " + "Delta epsilon. " * 40
    got = bm25_context("What is the key of item 7?", doc, tokenizer, 30, passage_tokens=10)
    assert "key of item 7 is" in got.context and got.kept_tokens <= 30 and got.note == "retrieved 3 of 106 passages"
    with pytest.raises(EvalError, match="unknown method"):
        SweepConfig("m", methods=["memagent", "oracle"])


def test_measured_workflow_time_on_the_tiny_model(tiny_backend):
    from memagent.eval.timing import filler_document, fit_linear, measure_workflow_seconds

    tok = tiny_backend.tokenizer
    for n in (64, 300, 1001):
        assert abs(len(tok(filler_document(tok, n), add_special_tokens=False)["input_ids"]) - n) <= 1
    agent = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=4, query_tokens=32)
    out = measure_workflow_seconds(tiny_backend, agent, [64, 256, 640])
    assert [r["chunks"] for r in out["rows"]] == [1, 4, 10]
    assert all(r["seconds"] > 0 for r in out["rows"])
    assert out["rows"][-1]["seconds"] > out["rows"][0]["seconds"]  # 11 serial calls against 2
    assert fit_linear([1, 2, 3], [3, 5, 7]) == {"intercept": 1.0, "slope": 2.0, "r2": 1.0}


def test_eval_command_line(tiny_model_dir, data_file, tmp_path):
    from typer.testing import CliRunner

    from memagent.cli import app

    args = ["eval", "--model", str(tiny_model_dir), "--data", str(data_file), "--out", str(tmp_path),
            "--methods", "memagent,full-context", "--chunk-tokens", "96", "--memory-tokens", "8",
            "--answer-tokens", "8", "--query-tokens", "64", "--window", "160", "--limit", "2",
            "--device", "cpu", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| model | method | 3 docs |" in result.output and "full-context" in result.output
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4  # 2 samples (--limit) x 2 methods
    assert CliRunner().invoke(app, args).exit_code == 0  # a rerun finds everything done
    assert (tmp_path / "results.jsonl").read_text().splitlines() == lines
    assert (tmp_path / "table.md").exists() and (tmp_path / "scores_ruler_hqa.png").exists()
    rescored = CliRunner().invoke(app, args + ["--rescore", "--golds", "first", "--empty-prediction", "text"])
    assert rescored.exit_code == 0, rescored.output  # no model call: scores from the stored replies
    assert [json.loads(line)["scoring"] for line in (tmp_path / "results.jsonl").read_text().splitlines()] == \
           [{"golds": "first", "empty": "text", "failed": "wrong"}] * 4
    assert json.loads((tmp_path / "summary.json").read_text())["records"]["finished"] == 4


def test_sampled_repeats_on_the_tiny_model_are_reproducible(tiny_backend, data_file, tmp_path):
    agent = AgentConfig(chunk_tokens=96, memory_tokens=8, answer_tokens=8, query_tokens=64, max_batch_docs=2,
                        temperature=1.0, seed=7)
    cfg = SweepConfig(model_name="tiny", methods=["memagent"], agent=agent, limit=1, repeats=2)
    raws = []
    for run in ("a", "b"):
        records = [json.loads(line) for line in run_sweep(tiny_backend, [data_file], tmp_path / run, cfg)
                   .read_text().splitlines()]
        raws.append([(r["sample_id"], r["repeat"], r["seed"], r["raw"]) for r in records])
    assert raws[0] == raws[1]  # the same seeds: the same sampled replies
    assert {seed for _, _, seed, _ in raws[0]} == {7, 8}
    by_repeat = {r: [raw for _, rep, _, raw in raws[0] if rep == r] for r in (0, 1)}
    assert by_repeat[0] != by_repeat[1]  # distinct seeds: other samples


def test_a_toy_file_from_the_data_command_evaluates_and_plots(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from memagent.cli import app

    toy = tmp_path / "toy.jsonl"
    made = CliRunner().invoke(app, ["data", "toy", "--chunks", "1,2", "--samples", "1", "--out", str(toy)])
    assert made.exit_code == 0, made.output
    args = ["eval", "--model", str(tiny_model_dir), "--data", str(toy), "--out", str(tmp_path / "out"),
            "--methods", "memagent,full-context", "--chunk-tokens", "96", "--memory-tokens", "8",
            "--answer-tokens", "8", "--query-tokens", "64", "--window", "400", "--device", "cpu", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "### toy (exact\\_match, %)" in result.output and "| model | method | 1 chunks | 2 chunks |" in result.output
    assert (tmp_path / "out" / "scores_toy.png").read_bytes()[:4] == b"\x89PNG"


def test_changing_memory_tokens_on_the_command_line_computes_anew(tiny_model_dir, data_file, tmp_path):
    from typer.testing import CliRunner

    from memagent.cli import app

    def run(memory):
        args = ["eval", "--model", str(tiny_model_dir), "--data", str(data_file), "--out", str(tmp_path),
                "--methods", "memagent", "--chunk-tokens", "96", "--memory-tokens", memory, "--answer-tokens", "8",
                "--query-tokens", "64", "--limit", "2", "--device", "cpu", "--no-progress"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]

    assert len(run("8")) == 2
    assert len(run("8")) == 2  # identical: nothing computed
    records = run("9")
    assert len(records) == 4 and len({r["fingerprint"] for r in records}) == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["sweep"]["agent"]["memory_tokens"] == 9 and summary["records"]["planned"] == 2
    assert summary["settings"]["fingerprint"] == records[-1]["fingerprint"]

"""The sweep's public pieces with hand-made numbers, no model: units (methods x repeats x samples, in units of
max_batch_docs), what is still pending on resume, the results file's durable append and its failure cap, and
the local executor's unit-by-unit run on a fake backend."""
from __future__ import annotations

import json
import pickle

import pytest

from memagent.backends.base import Generation
from memagent.config import AgentConfig, WorkflowChoice
from memagent.eval.baselines import EvalError
from memagent.cli.eval_command import EvalOptions, sweep_config
from memagent.eval.executor import Executor, LocalExecutor
from memagent.eval.records import data_file
from memagent.eval.results_file import ResultsFile
from memagent.eval.scoring import ScoreOptions
from memagent.eval.sweep import SweepConfig
from memagent.eval.units import Unit, Work, group_works, pending_works, plan, plan_units, records_fingerprint
from memagent.tasks.schema import write_samples


def _samples(n: int) -> list[dict]:
    return [dict(id=f"s{i}", task="kv", question=f"key {i}?", answers=["x"], context=f"item {i}.", length=2,
                 length_unit="docs", metric="sub_em") for i in range(n)]


@pytest.fixture
def two_files(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_samples(_samples(3), a)
    write_samples(_samples(2), b)
    return [data_file(a), data_file(b)]


def _cfg(**kw) -> SweepConfig:
    return SweepConfig("m", methods=kw.pop("methods", ["memagent", "full-context"]),
                       agent=AgentConfig(max_batch_docs=kw.pop("batch", 2)), **kw)


def test_group_works_sizes():
    assert [len(g) for g in group_works(range(7), 3)] == [3, 3, 1]
    assert [len(g) for g in group_works(range(6), 3)] == [3, 3]
    assert list(group_works([], 3)) == []


def test_units_are_methods_by_repeats_in_batches_across_files(two_files):
    cfg = _cfg(repeats=2)
    units = list(plan_units(cfg, two_files, {}))
    # 5 samples (3 + 2) a method and repeat, in units of 2: 2 + 2 + 1; 2 methods x 2 repeats -> 12 units
    assert [(u.method, u.repeat, len(u)) for u in units] == [
        (m, r, n) for m in ("memagent", "full-context") for r in (0, 1) for n in (2, 2, 1)]
    assert [w.sample["id"] for w in units[1].works] == ["s2", "s0"]  # a unit spans the two data files
    assert [w.data.name for w in units[1].works] == ["a.jsonl", "b.jsonl"]
    assert all(u.fingerprint == records_fingerprint(cfg, u.method) for u in units)
    _, keys = plan(cfg, [d.path for d in two_files])
    assert sorted(w.key for u in units for w in u.works) == sorted(keys) and len(keys) == 20


def test_pending_skips_done_keys_and_retries_errors_counting_attempts(two_files):
    cfg = _cfg(methods=["memagent"], limit=2)
    fp = records_fingerprint(cfg, "memagent")
    works = list(pending_works(cfg, "memagent", 0, two_files, {}, False, fp))
    assert [(w.data.name, w.sample["id"]) for w in works] == [("a.jsonl", "s0"), ("a.jsonl", "s1"),
                                                              ("b.jsonl", "s0"), ("b.jsonl", "s1")]  # limit 2 a file
    done = {works[0].key: {"status": "ok"}, works[1].key: {"status": "error", "error": {"attempts": 2}},
            works[2].key: {"status": "error", "error": {}}}
    assert [w.key for w in pending_works(cfg, "memagent", 0, two_files, done, False, fp)] == [works[3].key]
    retried = list(pending_works(cfg, "memagent", 0, two_files, done, True, fp))
    assert [(w.key, w.attempts) for w in retried] == [(works[1].key, 2), (works[2].key, 1), (works[3].key, 0)]
    assert list(plan_units(cfg, two_files, {w.key: {"status": "ok"} for w in works})) == []  # all done


def _rec(key: str, status: str = "ok") -> dict:
    rec = dict(key=key, status=status, model="m", method="memagent", task="kv", metric="sub_em", score=0.0,
               data="a.jsonl", sample_id=key)
    return dict(rec, error=dict(kind="BackendError", message="down", attempts=1)) if status == "error" else rec


def test_results_file_appends_resumes_and_caps_failures(tmp_path):
    path = tmp_path / "results.jsonl"
    seen = []
    with ResultsFile(path, ScoreOptions(), max_failures=2, on_record=seen.append) as results:
        assert results.done == {} and not path.exists()  # nothing written yet: no file
        results.append_all([_rec("k1"), _rec("k2", "error")])  # one failure: under the cap
        assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k1", "k2"]  # on disk already
        with pytest.raises(EvalError, match=r"stopped after 2 failed sample\(s\) \(--max-failures 2\)"):
            results.append_all([_rec("k3", "error"), _rec("k4")])  # the cap is checked after the unit's records
    assert [r["key"] for r in seen] == ["k1", "k2", "k3", "k4"] and len(results.failed) == 2
    with path.open("a") as fh:
        fh.write('{"key": "torn')  # a crash in the middle of a line
    again = ResultsFile(path, ScoreOptions())
    assert list(again.done) == ["k1", "k2", "k3", "k4"] and again.failed == []  # failures count per run
    assert path.read_text().count("\n") == 4 and path.read_text().endswith("\n")  # the torn line is gone


def test_results_file_left_untouched_when_the_run_stops_before_a_record(tmp_path):
    path = tmp_path / "results.jsonl"
    with pytest.raises(EvalError):
        with ResultsFile(path, ScoreOptions()):
            raise EvalError("window too small")
    assert not path.exists()
    with ResultsFile(path, ScoreOptions()):
        pass
    assert path.read_text() == ""  # a finished run with nothing to do leaves its (empty) file, as before


class _Counting:
    """A non-concurrent fake backend: every prompt gets the same reply."""

    max_window = 10_000

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.batches = tokenizer, []

    def prompt_length(self, prompt: str) -> int:
        return len(self.tokenizer.encode(prompt))

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return [Generation(text="\\boxed{x}", token_ids=[1, 2]) for _ in prompts]


def test_local_executor_runs_unit_by_unit_and_emits_each(two_files, tiny_tokenizer):
    backend = _Counting(tiny_tokenizer)
    cfg = _cfg(methods=["full-context"], batch=2, repeats=2)
    emitted: list[list[dict]] = []
    ex = LocalExecutor(backend)
    assert isinstance(ex, Executor)
    ex.run_units(cfg, plan_units(cfg, two_files, {}), emitted.append)
    assert [len(e) for e in emitted] == [2, 2, 1, 2, 2, 1] and backend.batches == [2, 2, 1, 2, 2, 1]
    recs = [r for e in emitted for r in e]
    assert [r["repeat"] for r in recs] == [0] * 5 + [1] * 5 and all(r["score"] == 1.0 for r in recs)
    assert [r["group_size"] for r in recs] == [2, 2, 2, 2, 1] * 2


def test_a_unit_is_picklable_for_ray(two_files):
    unit = next(plan_units(_cfg(), two_files, {}))
    assert isinstance(unit, Unit) and isinstance(unit.works[0], Work)
    assert pickle.loads(pickle.dumps(unit)) == unit


def test_the_profiles_workflow_options_reach_the_sweep(tmp_path):
    """A profile's `workflow: {name, options}` becomes the sweep's options of that workflow (in its records'
    fingerprint); without options the settings are those of a profile without the section."""
    prof = tmp_path / "p.yaml"
    prof.write_text("workflow:\n  name: lookup\n  options: {lookups: 2}\n", encoding="utf-8")
    o = EvalOptions(model="scripted", data=[], out=tmp_path / "o", workflows=["memagent", "lookup"], profile=prof)
    cfg = sweep_config(o)
    assert cfg.methods == ["memagent", "lookup", "full-context", "rag-bm25"]
    assert cfg.workflows == (WorkflowChoice("lookup", {"lookups": 2}),) and cfg.options("lookup") == {"lookups": 2}
    plain = sweep_config(EvalOptions(model="scripted", data=[], out=tmp_path / "o", workflows=["memagent", "lookup"]))
    assert plain.workflows == () and plain.options("lookup") == {}
    assert records_fingerprint(cfg, "memagent") == records_fingerprint(plain, "memagent")  # memagent untouched
    assert records_fingerprint(cfg, "lookup") != records_fingerprint(plain, "lookup")

"""MemAgent in `eval` on a concurrent backend: one stream of samples (no groups), records equal to the grouped
lock-step sweep's, a failing sample recorded while the others finish, --max-failures still stops."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from memagent.config import AgentConfig
from memagent.eval.baselines import EvalError
from memagent.eval.records import load_records
from memagent.eval.sweep import SweepConfig, run_sweep
from memagent.tasks.schema import write_samples

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sim_server import SimServer  # noqa: E402


def _samples(n: int = 7) -> list[dict]:
    return [dict(id=f"s{i}", task="kv", question=f"What is the key of item {i}?", answers=["zebra"],
                 context=" ".join(f"item {i} word {j}." for j in range(4 * (1 + i % 3))), length=2,
                 length_unit="docs", metric="sub_em") for i in range(n)]


class Grouped:
    """The same HTTP backend without max_concurrency: the sweep runs it in groups, lock-step."""

    def __init__(self, backend) -> None:
        self.inner, self.tokenizer, self.max_window = backend, backend.tokenizer, backend.max_window

    def prompt_length(self, prompt):
        return self.inner.prompt_length(prompt)

    def generate(self, prompts, params):
        return self.inner.generate(prompts, params)


def _view(out: Path) -> dict:
    return {r["sample_id"]: (r["status"], r["prediction"], r["raw"], r.get("tokens"), r.get("note"), r.get("error"))
            for r in load_records(out / "results.jsonl")}


def test_stream_records_equal_the_grouped_sweep_and_a_failure_is_isolated(tiny_tokenizer, tmp_path):
    from memagent.backends.openai import OpenAIBackend

    data = tmp_path / "kv.jsonl"
    samples = _samples()
    samples[4]["question"] = "What is the POISON key?"
    write_samples(samples, data)
    agent = AgentConfig(chunk_tokens=24, memory_tokens=12, answer_tokens=12, query_tokens=24, max_batch_docs=3)
    cfg = SweepConfig("sim", methods=["memagent"], agent=agent)
    with SimServer(latency=0.005, fail_marker="POISON").start() as server:
        http = OpenAIBackend("sim", server.url, tiny_tokenizer, max_concurrency=2, max_retries=0)
        run_sweep(http, [data], tmp_path / "stream", cfg)
        assert server.stats()["max_in_flight"] <= 2
        run_sweep(Grouped(http), [data], tmp_path / "grouped", cfg)
        with pytest.raises(EvalError, match=r"stopped after 1 failed sample\(s\)"):
            run_sweep(http, [data], tmp_path / "stopped", cfg, max_failures=1)
    stream, grouped = _view(tmp_path / "stream"), _view(tmp_path / "grouped")
    assert stream == grouped and len(stream) == 7
    assert [sid for sid, v in sorted(stream.items()) if v[0] == "error"] == ["s4"]
    assert stream["s4"][5]["kind"] == "BackendError" and "HTTP 500" in stream["s4"][5]["message"]
    assert {v[4] for sid, v in stream.items() if sid != "s4"} == {"2 chunks", "4 chunks", "6 chunks"}
    assert all(v[3]["calls"] == int(v[4].split()[0]) + 1 for sid, v in stream.items() if sid != "s4")
    recs = load_records(tmp_path / "stream" / "results.jsonl")
    assert {r["group_size"] for r in recs if r["status"] == "ok"} == {3}
    stopped = load_records(tmp_path / "stopped" / "results.jsonl")
    assert sum(r["status"] == "error" for r in stopped) == 1 and len(stopped) < 7


def test_stream_progress_shows_samples_calls_in_flight_rate_and_eta(tiny_tokenizer, tmp_path, capsys):
    from memagent.backends.openai import OpenAIBackend

    data = tmp_path / "kv.jsonl"
    write_samples(_samples(6), data)
    agent = AgentConfig(chunk_tokens=24, memory_tokens=12, answer_tokens=12, query_tokens=24, max_batch_docs=3)
    with SimServer(latency=0.005).start() as server:
        http = OpenAIBackend("sim", server.url, tiny_tokenizer, max_concurrency=2, max_retries=0)
        run_sweep(http, [data], tmp_path / "out", SweepConfig("sim", methods=["memagent"], agent=agent),
                  progress=True)
    err = capsys.readouterr().err
    last = [line for line in err.splitlines() if line.startswith("[read]")][-1]  # a log: plain lines every 5%
    assert "documents 6/6 (100%)" in last and "in flight" in last and "/s)" in last and "ETA" in last


def test_stream_progress_reads_each_data_file_once(tiny_tokenizer, tmp_path, monkeypatch, capsys):
    """The progress line's total (the pending samples) comes from the same single read the stream runs on."""
    import memagent.eval.units as units  # where the sweep reads the pending samples
    from memagent.backends.openai import OpenAIBackend

    data = tmp_path / "kv.jsonl"
    write_samples(_samples(5), data)
    reads = []
    real = units.read_samples

    def counting(path, *a, **kw):
        reads.append(Path(path).name)
        return real(path, *a, **kw)

    monkeypatch.setattr(units, "read_samples", counting)
    agent = AgentConfig(chunk_tokens=24, memory_tokens=12, answer_tokens=12, query_tokens=24, max_batch_docs=3)
    cfg = SweepConfig("sim", methods=["memagent"], agent=agent)
    with SimServer(latency=0.0).start() as server:
        http = OpenAIBackend("sim", server.url, tiny_tokenizer, max_concurrency=2, max_retries=0)
        run_sweep(http, [data], tmp_path / "out", dataclasses.replace(cfg, limit=3), progress=True)
        assert reads == ["kv.jsonl"]
        run_sweep(http, [data], tmp_path / "out", cfg, progress=True)  # resumed: 2 of the 5 still pending
        assert reads == ["kv.jsonl"] * 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[read]")]
    assert any("documents 3/3 (100%)" in x for x in lines)
    assert "documents 2/2 (100%)" in lines[-1]
    assert len(load_records(tmp_path / "out" / "results.jsonl")) == 5

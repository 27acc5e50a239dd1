"""The Ray runner on a local Ray instance (one for the module: Ray takes seconds to start) and the tiny model:
results equal the plain runner's (eval, ask --input), the driver alone writes and resumes, a killed actor's
work goes to another."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from memagent.backends.options import BackendOptions  # noqa: E402
from memagent.config import AgentConfig  # noqa: E402
from memagent.eval.executor import Executor  # noqa: E402
from memagent.eval.sweep import SweepConfig, plan, run_sweep, sweep  # noqa: E402
from memagent.protocol.profile import Profile  # noqa: E402
from memagent.scale.executor import RayExecutor  # noqa: E402
from memagent.scale.options import RayOptions  # noqa: E402

pytestmark = pytest.mark.slow
SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = ["--chunk-tokens", "96", "--memory-tokens", "8", "--answer-tokens", "8", "--query-tokens", "64",
        "--device", "cpu", "--no-progress"]
TIMING = ("seconds", "group_size")  # wall-clock fields: the only ones a runner may change


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module; its workers import this checkout's memagent."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([SRC] + ([old] if old else []))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def data_file(hotpot_file, tmp_path_factory):
    from memagent.tasks.corpora import load_hotpotqa
    from memagent.tasks.ruler_hqa import synthesize_ruler_hqa
    from memagent.tasks.schema import write_samples

    path = tmp_path_factory.mktemp("raydata") / "hqa.jsonl"
    write_samples(synthesize_ruler_hqa(load_hotpotqa(hotpot_file), samples=2, seed=0, num_docs=[3, 6]), path)
    return path


def _records(path: Path) -> dict[str, dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len({r["key"] for r in recs}) == len(recs)  # nothing twice
    return {r["key"]: {k: v for k, v in r.items() if k not in TIMING} for r in recs}


def test_eval_on_two_actors_equals_the_plain_runner_and_resumes(run_cli, tiny_model_dir, data_file, tmp_path):
    args = ["eval", "--model", tiny_model_dir, "--data", data_file, "--methods", "memagent,full-context",
            "--window", "160", "--batch-docs", "1", *TINY]
    code, plain_table, err = run_cli(*args, "--out", tmp_path / "plain")
    assert code == 0, err
    code, ray_table, err = run_cli(*args, "--out", tmp_path / "ray", "--ray", "--ray-workers", "2")
    assert code == 0, err
    plain, sharded = _records(tmp_path / "plain" / "results.jsonl"), _records(tmp_path / "ray" / "results.jsonl")
    assert len(plain) == 8 and sharded == plain  # 4 samples x 2 methods, every field but the timing
    assert ray_table == plain_table
    before = (tmp_path / "ray" / "results.jsonl").read_text()
    code, _, err = run_cli(*args, "--out", tmp_path / "ray", "--ray", "--ray-workers", "2")
    assert code == 0, err
    assert (tmp_path / "ray" / "results.jsonl").read_text() == before  # a rerun finds everything done


def test_ask_input_on_two_actors_equals_the_plain_runner(run_cli, tiny_model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    (tmp_path / "d.txt").write_text("city river " * 50)
    rows = [{"id": f"q{i}", "question": f"where is key {i}?", "context": "memory key " * (10 + 9 * i)}
            for i in range(5)] + [{"id": "doc", "question": "which river?", "document": "d.txt"}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["ask", "--model", tiny_model_dir, "--input", inp, "--batch-docs", "2", *TINY]
    assert run_cli(*args, "--output", tmp_path / "plain.jsonl")[0] == 0
    # a rerun of an interrupted run: the first answer is there, the rest come from the actors
    first = (tmp_path / "plain.jsonl").read_text().splitlines()[0]
    (tmp_path / "ray.jsonl").write_text(first + "\n")
    code, _, err = run_cli(*args, "--output", tmp_path / "ray.jsonl", "--ray", "local", "--ray-workers", "2",
                           "--trace", tmp_path / "trace.jsonl")
    assert code == 0, err
    by_id = lambda p: {r["id"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    plain, sharded = by_id(tmp_path / "plain.jsonl"), by_id(tmp_path / "ray.jsonl")
    assert len((tmp_path / "ray.jsonl").read_text().splitlines()) == 6 and sharded == plain
    traced = {json.loads(line)["doc_id"] for line in (tmp_path / "trace.jsonl").read_text().splitlines()}
    assert traced == {r["id"] for r in rows} - {json.loads(first)["id"]}  # the actors' traces, written here


def test_ask_on_actors_reads_with_the_profiles_workflow_options(run_cli, tiny_model_dir, tmp_path):
    """`ask --ray --workflow lookup --profile P`: P's lookup options reach the actors' workflow (two query calls
    a document with lookups: 2, as in the process itself)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"q{i}", "question": "where is the key?",
                                       "context": "memory key river " * 20}) + "\n" for i in range(2)))
    profile = tmp_path / "p.yaml"
    profile.write_text("workflow:\n  name: lookup\n  options: {lookups: 2, hits: 1, lookup_tokens: 3}\n")
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", inp, "--output", tmp_path / "out.jsonl",
                           "--workflow", "lookup", "--profile", profile, "--ray", "local", "--ray-workers", "1",
                           "--trace", tmp_path / "trace.jsonl", *TINY)
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    queries = [r for r in records if r.get("kind") == "query"]
    assert sorted(r["doc_id"] for r in queries) == ["q0", "q0", "q1", "q1"]
    assert all(r["generated_tokens"] <= 3 for r in queries)


def test_the_ray_executor_makes_the_local_sweeps_records(tiny_backend, tiny_model_dir, data_file, tmp_path):
    """`sweep` with a RayExecutor (2 actors) and with the in-process backend, on the same inputs: the same
    records, every field equal but `seconds` (the unit's wall-clock divided by its size: timing, not result);
    `group_size` is compared (a unit is the same batch on an actor). The Ray file is in finishing order."""
    agent = AgentConfig(chunk_tokens=96, memory_tokens=8, answer_tokens=8, query_tokens=64, max_batch_docs=2)
    cfg = SweepConfig(model_name="tiny", methods=["memagent", "full-context", "rag-bm25"], agent=agent, window=160)
    datas, keys = plan(cfg, [data_file])
    (tmp_path / "local").mkdir()
    (tmp_path / "ray").mkdir()
    local = sweep(tiny_backend, datas, tmp_path / "local", cfg, None, False, False, None)
    ex = RayExecutor(str(tiny_model_dir), BackendOptions(device="cpu", dtype="float32"), Profile(),
                     RayOptions("local", 2))
    assert isinstance(ex, Executor)
    sharded = sweep(ex, datas, tmp_path / "ray", cfg, None, False, False, None)
    drop = lambda path: {k: {f: v for f, v in r.items() if f != "seconds"}  # noqa: E731
                         for k, r in _records(path).items()}
    a, b = drop(local), drop(sharded)
    assert sorted(a) == sorted(keys) and len(a) == 12  # 4 samples x 3 methods
    for key in a:  # field by field, so a difference names its field
        assert set(a[key]) == set(b[key]), key
        for f in a[key]:
            assert a[key][f] == b[key][f], (key, f)


def test_a_killed_actor_loses_nothing(tiny_backend, tiny_model_dir, data_file, tmp_path):
    agent = AgentConfig(chunk_tokens=96, memory_tokens=8, answer_tokens=8, query_tokens=64, max_batch_docs=1)
    cfg = SweepConfig(model_name="tiny", methods=["memagent"], agent=agent, repeats=2)
    plain = _records(run_sweep(tiny_backend, [data_file], tmp_path / "plain", cfg))
    seen = {}

    def kill_one(pool, finished):  # after the first unit (8 units, 2 in flight an actor): both still hold work
        if finished == 1:
            ray.kill(pool.actors[0])
        seen.update(lost=pool.lost, requeued=pool.requeued)

    datas, _ = plan(cfg, [data_file])
    (tmp_path / "ray").mkdir()
    ex = RayExecutor(str(tiny_model_dir), BackendOptions(device="cpu", dtype="float32"), Profile(),
                     RayOptions("local", 2), hook=kill_one)
    path = sweep(ex, datas, tmp_path / "ray", cfg, None, False, False, None)
    assert seen["lost"] == 1 and seen["requeued"] >= 1  # its unfinished units went to the other actor
    assert _records(path) == plain  # 8 records (4 samples x 2 repeats), each once, as the plain runner made


def test_a_model_no_actor_can_load_is_one_error_line(run_cli, data_file, tmp_path):
    code, out, err = run_cli("eval", "--model", tmp_path / "no-model", "--data", data_file, "--out", tmp_path / "o",
                             "--methods", "memagent", "--ray", "--ray-workers", "1", *TINY)
    # Ray's own daemons may print to the same stderr (e.g. the raylet's disk-space warning when /tmp is nearly
    # full); what memagent writes is the one error line
    ours = [line for line in err.splitlines() if line.strip() and "(raylet)" not in line]
    assert code == 2 and len(ours) == 1 and ours[0].startswith("error: cannot load model"), err
    assert "Traceback" not in err, err


def test_one_actor_per_endpoint_each_server_serves(run_cli, tiny_model_dir, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from sim_server import SimServer

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"q{i}", "question": f"where is key {i}?",
                                       "context": "memory key " * (20 + 7 * i)}) + "\n" for i in range(8)))
    common = ["ask", "--model", "sim", "--backend", "openai", "--tokenizer", tiny_model_dir, "--input", inp,
              "--batch-docs", "2", "--chunk-tokens", "40", "--memory-tokens", "8", "--answer-tokens", "8",
              "--max-retries", "0", "--no-progress"]
    with SimServer(latency=0.0).start() as a, SimServer(latency=0.0).start() as b:
        code, _, err = run_cli(*common, "--base-url", a.url, "--output", tmp_path / "plain.jsonl")
        assert code == 0, err
        a.reset_stats()
        code, _, err = run_cli(*common, "--base-url", f"{a.url},{b.url}", "--output", tmp_path / "ray.jsonl",
                               "--ray")
        assert code == 0, err
        served = [a.stats()["served"], b.stats()["served"]]
    assert min(served) > 0  # one actor a URL, both at work (8 questions, 4 units of 2)
    by_id = lambda p: {r["id"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    assert by_id(tmp_path / "ray.jsonl") == by_id(tmp_path / "plain.jsonl")  # the sim server's replies: pure

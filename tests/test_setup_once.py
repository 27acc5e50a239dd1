"""Each setup step of `memagent ask` and `memagent eval` runs once on the command's path: the option checks, the
workflow options parsed, the agent config built, the output checks, the run's lock, the resume check (the
results already written read once). Counted by wrapping each function wherever a memagent module holds it."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import memagent.flags
import memagent.io
import memagent.lock
from memagent.protocol.profile import Profile


def _spy(monkeypatch, counts: Counter, owner, name: str, key: str | None = None, when=None):
    """Count the calls of `owner.name` (those `when(*args)` accepts) under `key`, through every reference to it
    that a loaded memagent module holds (`from x import name` copies the reference)."""
    original = getattr(owner, name)

    def spy(*args, **kwargs):
        if when is None or when(*args, **kwargs):
            counts[key or name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("memagent") and getattr(mod, name, None) is original:
            monkeypatch.setattr(mod, name, spy)


def _spies(monkeypatch, options_type: str) -> Counter:
    import memagent.ask.io
    import memagent.cli.eval_command
    import memagent.eval.sweep
    import memagent.scale.options

    counts: Counter = Counter()
    _spy(monkeypatch, counts, memagent.flags, "check_options", "option checks",
         when=lambda o, *a, **k: type(o).__name__ == options_type)
    _spy(monkeypatch, counts, memagent.scale.options.RayOptions, "check", "ray checks")
    _spy(monkeypatch, counts, memagent.flags, "parse_workflow_options", "workflow options parsed")
    _spy(monkeypatch, counts, Profile, "agent_config", "agent configs")
    _spy(monkeypatch, counts, memagent.lock, "_hold", "locks")
    _spy(monkeypatch, counts, memagent.ask.io, "check_ask_outputs", "output checks")
    _spy(monkeypatch, counts, memagent.ask.io.ResultLog, "__init__", "resume checks")
    _spy(monkeypatch, counts, memagent.cli.eval_command, "check_eval_out", "output checks")
    _spy(monkeypatch, counts, memagent.io, "check_output_dir", "out folder checks")
    _spy(monkeypatch, counts, memagent.cli.eval_command, "eval_methods", "methods resolved")
    _spy(monkeypatch, counts, memagent.eval.sweep, "plan_units", "resume checks")
    return counts


def test_ask_sets_up_once(run_cli, monkeypatch, tiny_model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "question": "Which river?", "context": "the river runs " * 20}) + "\n"
                           for i in ("a", "b")))
    counts = _spies(monkeypatch, "AskOptions")
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", inp, "--output", tmp_path / "out.jsonl",
                           "--workflow", "lookup", "--workflow-option", "hits=1", "--chunk-tokens", 32,
                           "--memory-tokens", 8, "--answer-tokens", 8, "--no-progress")
    assert code == 0, err
    assert counts == {"option checks": 1, "ray checks": 1, "workflow options parsed": 1, "agent configs": 1,
                      "locks": 1, "output checks": 1, "resume checks": 1}


@pytest.mark.parametrize("extra", [[], ["--rescore"]])
def test_eval_sets_up_once(run_cli, monkeypatch, tiny_model_dir, tmp_path, extra):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(dict(id="s0", task="qa", question="Where is key0?", answers=["place0"], metric="sub_em",
                                    context="filler words here. " * 12 + "key0 is in place0. ", length=10)) + "\n")
    args = ["eval", "--model", tiny_model_dir, "--data", data, "--out", tmp_path / "run", "--methods", "memagent",
            "--workflows", "lookup", "--workflow-option", "hits=1", "--chunk-tokens", 64, "--memory-tokens", 8,
            "--answer-tokens", 8, "--query-tokens", 32, "--device", "cpu", "--dtype", "float32", "--no-progress"]
    if extra:
        assert run_cli(*args)[0] == 0  # results to rescore
    counts = _spies(monkeypatch, "EvalOptions")
    code, _, err = run_cli(*args, *extra)
    assert code == 0, err
    assert counts == {"option checks": 1, "ray checks": 1, "workflow options parsed": 1, "agent configs": 1,
                      "locks": 1, "output checks": 1, "out folder checks": 1, "methods resolved": 1,
                      **({} if extra else {"resume checks": 1})}


def test_train_sets_up_once(run_cli, monkeypatch, tmp_path):
    """`memagent train` then `--resume`: the config read once, out_dir checked and locked once (by the trainer,
    which `memagent train` no longer does before it), a resume checked once, profile.yaml written once."""
    import memagent.rl.config
    import memagent.rl.resume_guard
    import memagent.rl.trainer  # noqa: F401  (loaded first: its references to the functions are spied on too)
    model, data, cfg = _tiny_train_inputs(tmp_path)
    out = tmp_path / "run"
    args = ["train", cfg, f"model={model}", f"data={data}", f"out_dir={out}", "--profile", _profile(tmp_path)]
    for extra, resumed in (([], 0), (["--resume", "total_steps=2"], 1)):
        counts: Counter = Counter()
        with monkeypatch.context() as m:
            _spy(m, counts, memagent.rl.config, "config_data", "config reads")
            _spy(m, counts, memagent.rl.config, "check_out_dir", "out_dir checks")
            _spy(m, counts, memagent.lock, "_hold", "locks")
            _spy(m, counts, memagent.rl.resume_guard, "check_resume", "resume checks")
            _spy(m, counts, memagent.io, "atomic_write_text", "profile.yaml writes",
                 when=lambda path, *a, **k: str(path).endswith("profile.yaml"))
            code, _, err = run_cli(*args, *extra)
        assert code == 0, err[-2000:]
        assert counts == {"config reads": 1, "out_dir checks": 1, "locks": 1, "profile.yaml writes": 1,
                          **({"resume checks": 1} if resumed else {})}
        assert "chunk_tokens: 12" in (out / "profile.yaml").read_text()


def _profile(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("budgets: {chunk_tokens: 12, memory_tokens: 3, answer_tokens: 2}\n")
    return path


# -- issue 46: each check of the settings made once per command (ask, eval, a serve job, train) ----------------
# Counted wherever a memagent module holds the function: the workflow's own options built and checked
# (memagent.agent.runner.own_options), the workflow looked up by name (get_workflow), a Profile validated
# (its __post_init__, run by every dataclasses.replace of one), a Runner built (per workflow), the methods
# checked, the settings fingerprint computed, results.jsonl and the data file opened for reading, the
# vocabulary checked (check_vocab, vocab_limit), the training overrides parsed and the reward names looked up
# (check_reward_name: train's outcome reward, by the resolve alone, not by every TrainConfig built).


def _settings_spies(monkeypatch, data: "Path | None" = None, results: "Path | None" = None) -> Counter:
    import builtins
    import io

    import memagent.agent.registry
    import memagent.agent.runner
    import memagent.backends.hf
    import memagent.backends.tokenizer
    import memagent.eval.records
    import memagent.eval.sweep_config
    import memagent.rewards.registry
    import memagent.rl.config

    counts: Counter = Counter()
    _spy(monkeypatch, counts, memagent.agent.runner, "own_options", "workflow options built")
    _spy(monkeypatch, counts, memagent.agent.registry, "get_workflow", "workflow lookups")
    _spy(monkeypatch, counts, Profile, "__post_init__", "profile validations")
    runner_init = memagent.agent.runner.Runner.__init__

    def counted_init(self, workflow, *args, **kwargs):
        counts[f"runners built ({getattr(workflow, 'name', None) or getattr(workflow, '__name__', '?')})"] += 1
        return runner_init(self, workflow, *args, **kwargs)

    monkeypatch.setattr(memagent.agent.runner.Runner, "__init__", counted_init)
    _spy(monkeypatch, counts, memagent.eval.sweep_config, "refuse_unknown_methods", "method checks")
    _spy(monkeypatch, counts, memagent.eval.records, "fingerprint", "fingerprints")
    _spy(monkeypatch, counts, memagent.backends.tokenizer, "check_vocab", "vocabulary checks")
    _spy(monkeypatch, counts, memagent.backends.hf, "vocab_limit", "vocabulary limits")
    _spy(monkeypatch, counts, memagent.rl.config, "parse_overrides", "override parsings")
    _spy(monkeypatch, counts, memagent.rewards.registry, "check_reward_name", "reward name checks")
    files = {str(p.resolve()): what for p, what in ((data, "data-file reads"), (results, "results.jsonl reads"))
             if p is not None}
    real_open = builtins.open

    def counted_open(file, mode="r", *args, **kwargs):
        if files and isinstance(file, (str, bytes, os.PathLike)) and "r" in mode and "+" not in mode:
            what = files.get(os.path.realpath(os.fsdecode(file)))
            if what:
                counts[what] += 1
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(io, "open", counted_open)  # pathlib opens through io.open
    return counts


ONCE = {"workflow options built": 1, "workflow lookups": 1, "profile validations": 1}


def _same(counts: Counter, expected: dict) -> None:
    """The counts as expected; else both in full, sorted (a check made more than once shows how often)."""
    got = dict(sorted(counts.items()))
    assert got == dict(sorted(expected.items())), f"counted {got}, expected {dict(sorted(expected.items()))}"


def test_ask_resolves_its_settings_once(run_cli, monkeypatch, tiny_model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "question": "Which river?", "context": "the river runs " * 20}) + "\n"
                           for i in ("a", "b")))
    counts = _settings_spies(monkeypatch, data=inp)
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", inp, "--output", tmp_path / "out.jsonl",
                           "--workflow", "lookup", "--workflow-option", "hits=1", "--chunk-tokens", 32,
                           "--memory-tokens", 8, "--answer-tokens", 8, "--no-progress")
    assert code == 0, err
    _same(counts, {**ONCE, "runners built (lookup)": 1, "vocabulary checks": 1, "vocabulary limits": 1, "data-file reads": 1})


@pytest.mark.parametrize("extra", [[], ["--rescore"]])
def test_eval_resolves_its_settings_once(run_cli, monkeypatch, tiny_model_dir, tmp_path, extra):
    """Two workflows and a baseline over one data file, two repeats (so several units per workflow)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(dict(
        id=f"s{i}", task="qa", question=f"Where is key{i}?", answers=[f"place{i}"], metric="sub_em",
        context="filler words here. " * 12 + f"key{i} is in place{i}. ", length=10)) + "\n" for i in range(3)))
    out = tmp_path / "run"
    args = ["eval", "--model", tiny_model_dir, "--data", data, "--out", out, "--methods", "memagent,full-context",
            "--workflows", "memagent,lookup", "--workflow-option", "lookup.hits=1", "--chunk-tokens", 64,
            "--memory-tokens", 8, "--answer-tokens", 8, "--query-tokens", 32, "--device", "cpu", "--dtype",
            "float32", "--batch-docs", 2, "--repeats", 2, "--no-progress"]
    if extra:
        assert run_cli(*args)[0] == 0  # results to rescore
    # the data file is not counted: the sweep streams it per method and repeat, by design (a data file may be
    # larger than memory); results.jsonl is read once where it exists (a fresh run reads none)
    counts = _settings_spies(monkeypatch, results=out / "results.jsonl")
    code, _, err = run_cli(*args, *extra)
    assert code == 0, err
    ran = {"results.jsonl reads": 1} if extra else {"runners built (memagent)": 1, "runners built (lookup)": 1,
                                                   "vocabulary checks": 1, "vocabulary limits": 1}
    # each workflow's options: memagent's (none) and lookup's, built once each
    _same(counts, {"workflow options built": 2, "workflow lookups": 2, "profile validations": 1,
                      "method checks": 1, "fingerprints": 1, **ran})


def test_a_serve_job_resolves_nothing_again(run_cli, monkeypatch, tiny_model_dir, tmp_path):
    """`memagent serve` resolves its settings once as it starts; each job runs the built workflow, checking
    nothing again (the server is stopped after its second job)."""
    import uvicorn
    from starlette.testclient import TestClient

    jobs: list[Counter] = []

    def serve_two_jobs(server, sockets=None):
        with TestClient(server.config.app) as client:
            doc = client.post("/v1/documents", content=("the river runs " * 40).encode()).json()["id"]
            for _ in range(2):
                before = Counter(counts)
                job = client.post("/v1/jobs", json={"document_id": doc, "questions": ["Which river?"]}).json()["id"]
                for _ in range(3000):
                    view = client.get(f"/v1/jobs/{job}").json()
                    if view["state"] not in ("queued", "running"):
                        break
                    time.sleep(0.02)
                assert view["state"] == "done", view
                jobs.append(counts - before)

    monkeypatch.setattr(uvicorn.Server, "run", serve_two_jobs)
    counts = _settings_spies(monkeypatch)
    with socket.socket() as s:  # a free port (bound as the server starts, never listened on)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run_cli("serve", "--model", tiny_model_dir, "--state-dir", tmp_path / "state", "--port", port,
                           "--workflow", "lookup", "--workflow-option", "hits=1", "--chunk-tokens", 16,
                           "--memory-tokens", 8, "--answer-tokens", 8)
    assert code == 0, err
    assert [dict(j) for j in jobs] == [{}, {}], f"the jobs counted {[dict(j) for j in jobs]}"  # a job checks nothing the server checked as it started
    _same(counts, {**ONCE, "runners built (lookup)": 1, "vocabulary checks": 1, "vocabulary limits": 1})


def _tiny_train_inputs(tmp_path) -> tuple:
    """A tiny model, 4 training samples and a one-step config: what the train tests below run on."""
    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    model = build_tiny_model(tmp_path / "tiny", tokenizer=build_tokenizer(vocab_size=1024), hidden_size=32,
                             intermediate_size=64)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"key {i}?", "context": f"the key {i} is {i}.",
                                        "answers": [str(i)]}) + "\n" for i in range(4)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("total_steps: 1\nsave_every: 1\nprogress: false\nagent: {chunk_tokens: 8, memory_tokens: 2, "
                   "answer_tokens: 2}\nrollout: {batch_size: 2, group_size: 2}\nupdate: {mini_batch_size: 2}\n")
    return model, data, cfg


def _train_counts(run_cli, monkeypatch, tmp_path) -> Counter:
    model, data, cfg = _tiny_train_inputs(tmp_path)
    counts = _settings_spies(monkeypatch, data=data)
    code, _, err = run_cli("train", cfg, f"model={model}", f"data={data}", f"out_dir={tmp_path / 'run'}",
                           "agent.chunk_tokens=8", "--profile", _profile(tmp_path))
    assert code == 0, err[-2000:]
    return counts


def test_train_resolves_its_settings_once(run_cli, monkeypatch, tmp_path):
    """The data file is read once: its digest (the run's data_sha256) is of the bytes read for the samples."""
    _same(_train_counts(run_cli, monkeypatch, tmp_path),
          {**ONCE, "runners built (memagent)": 1, "vocabulary checks": 1, "vocabulary limits": 1,
           "override parsings": 1, "data-file reads": 1, "reward name checks": 1})


@pytest.mark.parametrize("text", ['{"id": "a", "question": "q?", "context": "c", "answers": ["x"]}\n\n',
                                  '[{"id": "a", "question": "q?", "context": "c", "answers": ["x"]}]  \n\n'])
def test_the_digest_of_the_samples_read_is_the_files(tmp_path, text):
    import hashlib

    from memagent.io import file_sha256
    from memagent.rl.samples import read_training_samples

    path = tmp_path / "d.jsonl"
    path.write_text(text)
    hashed = hashlib.sha256()
    assert [s.id for s in read_training_samples(path, hashed)] == ["a"]
    assert hashed.hexdigest() == file_sha256(path)


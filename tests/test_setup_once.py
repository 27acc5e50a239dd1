"""Each setup step of `memagent ask` and `memagent eval` runs once on the command's path: the option checks, the
workflow options parsed, the agent config built, the output checks, the run's lock, the resume check (the
results already written read once). Counted by wrapping each function wherever a memagent module holds it."""
from __future__ import annotations

import json
import sys
from collections import Counter

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
    from memagent.backends.tiny import build_tiny_model, build_tokenizer

    model = build_tiny_model(tmp_path / "tiny", tokenizer=build_tokenizer(vocab_size=1024), hidden_size=32,
                             intermediate_size=64)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"key {i}?", "context": f"the key {i} is {i}.",
                                        "answers": [str(i)]}) + "\n" for i in range(4)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("total_steps: 1\nsave_every: 1\nprogress: false\nagent: {chunk_tokens: 8, memory_tokens: 2, "
                   "answer_tokens: 2}\nrollout: {batch_size: 2, group_size: 2}\nupdate: {mini_batch_size: 2}\n")
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

"""The options of `ask`, `eval` and `serve`: each flag declared once (a field of an options type), the same
option in every command that has it, parsed into the same nested options; one sample reader for both."""
from __future__ import annotations

import dataclasses
import json

from typing import Any

import pytest
import typer.main

from memagent.backends.options import BackendOptions
from memagent.cli import app
from memagent.config import AgentConfig
from memagent.flags import BudgetOptions, SamplingOptions, flag_values


def _options(command: str) -> dict[str, Any]:
    """{first declaration: the click option} of a command (typer may carry its own copy of click)."""
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.opts[0]: p for p in cmd.params if p.param_type_name == "option"}


def test_shared_flags_are_one_declaration_in_every_command():
    ask, eval_, serve = _options("ask"), _options("eval"), _options("serve")
    for group, commands in ((BackendOptions, (ask, eval_, serve)), (BudgetOptions, (ask, eval_, serve)),
                            (SamplingOptions, (ask, eval_))):
        flags = ["--" + k.replace("_", "-") for k in flag_values(group())]
        for flag in flags:
            (first, *rest) = [c[flag] for c in commands]
            assert all((o.help, o.default, o.bare_type()) == (first.help, first.default, first.bare_type()) for o in rest)
    assert "--temperature" not in serve  # serve samples as the profile says
    assert ask["--chunk-tokens"].help.count(str(AgentConfig().chunk_tokens)) == 1  # the paper's 5000, from AgentConfig


def test_ask_flags_become_its_nested_options(run_cli, monkeypatch, tmp_path):
    import memagent.cli.ask

    seen = []
    monkeypatch.setattr(memagent.cli.ask, "run_ask", seen.append)  # the command's own name
    code, _, err = run_cli("ask", "--model", "m", "--question", "q", "--document", "d.txt", "--chunk-tokens", 7,
                           "--top-p", 0.5, "--backend", "openai", "--max-retries", 1, "--no-progress")
    assert code == 0, err
    (o,) = seen
    assert o.budgets == BudgetOptions(chunk_tokens=7) and o.sampling == SamplingOptions(top_p=0.5)
    assert o.backend == BackendOptions(name="openai", max_retries=1) and o.progress is False
    assert (o.model, o.question, str(o.document), o.batch_docs) == ("m", "q", "d.txt", 16)


def test_eval_lists_are_parsed_and_its_summary_keys_stay_flat(run_cli, monkeypatch, tmp_path):
    import memagent.cli.evaluate

    seen = []
    monkeypatch.setattr(memagent.cli.evaluate, "run_eval", lambda o: seen.append(o) or "table")
    data = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for d in data:
        d.write_text("")
    code, out, err = run_cli("eval", "--model", "m", "--data", f"{data[0]}, {data[1]}", "--out", tmp_path / "o",
                             "--methods", "memagent", "--memory-tokens", 9, "--seed", 3, "--golds", "first")
    assert code == 0 and out.strip() == "table", err
    (o,) = seen
    assert o.data == [str(d) for d in data] and o.methods == ["memagent"]
    assert o.budgets == BudgetOptions(memory_tokens=9) and o.sampling.seed == 3 and o.golds == "first"
    record = o.record()  # summary.json's settings.options: the keys it had before the options were grouped
    assert list(record) == [
        "model", "data", "out", "methods", "profile", "chunk_tokens", "memory_tokens", "answer_tokens",
        "query_tokens", "temperature", "top_p", "seed", "batch_docs", "window", "passage_tokens", "limit",
        "progress", "repeats", "retry_failed", "max_failures", "rescore", "golds", "empty_prediction", "failed",
        "backend"]
    assert record["backend"] == dataclasses.asdict(BackendOptions()) and record["memory_tokens"] == 9


@pytest.mark.parametrize("bad, message", [
    ({"question": 5}, "in.jsonl:1, field 'question': must be a string, got int"),
    ({"context": {"text": "x"}}, "in.jsonl:1, field 'context': must be the document text or a list of paragraph "
                                 "indices, got dict"),
    ({"id": True}, "in.jsonl:1, field 'id': must be a string or an integer, got True"),
])
def test_a_bad_record_is_the_same_error_through_ask_and_eval(run_cli, tmp_path, bad, message):
    record = dict({"id": "a", "question": "q", "context": "text", "answers": ["x"], "task": "toy"}, **bad)
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(record) + "\n")
    errors = []
    for args in (["ask", "--model", "none", "--input", path],
                 ["eval", "--model", "none", "--data", path, "--out", tmp_path / "out", "--no-progress"]):
        code, out, err = run_cli(*args, "--no-progress") if args[0] == "ask" else run_cli(*args)
        assert code == 2 and "Traceback" not in err
        errors.append(err.strip())
    assert errors[0] == errors[1] == f"error: {tmp_path}/{message}"


def test_eval_and_ask_resolve_a_models_saved_settings_by_one_rule(tmp_path):
    from memagent.cli.eval_command import EvalOptions, eval_profile
    from memagent.protocol.resolve import model_profile, save_agent_settings

    cfg = AgentConfig(chunk_tokens=16, memory_tokens=2, answer_tokens=3, query_tokens=4,
                      memory_template="M {memory} C {chunk} Q {question} >", final_template="M {memory} Q {question} >",
                      empty_memory="none none")
    save_agent_settings(tmp_path, cfg)
    got = eval_profile(EvalOptions(model=str(tmp_path), data=["x.jsonl"], out=tmp_path / "out"))
    assert got == model_profile(str(tmp_path), None, BudgetOptions())
    assert (got.budgets.chunk_tokens, got.budgets.memory_tokens, got.prompts.empty_memory) == (16, 2, "none none")
    flagged = eval_profile(EvalOptions(model=str(tmp_path), data=["x.jsonl"], out=tmp_path / "out",
                                       budgets=BudgetOptions(chunk_tokens=32)))
    assert flagged.budgets.chunk_tokens == 32 and flagged.prompts.memory_template == cfg.memory_template

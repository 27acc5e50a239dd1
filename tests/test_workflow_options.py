"""--workflow-option KEY=VALUE on ask, eval and serve: the values read as a YAML scalar, checked against the
workflow's own options before any model is loaded, and applied to the workflow run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memagent.config import AgentConfig, ConfigError
from memagent.errors import InputError
from memagent.flags import parse_workflow_options


def test_values_are_read_as_scalars_and_keys_checked():
    got = parse_workflow_options(["hits=3", "keep_index=true", "query_template=Q {question} = {memory}", "x=1.5",
                                  "index_dir=null", "k=08"])
    assert got == {"hits": 3, "keep_index": True, "query_template": "Q {question} = {memory}", "x": 1.5,
                   "index_dir": None, "k": 8}
    for bad, message in (("hits", "is not KEY=VALUE"), ("=3", "is not KEY=VALUE"), ("a-b=1", "is not KEY=VALUE")):
        with pytest.raises(InputError, match=message):
            parse_workflow_options([bad])
    with pytest.raises(InputError, match="names hits twice"):
        parse_workflow_options(["hits=1", "hits=2"])


def test_ask_runs_lookup_with_the_flag_options_and_records_them(run_cli, tiny_model_dir, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("the river runs past the old city and under the stone bridge " * 12)
    trace, questions, out = tmp_path / "t.jsonl", tmp_path / "q.jsonl", tmp_path / "answers.jsonl"
    questions.write_text(json.dumps({"id": "a", "question": "Which river?", "document": str(doc)}) + "\n")
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", questions, "--output", out, "--trace", trace,
                           "--workflow", "lookup", "--workflow-option", "lookups=2", "--workflow-option", "hits=1",
                           "--chunk-tokens", "32", "--memory-tokens", "8", "--answer-tokens", "8", "--no-progress")
    assert code == 0, err
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    queries = [r for r in records if r.get("kind") == "query"]
    assert [q["lookup"] for q in queries] == [1, 2] and all(len(q["hits"]) <= 1 for q in queries)
    profile = (tmp_path / "answers.profile.yaml").read_text()
    assert "name: lookup" in profile and "hits: 1" in profile and "lookups: 2" in profile


@pytest.mark.parametrize("option, message", [
    ("nope=1", "error: workflow lookup has no option nope; its options are lookups, hits, lookup_tokens"),
    ("hits=99", "error: workflow lookup: hits must be an integer from 1 to 8, got 99"),
    ("hits", "error: --workflow-option 'hits' is not KEY=VALUE"),
])
def test_a_bad_option_is_one_error_line_before_the_model_loads(run_cli, tmp_path, option, message):
    doc = tmp_path / "doc.txt"
    doc.write_text("words")
    code, out, err = run_cli("ask", "--model", tmp_path / "no-model", "--document", doc, "--question", "q",
                             "--workflow", "lookup", "--workflow-option", option, "--no-progress")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message), err


def test_eval_gives_each_workflow_its_own_options(tmp_path):
    from memagent.cli.eval_command import EvalOptions, eval_workflow_options, sweep_config
    from memagent.protocol.profile import Profile, WorkflowChoice

    def options(*pairs, workflows=("memagent", "lookup"), profile=Profile()):
        o = EvalOptions(model="m", data=[], out=tmp_path, workflows=list(workflows), workflow_option=list(pairs))
        return eval_workflow_options(o, profile)

    assert options("lookup.hits=3", "lookup.lookups=2") == {"lookup": {"hits": 3, "lookups": 2}}
    assert options("k=2", workflows=["skim"]) == {"skim": {"k": 2}}  # one workflow: no name needed
    from_profile = Profile(workflow=WorkflowChoice("lookup", {"hits": 2, "lookup_tokens": 16}))
    assert options("lookup.hits=5", profile=from_profile) == {"lookup": {"hits": 5, "lookup_tokens": 16}}
    with pytest.raises(InputError, match="evaluates 2 workflows .memagent, lookup.; name the one it is for"):
        options("hits=3")
    with pytest.raises(InputError, match="skim is not one of the workflows evaluated"):
        options("skim.k=2")
    assert options("memagent.hits=2") == {"memagent": {"hits": 2}}  # parsed; checked once, as the run is resolved:
    o = EvalOptions(model="m", data=[], out=tmp_path, workflows=["memagent", "lookup"],
                    workflow_option=["memagent.hits=2"])
    with pytest.raises(ConfigError, match="workflow memagent has no option hits; its options are none"):
        sweep_config(o, Profile()).bound


def test_serve_checks_and_runs_its_workflow_with_the_flag_options(tiny_tokenizer):
    from fakes import ScriptedBackend

    from memagent.agent.protocol import BudgetError
    from memagent.serve.main import check_ready

    cfg = AgentConfig(chunk_tokens=16, memory_tokens=8, answer_tokens=8, query_tokens=16)
    backend = ScriptedBackend(tiny_tokenizer, lambda p, c: "x", max_window=200)
    check_ready(backend, cfg, "lookup")  # the default query call (32 new tokens) fits
    with pytest.raises(BudgetError, match="the lookup query call needs up to"):
        check_ready(backend, cfg, "lookup", {"lookup_tokens": 200})


def test_a_serve_job_of_the_servers_workflow_gets_the_flag_options(tiny_backend, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    import httpx

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "serve"))
    from serve_helpers import ThreadServer

    with ThreadServer(tiny_backend, tmp_path / "state", workflow="lookup",
                      workflow_option=["lookups=2", "hits=1"]) as s:
        job = httpx.post(s.url + "/v1/jobs", json={"document": "the river and the old city " * 20,
                                                   "questions": ["Which river?"]}).json()
        events = httpx.get(f"{s.url}/v1/jobs/{job['id']}/events", timeout=60).text
    steps = [json.loads(b.split("data: ", 1)[1]) for b in events.split("\n\n") if b.startswith("event: step")]
    queries = [e for e in steps if e.get("kind") == "query"]
    assert [q["lookup"] for q in queries] == [1, 2] and all(len(q["hits"]) <= 1 for q in queries)

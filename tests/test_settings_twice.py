"""Settings given twice or given for nothing (issue 48, class 7, the parts that need no change of the settings'
structure): a YAML key given twice in one mapping, a workflow option given both as `workflow.options` and as the
old `workflow_options` (a profile, a training config, overrides), and the chat endpoint's OpenAI sampling fields
(a value OpenAI refuses is a 400; a sound one, which memagent does not apply, is named in `memagent.ignored`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memagent.config import ConfigError

WORKFLOW_TWICE = "workflow: {name: lookup, options: {hits: 2}}\nworkflow_options: {hits: 5}\n"


@pytest.mark.parametrize("text, line", [
    ("workflow: {name: lookup, name: skim}\n", "line 1: the key 'name' is given twice (first at line 1)"),
    ("reward: em\nseed: 3\nreward: f1\n", "line 3: the key 'reward' is given twice (first at line 1)"),
    ("agent:\n  chunk_tokens: 64\n  chunk_tokens: 32\n", "line 3: the key 'chunk_tokens' is given twice (first at line 2)"),
])
def test_a_yaml_key_given_twice_is_one_line(text, line, tmp_path, run_cli):
    from memagent.protocol.profile import load_profile
    from memagent.rl.config import load_config

    path = tmp_path / "p.yaml"
    path.write_text(text)
    for read in (load_profile, load_config):
        with pytest.raises(ConfigError) as e:
            read(path)
        assert f"{path}: {line}; give each key once" in str(e.value), str(e.value)
    code, _, err = run_cli("train", path, f"out_dir={tmp_path / 'run'}", "--dry-run")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and line in err, err
    assert not (tmp_path / "run").exists()


def test_a_merged_key_may_still_be_overridden():
    from memagent.bounded import load_yaml

    assert load_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\n", "p", ConfigError)["d"] == {"x": 3, "y": 2}


def test_a_workflow_option_given_both_ways_is_one_line(tmp_path, run_cli, tiny_model_dir):
    from memagent.protocol.profile import load_profile
    from memagent.rl.config import load_config

    path = tmp_path / "p.yaml"
    path.write_text(WORKFLOW_TWICE)
    message = ("the workflow option(s) hits are given twice, in workflow.options (hits: 2) and in workflow_options "
               "(hits: 5); give each once, under workflow: {name, options}")
    for read in (load_profile, load_config):
        with pytest.raises(ConfigError) as e:
            read(path)
        assert str(e.value) == f"{path}: {message}", str(e.value)
    with pytest.raises(ConfigError, match=r"the overrides: the workflow option\(s\) hits are given twice, in "
                                          r"workflow.options \(hits: 4\) and in workflow_options \(hits: 3\)"):
        load_config(None, ["workflow.name=lookup", "workflow_options.hits=3", "workflow.options.hits=4"])
    doc = tmp_path / "doc.txt"
    doc.write_text("words " * 20)
    for args in (("ask", "--model", tiny_model_dir, "--document", doc, "--question", "q?", "--profile", path),
                 ("train", "--profile", path, f"out_dir={tmp_path / 'run'}", "--dry-run")):
        code, _, err = run_cli(*args)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and "Traceback" not in err and len(errors) == 1 and message in errors[0], (args[0], err)
    # the old spelling alone, or with other options, still reads (with its deprecation line)
    path.write_text("workflow: {name: lookup, options: {hits: 2}}\nworkflow_options: {lookups: 1}\n")
    assert load_profile(path).workflow.options == {"hits": 2, "lookups": 1}


@pytest.fixture
def server(tiny_backend, tmp_path):
    pytest.importorskip("fastapi")
    sys.path.insert(0, str(Path(__file__).parent / "serve"))
    from serve_helpers import ThreadServer

    with ThreadServer(tiny_backend, tmp_path / "state", max_body_bytes=64_000) as s:
        yield s


CHAT = {"messages": [{"role": "user", "content": "the river is long"}, {"role": "user", "content": "Which river?"}]}


@pytest.mark.parametrize("extra, expected", [
    ('"temperature": Infinity', "temperature must be a number in [0.0, 2.0], got Infinity"),
    ('"temperature": NaN', "temperature must be a number in [0.0, 2.0], got NaN"),
    ('"temperature": "nan"', 'temperature must be a number in [0.0, 2.0], got "nan"'),
    ('"max_tokens": 1000000000000000000000000000000', "max_tokens must be an integer in [1, 2147483647], got 1000"),
    ('"top_p": -1', "top_p must be a number in [0.0, 1.0], got -1"),
    ('"n": 3', "n must be an integer in [1, 1], got 3"),
])
def test_chat_refuses_sampling_values_openai_refuses(server, extra, expected):
    import httpx

    body = json.dumps(CHAT)[:-1] + ", " + extra + "}"
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(expected), r.text
    assert httpx.get(server.url + "/v1/jobs").json()["data"] == []  # no job was started


def test_chat_names_the_sampling_fields_it_does_not_apply(server):
    import httpx

    r = httpx.post(server.url + "/v1/chat/completions", json=dict(CHAT, temperature=0.7, max_tokens=5), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["memagent"]["ignored"] == ["temperature", "max_tokens"]
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert r.json()["memagent"]["ignored"] == []


def test_step_reward_options_without_a_step_reward_are_one_line(tmp_path, run_cli, tiny_model_dir):
    from memagent.rl.config import load_config

    with pytest.raises(ConfigError, match="step_reward_options .* are given but no step_reward"):
        load_config(None, ["step_reward_options.loss_weight=0.5"])
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "q?", "context": "some text", "answers": ["x"]}) + "\n")
    # --dry-run refuses what the run refuses: an option value the step reward itself rejects
    code, out, err = run_cli("train", Path(__file__).parents[1] / "configs/rl/tiny.yaml", f"model={tiny_model_dir}",
                             f"data={data}", f"out_dir={tmp_path / 'o'}", "step_reward=evidence-chain",
                             "step_reward_options.loss_weight=abc", "--dry-run")
    assert code == 2 and err.startswith("error: ") and "loss_weight" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags", [["--outcome-only"], ["--step-reward", "none"]])
def test_a_step_mix_with_no_step_reward_is_one_line(flags, tmp_path, run_cli):
    code, _, err = run_cli("demo", "--task", "two-hop", *flags, "--step-mix", "0.5", "--out", tmp_path / "d")
    assert code == 2 and "--step-mix 0.5" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()

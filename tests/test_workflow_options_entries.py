"""A workflow's options are one typed set, checked the same way from every entry (flags, a profile, a training
config, serve) before any work: a run-time setting (trace_path, on_step, ...) is not an option a file can set,
another workflow's option, an unknown key or a value of the wrong type is one `error:` line and exit 2, and the
inputs are untouched (issue 37, "Nothing lost, round 4", class 1)."""
from __future__ import annotations

from pathlib import Path

import pytest

from memagent.agent.registry import check_workflow_options
from memagent.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CFG_7B = ROOT / "configs" / "rl" / "qwen2.5-7b-8gpu.yaml"

BAD = [  # (workflow, options, what the one error line says)
    ("lookup", {"trace_path": "x"}, "trace_path is a run-time setting of the command, not an option"),
    ("lookup", {"on_step": "print"}, "on_step is a run-time setting"),
    ("memagent", {"failures": "record"}, "failures is a run-time setting"),
    ("memagent", {"hits": 3}, "workflow memagent has no option hits; its options are none"),
    ("lookup", {"nope": 1}, "workflow lookup has no option nope"),
    ("lookup", {"hits": "\u00b2"}, "hits must be an integer, got '\u00b2'"),
    ("lookup", {"hits": 0}, "hits must be an integer from 1 to 8, got 0"),
    ("lookup", {"index_dir": 5}, "index_dir must be a folder path (text) or null, got 5"),
    ("lookup", {"index_dir": ""}, "index_dir must be a folder path (text) or null, got ''"),
    ("skim", {"keep_index": "maybe"}, "keep_index must be true or false, got 'maybe'"),
    ("lookup", {"query_template": 7}, "query_template must be a string, got int"),
    ("lookup", ["hits", 2], "options must be a mapping"),
]


@pytest.mark.parametrize("name, options, message", BAD)
def test_the_one_check_refuses_each_bad_option(name, options, message):
    with pytest.raises(ConfigError) as e:
        check_workflow_options(name, options)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_good_options_pass_and_null_index_dir_is_a_temporary_folder(tmp_path):
    check_workflow_options("lookup", {"hits": 3, "index_dir": str(tmp_path), "keep_index": True})
    check_workflow_options("lookup", {"index_dir": None})
    check_workflow_options("skim", {"k": 2, "keep_index": False})
    check_workflow_options("memagent", {})


def _profile(tmp_path, options: str, name: str = "lookup") -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(f"workflow:\n  name: {name}\n  options: {options}\n", encoding="utf-8")
    return p


def _one_error(code, err, message):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (code, err)


@pytest.mark.parametrize("options, message", [
    ("{on_step: print}", "on_step is a run-time setting"),
    ("{schedule: lockstep}", "schedule is a run-time setting"),
    ("{hits: '\u00b2'}", "hits must be an integer"),
    ("{index_dir: 5}", "index_dir must be a folder path"),
    ("{index_dir: ''}", "index_dir must be a folder path"),
    ("{keep_index: maybe}", "keep_index must be true or false"),
])
def test_ask_checks_the_profiles_options_even_when_another_workflow_runs(run_cli, tmp_path, options, message):
    doc = tmp_path / "doc.txt"
    doc.write_text("the river runs past the old city")
    profile = _profile(tmp_path, options)
    before = sorted(p.name for p in tmp_path.iterdir())
    for workflow in ("lookup", "memagent"):  # the profile's lookup options are checked either way
        code, _, err = run_cli("ask", "--model", tmp_path / "no-model", "--document", doc, "--question", "q",
                               "--profile", profile, "--workflow", workflow, "--no-progress")
        _one_error(code, err, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert doc.read_text() == "the river runs past the old city"


def test_a_memagent_profile_with_lookups_options_is_refused(run_cli, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("words")
    code, _, err = run_cli("ask", "--model", tmp_path / "no-model", "--document", doc, "--question", "q",
                           "--profile", _profile(tmp_path, "{hits: 3}", name="memagent"), "--no-progress")
    _one_error(code, err, "workflow memagent has no option hits")


@pytest.mark.parametrize("override, message", [
    ("workflow.options.trace_path={doc}", "trace_path is a run-time setting"),
    ("workflow.options.hits=0", "hits must be an integer from 1 to 8, got 0"),
    ("workflow.options.keep_index=maybe", "keep_index must be true or false"),
    ("workflow.options.nope=1", "workflow lookup has no option nope"),
])
def test_a_training_config_is_checked_before_the_dry_run_and_leaves_inputs_alone(run_cli, tmp_path, override,
                                                                                   message):
    doc = tmp_path / "input.txt"
    doc.write_text("an input document")
    code, out, err = run_cli("train", CFG_7B, "workflow.name=lookup", override.format(doc=doc), "--dry-run")
    _one_error(code, err, message)
    assert doc.read_text() == "an input document" and out == ""


def test_serve_refuses_to_start_with_a_profile_whose_options_every_job_would_fail_on(run_cli, tmp_path):
    pytest.importorskip("fastapi")
    code, _, err = run_cli("serve", "--model", tmp_path / "no-model", "--workflow", "lookup", "--state-dir",
                           tmp_path / "state", "--profile", _profile(tmp_path, "{index_dir: 5}"))
    _one_error(code, err, "index_dir must be a folder path")
    assert not (tmp_path / "state").exists()


def test_serve_applies_the_profiles_options_to_its_own_workflow(tmp_path):
    from memagent.protocol.profile import Profile, WorkflowChoice
    from memagent.protocol.resolve import workflow_options_for  # what serve resolves its workflow options with

    profile = Profile(workflow=WorkflowChoice("lookup", {"hits": 1, "lookups": 2}))
    assert workflow_options_for(profile, "lookup", ["hits=3"]) == {"hits": 3, "lookups": 2}
    assert workflow_options_for(profile, "skim", ["k=2"]) == {"k": 2}  # lookup's options are not skim's

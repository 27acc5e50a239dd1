"""One shape for choosing a workflow (memagent.config.WorkflowChoice, `workflow: {name, options}`) in a profile and
a training config; the older spellings (`workflow: NAME` with `workflow_options: {...}`, `workflow: {NAME: options}`)
read to the same config with one deprecation line; the new shape round-trips through the profile `ask` and `eval`
write."""
from __future__ import annotations

import json
import warnings

import pytest
import yaml

from memagent.config import ConfigDeprecation, WorkflowChoice
from memagent.protocol.profile import load_profile, profile_from_dict
from memagent.rl.config import load_config

NEW = {"workflow": {"name": "lookup", "options": {"lookups": 2, "hits": 1}}}
OLD = [
    {"workflow": "lookup", "workflow_options": {"lookups": 2, "hits": 1}},
    {"workflow": {"lookup": {"lookups": 2, "hits": 1}}},
    {"workflow": {"name": "lookup"}, "workflow_options": {"lookups": 2, "hits": 1}},
]


def _read(read, data):
    """(what `read(data)` gives, the deprecation messages it emitted)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = read(data)
    return value, [str(w.message) for w in caught if issubclass(w.category, ConfigDeprecation)]


@pytest.mark.parametrize("old", OLD)
def test_each_old_spelling_reads_to_the_new_profile_with_one_deprecation(old):
    new, quiet = _read(profile_from_dict, NEW)
    got, said = _read(profile_from_dict, old)
    assert new.workflow == WorkflowChoice("lookup", {"lookups": 2, "hits": 1}) and quiet == []
    assert got == new
    assert len(said) == 1 and "old spelling" in said[0] and "workflow: {name: lookup, options: OPTIONS}" in said[0]


def test_a_bare_name_reads_as_the_workflow_without_options():
    got, said = _read(profile_from_dict, {"workflow": "skim"})
    assert got.workflow == WorkflowChoice("skim", {}) and len(said) == 1
    assert _read(profile_from_dict, {"workflow": {"skim": None}})[0].workflow == WorkflowChoice("skim", {})


@pytest.mark.parametrize("old", OLD)
def test_each_old_spelling_reads_to_the_new_training_config(tmp_path, old):
    def read(data):
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump({"total_steps": 3, **data}))
        return load_config(path)

    new, quiet = _read(read, NEW)
    got, said = _read(read, old)
    assert new.workflow == WorkflowChoice("lookup", {"lookups": 2, "hits": 1}) and quiet == []
    assert got == new and len(said) == 1
    assert json.loads(json.dumps(new.workflow.__dict__)) == NEW["workflow"]  # config.json holds the new shape


def test_old_overrides_read_as_the_new_ones(tmp_path):
    new, quiet = _read(lambda o: load_config(None, o), ["workflow.name=lookup", "workflow.options.hits=2"])
    got, said = _read(lambda o: load_config(None, o), ["workflow=lookup", "workflow_options.hits=2"])
    assert new.workflow == WorkflowChoice("lookup", {"hits": 2}) and quiet == [] and got == new and len(said) == 1


def test_a_bad_old_spelling_is_still_refused():
    with pytest.raises(Exception, match="workflow.options must be a mapping"):
        _read(profile_from_dict, {"workflow": "lookup", "workflow_options": [1]})
    with pytest.raises(Exception, match="unknown key"):  # a typo is not taken for a workflow's name
        profile_from_dict({"workflow": {"nmae": "lookup"}})


def test_the_cli_prints_one_warning_line_and_runs(run_cli):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "configs" / "rl" / "qwen2.5-7b-8gpu.yaml"
    code, out, err = run_cli("train", cfg, "workflow=lookup", "workflow_options.hits=2", "--dry-run")
    lines = err.splitlines()
    assert code == 0, err
    assert [line for line in lines if line.startswith("warning: ")] == [
        "warning: the overrides: `workflow: lookup` with `workflow_options: OPTIONS` is the old spelling of the "
        "workflow choice, read as `workflow: {name: lookup, options: OPTIONS}`; write that (it reads everywhere)"]
    code, out, err = run_cli("train", cfg, "workflow.name=lookup", "workflow.options.hits=2", "--dry-run")
    assert code == 0 and "warning:" not in err


def _doc_input(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "question": "Which river?",
                               "context": "the river runs past the old city and under the stone bridge " * 6}) + "\n")
    return inp


def test_ask_writes_the_new_shape_and_it_reads_back(run_cli, tmp_path, tiny_model_dir):
    """An old-spelled profile given to `ask`: the profile written beside the output holds `workflow: {name, options}`
    (with --workflow-option's value) and reads back, without a warning, to the profile that ran."""
    old = tmp_path / "old.yaml"
    old.write_text("workflow: lookup\nworkflow_options: {lookups: 2, lookup_tokens: 3}\n")
    out = tmp_path / "answers.jsonl"
    code, _, err = run_cli("ask", "--model", tiny_model_dir, "--input", _doc_input(tmp_path), "--output", out,
                           "--profile", old, "--workflow", "lookup", "--workflow-option", "hits=1", "--no-progress")
    assert code == 0, err
    assert sum(line.startswith("warning: ") for line in err.splitlines()) == 1
    written = tmp_path / "answers.profile.yaml"
    assert yaml.safe_load(written.read_text())["workflow"] == {"name": "lookup",
                                                               "options": {"lookups": 2, "lookup_tokens": 3, "hits": 1}}
    back, said = _read(load_profile, written)
    assert said == [] and back.workflow == WorkflowChoice("lookup", {"lookups": 2, "lookup_tokens": 3, "hits": 1})


def test_eval_writes_the_new_shape_and_it_reads_back(run_cli, tmp_path, tiny_model_dir):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(dict(id="s0", task="qa", question="Where is key0?", answers=["place0"], metric="sub_em",
                                    context="filler words here. " * 12 + "key0 is in place0. ", length=10)) + "\n")
    old = tmp_path / "old.yaml"
    old.write_text("workflow: {lookup: {lookups: 2}}\n")
    out = tmp_path / "run"
    code, _, err = run_cli("eval", "--model", tiny_model_dir, "--data", data, "--out", out, "--methods", "lookup",
                           "--profile", old, "--chunk-tokens", 64, "--memory-tokens", 8, "--answer-tokens", 8,
                           "--query-tokens", 32, "--device", "cpu", "--dtype", "float32", "--no-progress")
    assert code == 0, err
    assert sum(line.startswith("warning: ") for line in err.splitlines()) == 1
    assert yaml.safe_load((out / "profile.yaml").read_text())["workflow"] == {"name": "lookup",
                                                                              "options": {"lookups": 2}}
    back, said = _read(load_profile, out / "profile.yaml")
    assert said == [] and back.workflow == _read(load_profile, old)[0].workflow == WorkflowChoice("lookup", {"lookups": 2})


def test_a_sweeps_workflows_keep_the_fingerprints_of_its_old_spelling():
    """SweepConfig(workflow_options=...) is gone (no saved file holds it); the records it made still resume."""
    from memagent.eval.records import fingerprint
    from memagent.eval.sweep_config import SweepConfig
    from memagent.eval.units import records_fingerprint

    new, quiet = _read(lambda w: SweepConfig("m", methods=["memagent", "lookup"], workflows=w),
                       (WorkflowChoice("lookup", {"hits": 2}),))
    assert quiet == []
    assert new.options("lookup") == {"hits": 2} and new.options("memagent") == {} == new.options("full-context")
    plain = SweepConfig("m", methods=["memagent", "lookup"])
    # the options are in lookup's records' fingerprint only: memagent's and the sweep's stay the plain ones; the
    # values are those SweepConfig(workflow_options=...) gave before `workflows` (3f10368): earlier records resume
    assert fingerprint(new) == fingerprint(plain) == records_fingerprint(new, "memagent") == "75d295d531ba80b8"
    assert (records_fingerprint(new, "lookup"), records_fingerprint(plain, "lookup")) == ("1778d05c9690f0bc",
                                                                                          "0535919b656f6399")


def test_a_checkpoint_of_the_old_shape_resumes_under_the_new_one():
    """config.json of a run saved before the one shape (`workflow: NAME`, `workflow_options`) is the same run."""
    from memagent.rl.config import TrainConfig, config_to_dict
    from memagent.rl.resume_guard import changed_settings

    now = config_to_dict(TrainConfig(workflow=WorkflowChoice("lookup", {"hits": 2})))
    old = {k: v for k, v in now.items() if k != "workflow"} | {"workflow": "lookup", "workflow_options": {"hits": 2}}
    quiet, said = _read(lambda saved: changed_settings(saved, now), old)
    assert quiet == [] and said == []
    other = old | {"workflow_options": {"hits": 3}}
    assert changed_settings(other, now) == ["workflow.options.hits (3 then, 2 now)"]

"""The reading workflow as a field of the protocol profile (memagent.protocol.profile.WorkflowChoice): resolved like the
other fields (base, file, flag), checked against the workflow registry, written with the profile; and its
options in the eval records' fingerprint (memagent.eval.workflow_runs.method_fingerprint)."""
from __future__ import annotations

import json

import pytest
import yaml

from memagent.config import ConfigError
from memagent.eval.workflow_runs import method_fingerprint
from memagent.protocol.profile import (Profile, WorkflowChoice, dump_profile, load_profile, make_profile,
                                       profile_from_dict, resolve_values)


def test_default_is_memagent_without_options():
    assert Profile().workflow == WorkflowChoice("memagent", {})
    assert yaml.safe_load(dump_profile(Profile()))["workflow"] == {"name": "memagent", "options": {}}


def test_file_sets_workflow_and_flag_overrides_name(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("workflow:\n  name: lookup\n  options: {lookups: 2}\n", encoding="utf-8")
    p = load_profile(f)
    assert p.workflow == WorkflowChoice("lookup", {"lookups": 2})
    assert p.budgets == Profile().budgets  # the rest keeps the base values
    q = make_profile(*resolve_values(f, workflow="skim"))  # the flag names another workflow: lookup's options are not skim's
    assert q.workflow == WorkflowChoice("skim", {})
    assert make_profile(*resolve_values(f, workflow="lookup")).workflow == WorkflowChoice("lookup", {"lookups": 2})
    assert make_profile(*resolve_values(f)).workflow.name == "lookup"
    again = tmp_path / "again.yaml"
    again.write_text(dump_profile(p), encoding="utf-8")
    assert load_profile(again) == p  # written and read back unchanged


def test_unknown_workflow_names_the_valid_ones():
    """The profile is a file format: the name is looked up by the command that runs it, once."""
    from memagent.agent.registry import UnknownWorkflow
    from memagent.config import WorkflowChoice
    from memagent.protocol.resolve import resolve_workflow

    assert profile_from_dict({"workflow": {"name": "nope"}}).workflow.name == "nope"
    with pytest.raises(UnknownWorkflow) as e:
        resolve_workflow(WorkflowChoice("nope"), "nope", [])
    msg = str(e.value)
    assert "'nope'" in msg and "memagent" in msg and "lookup" in msg and "skim" in msg


@pytest.mark.parametrize("data, part", [
    ({"workflow": {"name": "lookup", "k": 4}}, "workflow.k"),
    ({"workflow": {"name": 3}}, "workflow.name must be a string"),
    ({"workflow": {"options": [1]}}, "workflow.options must be a mapping"),
])
def test_bad_workflow_sections_are_refused(data, part):
    with pytest.raises(ConfigError, match=part.replace(".", r"\.")):
        profile_from_dict(data)


def test_workflow_and_options_are_in_the_record_fingerprint():
    base = "abc"
    assert method_fingerprint(base, "memagent", None) == base  # the plain fingerprint: earlier records resume
    fps = {method_fingerprint(base, "lookup", None), method_fingerprint(base, "lookup", {"lookups": 2}),
           method_fingerprint(base, "skim", None), method_fingerprint(base, "memagent", {"x": 1}), base}
    assert len(fps) == 5 and all(len(f) == 16 for f in fps - {base})


def test_ask_runs_the_profiles_workflow_options(run_cli, tiny_model_dir, tmp_path):
    """`ask --profile P --workflow lookup`: P's `workflow: {name: lookup, options}` reach the workflow (two
    query calls with lookups: 2, none of the default's one); under another --workflow they are not applied."""
    doc = tmp_path / "doc.txt"
    doc.write_text("the river runs past the old city and under the stone bridge " * 6)
    profile = tmp_path / "p.yaml"
    profile.write_text("workflow:\n  name: lookup\n  options: {lookups: 2, hits: 1, lookup_tokens: 3}\n")

    def kinds(*extra):
        trace = tmp_path / f"trace{len(list(tmp_path.iterdir()))}.jsonl"
        code, _, err = run_cli("ask", "--model", tiny_model_dir, "--document", doc, "--question", "Which river?",
                               "--trace", trace, "--no-progress", *extra)
        assert code == 0, err
        return [json.loads(line) for line in trace.read_text().splitlines()]

    default = kinds("--workflow", "lookup")
    assert sum(r.get("kind") == "query" for r in default) == 1
    given = kinds("--workflow", "lookup", "--profile", profile)
    queries = [r for r in given if r.get("kind") == "query"]
    assert len(queries) == 2 and all(r["generated_tokens"] <= 3 and len(r["hits"]) <= 1 for r in queries)
    plain = kinds("--workflow", "memagent", "--profile", profile)  # memagent has no lookup options: not applied
    assert not any(r.get("kind") == "query" for r in plain) and any(r.get("kind") == "final" for r in plain)

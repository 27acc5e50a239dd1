"""The reading workflow as a field of the protocol profile (memagent.protocol.profile.WorkflowChoice): resolved like the
other fields (base, file, flag), checked against the workflow registry, written with the profile; and its
options in the eval records' fingerprint (memagent.eval.workflow_runs.method_fingerprint)."""
from __future__ import annotations

import pytest
import yaml

from memagent.config import ConfigError
from memagent.eval.workflow_runs import method_fingerprint
from memagent.protocol.profile import Profile, WorkflowChoice, dump_profile, load_profile, profile_from_dict, resolve_profile


def test_default_is_memagent_without_options():
    assert Profile().workflow == WorkflowChoice("memagent", {})
    assert yaml.safe_load(dump_profile(Profile()))["workflow"] == {"name": "memagent", "options": {}}


def test_file_sets_workflow_and_flag_overrides_name(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("workflow:\n  name: lookup\n  options: {lookups: 2}\n", encoding="utf-8")
    p = load_profile(f)
    assert p.workflow == WorkflowChoice("lookup", {"lookups": 2})
    assert p.budgets == Profile().budgets  # the rest keeps the base values
    q = resolve_profile(f, workflow="skim")  # the flag names another workflow; the file's options stay
    assert q.workflow == WorkflowChoice("skim", {"lookups": 2})
    assert resolve_profile(f).workflow.name == "lookup"
    again = tmp_path / "again.yaml"
    again.write_text(dump_profile(p), encoding="utf-8")
    assert load_profile(again) == p  # written and read back unchanged


def test_unknown_workflow_names_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        profile_from_dict({"workflow": {"name": "nope"}})
    msg = str(e.value)
    assert "'nope'" in msg and "memagent" in msg and "lookup" in msg and "skim" in msg


@pytest.mark.parametrize("data, part", [
    ({"workflow": "lookup"}, "workflow must be a mapping"),
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

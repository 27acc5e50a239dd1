"""One lookup for the three kinds of plug-in (memagent.plugins): a workflow, a reward and a backend whose module
fails as it is imported, or that is not callable, are each one error of their kind naming the plug-in and its
target, worded the same; an unknown name lists the valid ones."""
import pytest
from plugin_dist import write_dist_info

from memagent import backends
from memagent.agent import registry as workflows
from memagent.agent.protocol import WorkflowError
from memagent.agent.registry import UnknownWorkflow
from memagent.backends.base import BackendError
from memagent.rewards import registry as rewards
from memagent.rewards.registry import RewardError, UnknownReward

KINDS = [  # what, group, lookup, refresh, error of a broken plug-in, error of an unknown name
    ("workflow", "memagent.workflows", workflows.get_workflow, workflows.refresh_entry_points, WorkflowError,
     UnknownWorkflow),
    ("reward", "memagent.rewards", rewards.get_reward_factory, rewards.refresh_entry_points, RewardError,
     UnknownReward),
    ("backend", "memagent.backends", backends.get_backend, backends._REGISTRY.refresh, BackendError, BackendError),
]


@pytest.mark.parametrize("what, group, get, refresh, fault, unknown", KINDS, ids=[k[0] for k in KINDS])
def test_one_error_policy_for_every_kind(tmp_path, monkeypatch, what, group, get, refresh, fault, unknown):
    (tmp_path / "pl_raises.py").write_text("raise RuntimeError('broken at import')\n")
    (tmp_path / "pl_exits.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "pl_value.py").write_text("x = 3\n")
    write_dist_info(tmp_path, f"pl-{what}", {group: {"raises": "pl_raises:f", "exits": "pl_exits:f",
                                                     "missing": "pl_missing_module:f", "value": "pl_value:x"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    refresh()
    try:
        for name, detail in (("raises", "RuntimeError: broken at import"), ("exits", "SystemExit: 3"),
                             ("missing", "ModuleNotFoundError: No module named 'pl_missing_module'")):
            with pytest.raises(fault) as e:
                get(name)
            target = {"raises": "pl_raises:f", "exits": "pl_exits:f", "missing": "pl_missing_module:f"}[name]
            assert str(e.value) == (f"{what} '{name}' (entry point {group}, {target}) failed as it was imported: "
                                    f"{detail}; this is a fault of the plug-in, not of memagent: fix or uninstall it, "
                                    f"or choose another {what}")
        with pytest.raises(fault, match=rf"^{what} 'value' \(entry point {group}, pl_value:x\) is not callable; "):
            get("value")
        with pytest.raises(unknown, match=rf"^unknown {what} 'nope'; valid {what}s: .*value"):
            get("nope")
    finally:
        monkeypatch.undo()
        refresh()

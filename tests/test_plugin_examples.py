"""The reward and backend plug-in examples of docs/rewards.md and docs/backends.md (beside the workflow one of
docs/workflows.md, tests/test_workflow_example.py): each block is taken from its page, installed as a package's
entry point would be (a .dist-info on sys.path) and run through the commands; each is its file in docs/examples."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugin_dist import write_dist_info

from memagent import backends
from memagent.rewards import registry as rewards
from memagent.rewards.protocol import Answered
from memagent.rewards.registry import build_reward

DOCS = Path(__file__).resolve().parents[1] / "docs"
EXAMPLES = {  # module: (page, entry-point group, entry point)
    "contains_reward": ("rewards.md", "memagent.rewards", {"contains": "contains_reward:Contains"}),
    "canned_backend": ("backends.md", "memagent.backends", {"canned": "canned_backend:Canned"}),
}


def doc_block(page: str, module: str) -> str:
    """The ```python block of docs/PAGE that names `module` in its first lines (its entry point)."""
    blocks = [b.split("```")[0] for b in (DOCS / page).read_text().split("```python\n")[1:]]
    found = [b for b in blocks if f'"{module}:' in "\n".join(b.splitlines()[:3])]
    assert len(found) == 1, (page, module, len(found))
    return found[0]


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The two blocks as an installed package's modules, with their entry points declared."""
    site = tmp_path / "site"
    write_dist_info(site, "examples", {group: eps for _, group, eps in EXAMPLES.values()})
    for module, (page, _, _) in EXAMPLES.items():
        (site / f"{module}.py").write_text(doc_block(page, module))
    monkeypatch.syspath_prepend(str(site))
    rewards.refresh_entry_points()
    backends._REGISTRY.refresh()
    yield
    monkeypatch.undo()
    rewards.refresh_entry_points()
    backends._REGISTRY.refresh()


@pytest.mark.parametrize("module", sorted(EXAMPLES))
def test_the_docs_show_each_example_file_as_it_stands(module):
    block = doc_block(EXAMPLES[module][0], module)
    assert block == (DOCS / "examples" / f"{module}.py").read_text()
    assert len(block.splitlines()) <= 25


def test_the_reward_scores_by_hand(installed):
    reward = build_reward("contains", "outcome")  # found by its entry point, used behind GuardedReward
    assert type(reward.inner).__module__ == "contains_reward" and reward.kind == "outcome"
    items = [Answered("Which river?", "It is the  NILE, surely.", ("Nile",)),  # case and spacing aside: 1
             Answered("Which river?", "The Amazon.", ("Nile", "the Nile river")),  # no gold in it: 0
             Answered("Which river?", None, ("Nile",)),  # no reply: 0
             Answered("Which city?", "new york", ("Paris", "New  York"))]  # the second gold: 1
    assert reward.score(items) == [1.0, 0.0, 0.0, 1.0]
    from memagent.rl.config import load_config

    assert load_config(None, ["reward=contains"]).reward == "contains"  # a training config takes it by name


def test_ask_and_eval_run_the_backend_and_record_the_reward(installed, run_cli, tiny_model_dir, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("the river runs past the old city and under the stone bridge " * 4)
    code, out, err = run_cli("ask", "--backend", "canned", "--model", tiny_model_dir, "--document", doc,
                             "--question", "Which river?", "--chunk-tokens", "32", "--no-progress")
    assert code == 0 and out.strip() == "unknown", (out, err)  # the canned reply's \boxed{unknown}
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"s{i}", "question": "Which river?", "answers": [gold],
                                        "context": "the river Nile runs past the city " * 6}) + "\n"
                            for i, gold in enumerate(["unknown", "Nile"])))
    profile = tmp_path / "p.yaml"
    profile.write_text("reward: contains\n")
    code, _, err = run_cli("eval", "--backend", "canned", "--model", tiny_model_dir, "--data", data, "--out",
                           tmp_path / "ev", "--profile", profile, "--methods", "memagent", "--chunk-tokens", "32",
                           "--no-progress")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    got = {r["sample_id"]: (r["prediction"], r["rewards"]) for r in records}
    assert got == {"s0": ("unknown", {"contains": 1.0}), "s1": ("unknown", {"contains": 0.0})}
